"""The model FLOPs per image of a configured run's steps, counted before it trains.

:func:`count_step_flops` builds the configured method on the ``meta`` device (no memory, no
initialisation), hands its ``training_step`` a batch of the loader's view sizes, and counts the
model FLOPs of what the step runs (:class:`~hvp_lightning.training.flops.FlopMeter`): with HVP on,
what runs inside the selection pass (the mixin's ``selection_phase``) is the selection, the rest
the training step; the same method without HVP gives the baseline step. So the count follows
the code: DINO/iBOT's multi-crop views at their two sizes, HVP's candidates, heads, predictors,
teacher and momentum-target forwards, and a teacher output the step reuses from the selection.

A run counts once at its start (:func:`hvp_lightning.training.driver.run`); a compute budget can
count before any run.
"""

from __future__ import annotations

import json
import logging
import warnings

import torch

from ..data.datamodule import view_augs
from ..device import auto_precision, runs_on_cpu
from ..methods import method_class
from ..run.perf import StepFlops
from ..schema import TrainConfig
from ..schema.hvp import LOSS_MODES
from ..selection import resolve_selection_dtype, step_autocast_dtype
from ..selection.forward_pass import outputs_reusable as same_outputs
from ..selection.geometry import CROP_KEYS
from .build import build_method
from .flops import FlopMeter

log = logging.getLogger(__name__)

IMAGES = 2  # images of the counted batch: model FLOPs are per image (BatchNorm needs 2 in train mode)


def _per_image(cfg: TrainConfig) -> dict[str, int]:
    """Model FLOPs per image of one training step of ``cfg``'s method, by phase
    (``selection``, ``step``). With ``hvp.selection_fraction`` < 1 the batch is the run's own:
    the share of samples a selection scores depends on the batch size."""
    with torch.device("meta"):
        model = build_method(cfg).train()
    hvp = cfg.hvp if cfg.hvp_on else None
    images = cfg.method.batch_size if hvp is not None and hvp.selection_fraction < 1 else IMAGES
    augs = view_augs(model.views(), cfg.data)
    views = [torch.zeros(images, 3, aug.size, aug.size, device="meta") for aug in augs]
    batch = {
        "views": views,
        "params": {k: torch.zeros(images, len(augs), device="meta") for k in CROP_KEYS},  # hvp.mode=min_iou's
        "label": torch.zeros(images, dtype=torch.long, device="meta"),
        "index": torch.arange(images, device="meta"),
    }
    meter = FlopMeter(model)
    model.selection_phase = lambda: meter.phase("selection")
    if hvp is not None:  # the meta device has no autocast: answer as the run's device will
        reusable = outputs_reusable(cfg)
        model.selection_outputs_reusable = lambda: reusable
    with meter.count(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a Trainer
        model.training_step(batch, 0)
    return {phase: flops // images for phase, flops in meter.flops.items()}


def outputs_reusable(cfg: TrainConfig) -> bool:
    """What ``selection_outputs_reusable`` (the mixin) answers in ``cfg``'s run, on the device its
    ``trainer.accelerator`` gives on this machine and under the autocast of its ``trainer.precision``:
    whether DINO/iBOT's step reuses the selection's teacher outputs (counted once) or runs its own."""
    h = cfg.hvp
    assert h is not None
    accelerator, precision = cfg.trainer.accelerator, cfg.trainer.precision
    device_type = "cpu" if runs_on_cpu(accelerator) else "cuda"
    step = step_autocast_dtype(auto_precision(accelerator, precision) if precision.startswith("auto") else precision)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the run says it once (bf16/fp16 selection on CPU)
        dtype = resolve_selection_dtype(h.selection_precision, device_type, step)
    return same_outputs(h.selection_scale, h.selection_fraction, dtype, step)


# Config keys that do not change what a step computes: leaving them out of the cache key lets runs
# that differ only there (a sweep's seeds, longer runs, another data folder) share one count.
NOT_COUNTED = ("trainer", "eval", "checkpoint", "logger", "analysis", "limits", "seed", "resume", "budget")
NOT_COUNTED_DATA = ("root", "eval_root", "train_size", "test_size", "monitor_size", "num_workers", "num_classes")
COUNTED: dict[str, StepFlops] = {}  # this process's counts, by config without those keys


def count_step_flops(cfg: TrainConfig) -> StepFlops:
    """The model FLOPs per image of ``cfg``'s training steps (module docstring); counted once per
    process for configs that differ only in :data:`NOT_COUNTED` keys.

    Static colour (``hvp.colour=static``) only changes when the candidates are coloured, not
    what the networks see: it is counted as per-view colour."""
    plain = cfg.model_dump(exclude=set(NOT_COUNTED))
    for key in NOT_COUNTED_DATA:
        plain["data"].pop(key, None)  # a key of some data sets only
    if cfg.hvp_on:  # whether DINO/iBOT reuse the selection's teacher outputs
        plain["outputs_reusable"] = outputs_reusable(cfg)
    key = json.dumps(plain, sort_keys=True)
    if key not in COUNTED:
        COUNTED[key] = _count(cfg)
    return COUNTED[key]


def _count(cfg: TrainConfig) -> StepFlops:
    if not cfg.hvp_on:
        plain = sum(_per_image(cfg).values())
        return StepFlops(train=plain, selection=0, baseline=plain)
    baseline = cfg.model_copy(update={"hvp": None})  # absent = off
    phases = _per_image(cfg.with_values({"hvp.colour": "per_view"}))
    return StepFlops(
        train=phases.get("step", 0), selection=phases.get("selection", 0), baseline=count_step_flops(baseline).train
    )


def run_step_flops(cfg: TrainConfig) -> StepFlops | None:
    """:func:`count_step_flops` for a run about to train: None, with a warning naming the error,
    if the method's step does not run on the meta device (the run goes on without FLOPs). A
    selection whose method does heavy work outside its networks (``uncounted_selection_work``)
    is warned about: its FLOP figures, and a budget's "equal FLOPs", understate HVP's cost."""
    try:
        flops = count_step_flops(cfg)
    except Exception as err:  # noqa: BLE001 -- a count that fails must not stop the run
        log.warning("model FLOPs not counted (the run reports no FLOPs): %s: %s", type(err).__name__, err)
        return None
    work = method_class(cfg.method.name).uncounted_selection_work
    if cfg.hvp_on and cfg.hvp.mode in LOSS_MODES and work:  # type: ignore[union-attr]
        log.warning(
            "model FLOPs leave out %s's selection work outside its networks, %s: the run's FLOPs, and "
            "a baseline given them (budget.match), understate what HVP costs here; compare wall time too",
            cfg.method.name,
            work,
        )
    return flops
