"""What a run's training costs: model FLOPs, images per second and where the time goes.

:class:`PerfMonitor` (a callback) cuts every training batch into five phases at public hooks:

* ``data``: from the end of one batch's optimiser step to the start of the next batch, but for
  ``augment`` -- waiting for the loader, the batch's copy to the device, and the end-of-step
  work of the hooks that run after this callback's ``on_train_batch_end`` (the module's own: an
  EMA teacher's update, counters; the online analysis; Lightning's logging);
* ``augment``: the views made on the device after the copy (the data module's
  ``augment_phase``: the batched colour step, and ``data.on_device``'s crops); next to nothing
  where the loader workers colour the views (training on the CPU);
* ``selection``: HVP's selection pass, choice and gather (the host's ``selection_phase``,
  :class:`~hvp_lightning.selection.HardViewMixin`);
* ``step``: the rest of the training step, forward and backward (and the other callbacks'
  batch-start hooks, e.g. a step checkpoint's save);
* ``optimizer``: from ``on_before_optimizer_step`` to the batch's end: clipping and the
  optimiser's update.

Validation (the online k-NN, at an epoch's end or within it) and the time between epochs (epoch
checkpoints) are in none of them. On a CUDA device each phase boundary records a CUDA event, read
only at the log steps (where Lightning's logging waits for the device anyway): no host sync per
step; elsewhere the host clock. At every log
step (``trainer.log_every_n_steps``) the interval since the last one is logged as ``perf/*``
(docs/logging.md); :meth:`PerfMonitor.summary` is summary.json's ``cost``.

Counts (images trained, images selected, and from them the model FLOPs with
:class:`StepFlops`) are run totals carried in the checkpoint, so a resumed run reports the
uninterrupted run's (the driver's summary takes the module's own counts, which checkpoints
written before this callback hold too); times and rates are this session's own.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

PHASES = ("data", "augment", "selection", "step", "optimizer")

# Dense peak FLOP/s (no 2:4 sparsity; NVIDIA's data sheets) of GPUs whose torch name Lightning's
# table (lightning 2.6 ``get_available_flops``) misses or lists at sparse rates: it knows the H200
# only as "h200 sxm1"/"h200 nvl1", which "NVIDIA H200" never matches, and lists the H200 and the
# H100 NVL at their sparse figures, twice the dense ones. Matched in this order, by substring.
NVL_PEAKS: dict[torch.dtype | str, float] = {
    torch.bfloat16: 835.5e12, torch.float16: 835.5e12, "tfloat32": 417.5e12, torch.float32: 60e12
}  # fmt: skip
DENSE_PEAKS: dict[str, dict[torch.dtype | str, float]] = {
    "h200 nvl": NVL_PEAKS,
    "h100 nvl": NVL_PEAKS,
    "h200": {torch.bfloat16: 989.4e12, torch.float16: 989.4e12, "tfloat32": 494.7e12, torch.float32: 66.9e12},
}


@dataclass(frozen=True)
class StepFlops:
    """Model FLOPs per image of a run's training steps (the convention of
    :mod:`hvp_lightning.training.flops`: submodule forwards, 3x where a gradient flows back).

    Attributes:
        train: the training step of a selecting step: forward and backward of the views
            trained on, teacher or momentum-target forwards once (DINO/iBOT reuse the
            selection's teacher outputs where they may, so this can be below ``baseline``).
        selection: HVP's selection pass, the forwards of every candidate (0 without HVP).
        baseline: a step that selects nothing: the method without HVP (and HVP's plain steps
            under ``hvp.every_n_steps``).
    """

    train: int
    selection: int
    baseline: int

    def total(self, images: int, selected: int) -> int:
        """Model FLOPs of training ``images`` images, ``selected`` of them in selecting steps."""
        return selected * (self.train + self.selection) + (images - selected) * self.baseline


def batch_images(batch: Any) -> int:
    """Images in a batch: the first dimension of its first tensor (``views[0]`` of ours)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        n = batch_images(value)
        if n:
            return n
    return 0


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """One device's dense peak FLOP/s at the matmul ``dtype``, the denominator of the model FLOP
    utilisation: :data:`DENSE_PEAKS` for the GPUs there (GH200 included), else Lightning's table;
    None on a CPU and on a GPU neither knows (Lightning then warns once)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    for chip, peaks in DENSE_PEAKS.items():
        if chip in name:  # fp32 matmuls run as TF32 unless the precision is "highest" (as Lightning reads it)
            tf32 = dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest"
            return peaks.get("tfloat32" if tf32 else dtype)
    from lightning.fabric.utilities.throughput import get_available_flops

    peak = get_available_flops(device, dtype)
    return float(peak) if peak else None


def compute_dtype(precision: str) -> torch.dtype:
    """The matmul dtype of a Lightning precision string (``bf16-mixed`` -> bfloat16, ...)."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    return torch.float64 if precision.startswith("64") else torch.float32


class Timeline:
    """Consecutive phases between marks: CUDA events on a CUDA device (read in :meth:`read`,
    which waits for the last one), the host clock elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.open: tuple[str, Any] | None = None  # the phase under way and its start
        self.done: list[tuple[str, Any, Any]] = []  # (phase, start, end), not yet read

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self, phase: str | None) -> None:
        """End the phase under way here and start ``phase`` (None: none, until the next mark)."""
        now = self._now()
        if self.open is not None:
            self.done.append((self.open[0], self.open[1], now))
        self.open = (phase, now) if phase is not None else None

    @contextmanager
    def during(self, phase: str, then: str) -> Iterator[None]:
        """``phase`` for the block, ``then`` after it (a phase nested in another's time)."""
        self.mark(phase)
        try:
            yield
        finally:
            self.mark(then)

    def read(self) -> dict[str, float]:
        """Seconds of each phase ended since the last read."""
        out: dict[str, float] = defaultdict(float)
        if self.cuda and self.done:
            self.done[-1][2].synchronize()
        for phase, start, end in self.done:
            out[phase] += start.elapsed_time(end) / 1000 if self.cuda else end - start
        self.done = []
        return out


class PerfMonitor(L.Callback):
    """``perf/*`` at the log steps, and the run's ``cost`` (module docstring).

    Put it first among the callbacks: its batch-start mark then comes before the other
    callbacks' batch-start work (which counts to ``step``).

    Args:
        flops: the model FLOPs per image of the run's steps; None if they could not be counted
            (then no FLOPs, no FLOP utilisation).
    """

    def __init__(self, flops: StepFlops | None) -> None:
        self.flops = flops
        self.images = 0  # run totals, every rank's images: in the checkpoint
        self.selected = 0
        self.seconds: dict[str, float] = defaultdict(float)  # this session's, by phase
        self.session_images = 0
        self.session_flops = 0
        self.peak_flops: float | None = None  # all devices' together, at the run's precision
        self._timeline = Timeline(torch.device("cpu"))
        self._interval = {"images": 0, "flops": 0}
        self._selecting = self._stepped = False
        self._world = 1

    @property
    def state_key(self) -> str:
        return "PerfMonitor"

    def state_dict(self) -> dict[str, Any]:
        return {"images": self.images, "selected_images": self.selected}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.images = int(state_dict.get("images", 0))
        self.selected = int(state_dict.get("selected_images", 0))

    # --- phases -----------------------------------------------------------------------------
    @contextmanager
    def selection_phase(self) -> Iterator[None]:
        """The host's selection pass (``HardViewMixin.selection_phase``)."""
        self._selecting = True
        with self._timeline.during("selection", then="step"):
            yield

    @contextmanager
    def augment_phase(self) -> Iterator[None]:
        """The views made on the device (``SSLDataModule.augment_phase``), inside ``data``."""
        with self._timeline.during("augment", then="data"):
            yield

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        device = trainer.strategy.root_device
        self._timeline, self._world = Timeline(device), trainer.world_size
        peak = peak_flops(device, compute_dtype(str(trainer.precision)))
        self.peak_flops = peak * trainer.world_size if peak else None
        if hasattr(pl_module, "selection_phase"):
            pl_module.selection_phase = self.selection_phase
        data = getattr(trainer, "datamodule", None)
        if hasattr(data, "augment_phase"):
            data.augment_phase = self.augment_phase

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if pl_module.__dict__.get("selection_phase") == self.selection_phase:
            del pl_module.selection_phase  # back to the class's no-op
        data = getattr(trainer, "datamodule", None)
        if data is not None and vars(data).get("augment_phase") == self.augment_phase:
            del data.augment_phase

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._timeline.mark("data")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._timeline.mark("step")
        self._selecting = self._stepped = False

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        self._timeline.mark("optimizer")
        self._stepped = True

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._timeline.mark("data")
        images = batch_images(batch) * self._world
        self.images += images
        self.selected += images if self._selecting else 0
        self._interval["images"] += images
        if self.flops is not None:
            f = self.flops
            self._interval["flops"] += images * (f.train + f.selection if self._selecting else f.baseline)
        every = trainer.log_every_n_steps
        if self._stepped and every and trainer.global_step % every == 0:
            self._log(pl_module, self._read())

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Validation inside the fit (the k-NN pass) comes before on_train_epoch_end: without this
        # mark it would count as waiting for data. The fetch after a validation within an epoch
        # (val_check_interval < 1) is then in no phase either, until the next batch starts.
        self._timeline.mark(None)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._timeline.mark(None)  # what follows (epoch checkpoints) is no training phase

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._timeline.mark(None)
        self._read()

    # --- figures ----------------------------------------------------------------------------
    def _read(self) -> dict[str, float]:
        """The interval since the last read: seconds by phase, images and FLOPs; added to the
        session's totals."""
        seconds = self._timeline.read()
        interval, self._interval = self._interval, {"images": 0, "flops": 0}
        for phase, s in seconds.items():
            self.seconds[phase] += s
        self.session_images += interval["images"]
        self.session_flops += interval["flops"]
        return {**seconds, **interval}

    def _log(self, pl_module: L.LightningModule, interval: dict[str, float]) -> None:
        seconds = sum(interval.get(p, 0.0) for p in PHASES)
        if seconds <= 0:
            return
        values = {f"perf/{p}_share": interval.get(p, 0.0) / seconds for p in PHASES}
        values["perf/images_per_s"] = interval["images"] / seconds
        if self.flops is not None:
            values["perf/model_flops_per_s"] = interval["flops"] / seconds
            values["perf/total_flops"] = float(self.flops.total(self.images, self.selected))
            if self.peak_flops:
                values["perf/mfu"] = interval["flops"] / seconds / self.peak_flops
        for key, value in values.items():
            pl_module.log(key, value, on_step=True, on_epoch=False, batch_size=1)

    def summary(self, images: int | None = None, selected: int | None = None) -> dict[str, Any]:
        """summary.json's ``cost`` (docs/logging.md): the run's FLOPs (counts: a resumed run's
        equal the uninterrupted run's) and this session's rates and time split.

        Args:
            images: the run's images trained, if the caller keeps its own count (the driver: the
                module's ``images_seen``, also in checkpoints written before this callback);
                default this callback's.
            selected: likewise, those of them in selecting steps.
        """
        images = self.images if images is None else images
        selected = self.selected if selected is None else selected
        f, seconds = self.flops, sum(self.seconds.values())
        total = f.total(images, selected) if f is not None else None
        rate = self.session_flops / seconds if f is not None and seconds > 0 else None
        return {
            "train_flops_per_image": f.train if f is not None else None,
            "selection_flops_per_image": f.selection if f is not None else None,
            "baseline_flops_per_image": f.baseline if f is not None else None,
            "total_flops": total,
            "selection_flops_share": selected * f.selection / total if f is not None and total else None,
            "images": images,
            "selected_images": selected,
            "session_images": self.session_images,
            "images_per_s": self.session_images / seconds if seconds > 0 else None,
            "time_split": {p: self.seconds.get(p, 0.0) / seconds for p in PHASES} if seconds > 0 else None,
            "model_flops_per_s": rate,
            "mfu": rate / self.peak_flops if rate is not None and self.peak_flops else None,
        }
