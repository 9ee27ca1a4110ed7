"""The epoch aggregates of ``self.log(..., on_epoch=True)`` across a mid-epoch resume.

Lightning 2.x keeps the running sums behind every ``*_epoch`` metric (``train/loss_epoch``,
``hvp/selection_selected_loss_epoch``, ...) in the training loop's result collection, and puts
them in no checkpoint. A run resumed from a step checkpoint (``checkpoint.every_n_steps``, a
pre-emption) would log, and report in ``summary.json``, that epoch's aggregate over the resumed
session's steps only. :class:`hvp_lightning.training.checkpoint.RunCheckpoint` saves each rank's partial
sums with a step checkpoint (:func:`partial_epoch_sums`) and puts them back at the end of the
resumed session's first step (:func:`restore_partial_epoch_sums`), which makes each epoch
aggregate bit for bit the uninterrupted run's (``0 + a + s == s + a``, then the same additions).
Not covered: what a callback logs in ``on_train_batch_start`` (the save, at the next batch's
start, comes after it, so that batch's value would count twice; no callback here logs there).

The result collection and the logger connector's ``_current_fx`` are Lightning's internal state
(``fit_loop.epoch_loop._results``; written against Lightning 2.6.6, the locked version); the tests
of ``tests/test_epoch_metrics.py``, ``tests/test_determinism.py`` and ``tests/test_preemption.py``
fail if their layout changes.
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


# Hooks that run again in every session, so also in one resumed inside an epoch: what they logged
# before the stop they log once more after it, and their sums are not carried over (they would count
# twice). ``on_train_epoch_start`` is not one: Lightning skips it when it resumes inside the epoch.
_RERUN_HOOKS = ("on_train_start",)


def _reduction(meta: Any) -> str | None:
    for name in _COMBINE:
        if getattr(meta, f"is_{name}_reduction"):
            return name
    return None


def _training_results(trainer: L.Trainer) -> dict[str, Any]:
    return trainer.fit_loop.epoch_loop._results  # noqa: SLF001 -- see the module docstring


def partial_epoch_sums(trainer: L.Trainer) -> dict[str, dict[str, Any]]:
    """This rank's running epoch aggregates of the training hooks' ``on_epoch`` tensor metrics,
    with what it takes to log each one again (its ``self.log`` arguments).

    Args:
        trainer: a trainer between two training steps of an epoch.

    Returns:
        ``{key: {"reduction", "value", "count", "log"}}`` with CPU tensors (``count``: the summed
        batch sizes of a mean, None otherwise); metrics not logged this epoch are left out.
    """
    out: dict[str, dict[str, Any]] = {}
    for key, metric in _training_results(trainer).items():
        meta, reduction = metric.meta, _reduction(metric.meta)
        updated = getattr(metric, "_update_count", 0) > 0  # torchmetrics 0.x and 1.x alike
        if not (metric.is_tensor and meta.on_epoch and reduction and updated):
            continue
        if meta.fx.split(".")[0] in _RERUN_HOOKS or meta.sync.group is not None:
            continue
        args = {
            "fx": meta.fx,
            "name": meta.name,
            "prog_bar": meta.prog_bar,
            "logger": meta.logger,
            "on_step": meta.on_step,
            "on_epoch": meta.on_epoch,
            "enable_graph": meta.enable_graph,
            "add_dataloader_idx": meta.add_dataloader_idx,
            "metric_attribute": meta.metric_attribute,
            "sync_dist": meta.sync.should,
            "rank_zero_only": meta.sync.rank_zero_only,
        }
        count = metric.cumulated_batch_size.detach().cpu().clone() if reduction == "mean" else None
        out[key] = {"reduction": reduction, "value": metric.value.detach().cpu().clone(), "count": count, "log": args}
    return out


def restore_partial_epoch_sums(trainer: L.Trainer, saved: list[dict[str, dict[str, Any]]]) -> None:
    """Put the saved aggregates (from :func:`partial_epoch_sums`) back into the resumed epoch's
    metrics: added into those this session has logged already, logged anew (with the saved
    arguments, so that a later ``self.log`` of the key matches) for the others -- such as what
    ``on_train_epoch_start`` logged, which Lightning does not run again inside an epoch.

    Args:
        trainer: the resumed trainer, in the callbacks' ``on_train_batch_end`` of its first batch
            (after the first ``self.log`` of each earlier hook has reset that hook's aggregates).
        saved: one dict per rank whose sums this rank takes.
    """
    results = _training_results(trainer)
    device = trainer.strategy.root_device
    for entries in saved:
        for key, entry in entries.items():
            reduction = entry["reduction"]
            if key not in results:
                args = dict(entry["log"])
                fx, name = args.pop("fx"), args.pop("name")
                results.log(
                    fx,
                    name,
                    torch.zeros((), device=device),
                    reduce_fx=getattr(torch, reduction),
                    batch_size=1,
                    sync_dist_fn=trainer.strategy.reduce,
                    **args,
                )
                metric = results[key]
                metric.value = entry["value"].to(device=metric.value.device, dtype=metric.value.dtype)
                if entry["count"] is not None:
                    metric.cumulated_batch_size = entry["count"].to(metric.cumulated_batch_size.device)
                metric._forward_cache = None  # noqa: SLF001 -- no value for this step's row
            else:
                metric = results[key]
                if _reduction(metric.meta) != reduction:  # logged with other arguments: not the same metric
                    continue
                value = entry["value"].to(device=metric.value.device, dtype=metric.value.dtype)
                metric.value = _COMBINE[reduction](metric.value, value)
                if entry["count"] is not None:
                    count = entry["count"].to(metric.cumulated_batch_size.device)
                    metric.cumulated_batch_size = metric.cumulated_batch_size + count
            metric._computed = None  # noqa: SLF001 -- a value computed before the restore is stale
    # Lightning resets a hook's aggregates at that hook's first self.log in a session's first batch,
    # unless that hook was the last to log. The module's own on_train_batch_end runs after the
    # callbacks': mark its hook as logging already, so that its first self.log keeps the restored sums.
    trainer._logger_connector._current_fx = "on_train_batch_end"  # noqa: SLF001
