"""The epoch aggregates of ``self.log(..., on_epoch=True)`` across a mid-epoch resume.

Lightning 2.x keeps the running sums behind every ``*_epoch`` metric (``train/loss_epoch``,
``hvp/selection_selected_loss_epoch``, ...) in the training loop's result collection, and puts
them in no checkpoint. A run resumed from a step checkpoint (``checkpoint.every_n_steps``, a
pre-emption) would log, and report in ``summary.json``, that epoch's aggregate over the resumed
session's steps only. :class:`hvp_lightning.checkpoint.RunCheckpoint` saves each rank's partial
sums with a step checkpoint (:func:`partial_epoch_sums`) and adds them back when the resumed
session logs the same key again (:func:`merge_partial_epoch_sums`): at the first resumed step,
which makes the epoch's aggregate bit for bit the uninterrupted run's (``0 + a + s == s + a``).

The result collection is Lightning's internal state (``fit_loop.epoch_loop._results``, the same
in Lightning 2.0-2.6); the resume tests of ``tests/test_determinism.py`` and
``tests/test_preemption.py`` fail if its layout changes.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

# How two partial aggregates of one epoch combine, by the metric's reduction.
_COMBINE = {
    "mean": lambda a, b: a + b,  # a sum of value * batch_size, divided by the summed batch sizes at the end
    "sum": lambda a, b: a + b,
    "max": torch.maximum,
    "min": torch.minimum,
}


def _reduction(meta: Any) -> str | None:
    for name in _COMBINE:
        if getattr(meta, f"is_{name}_reduction"):
            return name
    return None


def _training_results(trainer: L.Trainer) -> dict[str, Any]:
    return trainer.fit_loop.epoch_loop._results  # noqa: SLF001 -- see the module docstring


def partial_epoch_sums(trainer: L.Trainer) -> dict[str, dict[str, Any]]:
    """This rank's running epoch aggregates of the training hooks' ``on_epoch`` tensor metrics.

    Args:
        trainer: a trainer between two training steps of an epoch.

    Returns:
        ``{key: {"reduction", "value", "count"}}`` with CPU tensors (``count``: the summed batch
        sizes of a mean, None otherwise); metrics not logged this epoch are left out.
    """
    out: dict[str, dict[str, Any]] = {}
    for key, metric in _training_results(trainer).items():
        reduction = _reduction(metric.meta)
        if not (metric.is_tensor and metric.meta.on_epoch and reduction and metric.update_called):
            continue
        count = metric.cumulated_batch_size.detach().cpu().clone() if reduction == "mean" else None
        out[key] = {"reduction": reduction, "value": metric.value.detach().cpu().clone(), "count": count}
    return out


def merge_partial_epoch_sums(trainer: L.Trainer, pending: list[dict[str, dict[str, Any]]]) -> None:
    """Add the saved aggregates of ``pending`` (from :func:`partial_epoch_sums`) into the metrics of
    the same keys this session has logged; merged keys leave ``pending`` (in place), the others
    wait for a later call.

    Args:
        trainer: the resumed trainer, after a training step's logging.
        pending: saved aggregates, one dict per rank whose sums this rank takes (in place).
    """
    results = _training_results(trainer)
    for saved in pending:
        for key in [k for k in saved if k in results]:
            entry, metric = saved.pop(key), results[key]
            if _reduction(metric.meta) != entry["reduction"]:  # logged with other arguments: not the same metric
                continue
            value = entry["value"].to(device=metric.value.device, dtype=metric.value.dtype)
            metric.value = _COMBINE[entry["reduction"]](metric.value, value)
            if entry["count"] is not None:
                count = entry["count"].to(metric.cumulated_batch_size.device)
                metric.cumulated_batch_size = metric.cumulated_batch_size + count
            metric._computed = None  # noqa: SLF001 -- a value computed before the merge is stale
    pending[:] = [saved for saved in pending if saved]


def unmerged_keys(pending: list[dict[str, dict[str, Any]]]) -> list[str]:
    """The keys of ``pending`` no step of the resumed epoch logged (their epoch aggregate covers the
    resumed steps only).

    Args:
        pending: what :func:`merge_partial_epoch_sums` left.

    Returns:
        The keys, sorted.
    """
    return sorted({key for saved in pending for key in saved})
