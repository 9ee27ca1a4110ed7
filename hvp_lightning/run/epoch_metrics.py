"""The epoch aggregates of ``self.log(..., on_epoch=True)`` across a mid-epoch resume, kept by the
project itself (public Lightning API only).

Lightning keeps the running sums behind every ``*_epoch`` metric (``train/loss_epoch``,
``hvp/selection_selected_loss_epoch``, ...) in its training loop's internal result collection,
which no checkpoint holds: a run resumed from a step checkpoint (``checkpoint.every_n_steps``, a
pre-emption) would log, and report in ``summary.json``, that epoch's aggregate over the resumed
session's steps only. So the project aggregates these values itself:

* a module hands each training-time ``self.log(name, value, on_step=..., on_epoch=True, ...)``
  to the trainer's callbacks that have a ``take_log`` method (:class:`~hvp_lightning.methods.base.SSLMethod`'s
  ``log`` does); with an :class:`EpochAggregates` callback on the trainer, the step value goes to Lightning as
  ``name_step`` (``on_step=True`` only) and the callback adds it to its running value, exactly as
  Lightning would have (the same operations in the same order: a mean is a sum of
  ``value * batch_size`` over the summed batch sizes);
* at the epoch's end the callback logs each aggregate as ``name_epoch`` (``name`` when the value
  was logged ``on_step=False``) -- the keys and the log row of Lightning's own epoch aggregates --
  after reducing it over the ranks where ``sync_dist`` asked for it;
* :class:`hvp_lightning.training.checkpoint.RunCheckpoint` saves each rank's running values with
  a step checkpoint (:meth:`EpochAggregates.partial`) and hands them back before the resumed
  session's first step (:meth:`EpochAggregates.restore`), which makes every epoch aggregate bit
  for bit the uninterrupted run's (the restored sum, then the same additions).

Taken are the values logged from the epoch's (or resumed session's) first batch start until its
end with ``on_epoch=True`` and ``on_step`` given, a reduction of mean (with ``batch_size``),
sum, max or min, a number or one-element tensor and no ``sync_dist_group``. Others go to
Lightning unchanged, and so do values logged in ``on_train_start`` (which runs again in a resumed
session: its value would count twice). Not covered: what a callback before ``RunCheckpoint``
logs in ``on_train_batch_start`` (the save, at the next batch's start, comes after it, so that
batch's value would count twice; no callback here logs there).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

REDUCTIONS = ("mean", "sum", "max", "min")
_BY_FUNCTION = {torch.mean: "mean", torch.sum: "sum", sum: "sum", torch.max: "max", max: "max"}
_BY_FUNCTION.update({torch.min: "min", min: "min"})
# self.log arguments kept with an aggregate and used again to log its epoch value
_KEPT = ("prog_bar", "logger", "rank_zero_only", "add_dataloader_idx")


def reduction_name(reduce_fx: Any) -> str | None:
    """``mean``, ``sum``, ``max`` or ``min`` for a ``self.log`` ``reduce_fx`` (a name, ``avg``, or
    torch's or Python's function), None for any other."""
    if isinstance(reduce_fx, str):
        name = "mean" if reduce_fx.lower() == "avg" else reduce_fx.lower()
        return name if name in REDUCTIONS else None
    return _BY_FUNCTION.get(reduce_fx)


def _start(reduction: str, device: torch.device) -> torch.Tensor:
    """Lightning's starting value of an aggregate (in the default dtype), made on the device by a
    fill (no copy from the host, which would wait for a GPU's queue)."""
    value = {"max": float("-inf"), "min": float("inf")}.get(reduction, 0.0)
    return torch.full((), value, dtype=torch.get_default_dtype(), device=device)


class EpochAggregates(L.Callback):
    """This rank's running epoch aggregates of the values a module's ``log`` hands it (:meth:`take_log`), and
    their epoch values at the epoch's end (module docstring). Put it before callbacks that read
    ``trainer.callback_metrics`` in ``on_train_epoch_end`` (checkpoint callbacks run last anyway)."""

    def __init__(self) -> None:
        self.running: dict[str, dict[str, Any]] = {}  # epoch key -> reduction, value, count, log arguments
        self.open = False  # between the first batch start of an epoch (or session) and its end

    # --- taking values ------------------------------------------------------------------------
    def takes(self, trainer: L.Trainer, value: Any, kwargs: dict[str, Any]) -> bool:
        """Whether this ``self.log`` call is one it aggregates (module docstring)."""
        reduction = reduction_name(kwargs.get("reduce_fx", "mean"))
        return (
            self.open
            and trainer.training
            and kwargs.get("on_epoch") is True
            and isinstance(kwargs.get("on_step"), bool)
            and (isinstance(value, (int, float)) or isinstance(value, torch.Tensor) and value.numel() == 1)
            and not isinstance(value, bool)
            and reduction is not None
            and (reduction != "mean" or kwargs.get("batch_size") is not None)
            and kwargs.get("sync_dist_group") is None
        )

    def take_log(self, module: L.LightningModule, name: str, value: Any, kwargs: dict[str, Any]) -> bool:
        """A module's ``self.log(name, value, **kwargs)``: True if this callback takes it (it logged
        the step value), False if the module logs it through Lightning as usual. hvp-lightning's
        methods ask every trainer callback with this method (``SSLMethod.log``); a module of
        your own calls it from its ``log`` likewise."""
        if not self.takes(module.trainer, value, kwargs):
            return False
        self.add(module, name, value, kwargs)
        return True

    def add(self, module: L.LightningModule, name: str, value: torch.Tensor | float, kwargs: dict[str, Any]) -> None:
        """Log the step value (if ``on_step``) through Lightning and add it to the epoch's."""
        reduction = reduction_name(kwargs.get("reduce_fx", "mean"))
        assert reduction is not None
        if not isinstance(value, torch.Tensor):  # the tensor Lightning makes of a number
            value = torch.tensor(value, device=module.device, dtype=torch.get_default_dtype())
        on_step = kwargs["on_step"]
        step_args = {k: v for k, v in kwargs.items() if k not in ("on_step", "on_epoch", "reduce_fx")}
        if on_step:
            L.LightningModule.log(module, f"{name}_step", value, on_step=True, on_epoch=False, **step_args)
        value = value.detach()
        if not value.is_floating_point() or value.dtype not in (torch.float32, torch.float64):
            value = value.to(torch.get_default_dtype())  # as Lightning stores a logged value
        value = value.reshape(())
        key = f"{name}_epoch" if on_step else name
        entry = self.running.get(key)
        if entry is None or entry["reduction"] != reduction:
            entry = self.running[key] = {
                "reduction": reduction,
                "value": _start(reduction, value.device),
                "count": torch.zeros((), dtype=torch.int64, device=value.device) if reduction == "mean" else None,
                "log": {
                    **{k: kwargs[k] for k in _KEPT if k in kwargs},
                    "sync_dist": bool(kwargs.get("sync_dist", False)),
                },
            }
        running = entry["value"].to(value.device)
        if reduction == "mean":  # the operations of Lightning's own aggregate, in its order
            batch_size = int(kwargs["batch_size"])
            entry["value"] = running + value * batch_size
            entry["count"] = entry["count"].to(value.device) + batch_size
        elif reduction == "sum":
            entry["value"] = running + value
        else:
            entry["value"] = (torch.maximum if reduction == "max" else torch.minimum)(running, value)

    # --- checkpoints --------------------------------------------------------------------------
    def partial(self) -> dict[str, dict[str, Any]]:
        """This rank's running aggregates as CPU tensors and plain values (for a checkpoint inside
        an epoch; it loads with ``torch.load(weights_only=True)``)."""
        return {
            key: {
                "reduction": entry["reduction"],
                "value": entry["value"].detach().cpu().clone(),
                "count": entry["count"].cpu().clone() if entry["count"] is not None else None,
                "log": dict(entry["log"]),
            }
            for key, entry in self.running.items()
        }

    def restore(self, saved: dict[str, dict[str, Any]]) -> None:
        """Take back the running aggregates of :meth:`partial` (before the resumed session's first
        step). Also those a checkpoint written before this class holds: Lightning's own running
        sums, keyed ``<hook>.<name>`` with their ``self.log`` arguments (the same sums)."""
        for key, entry in saved.items():
            log = entry["log"]
            if "fx" in log:
                key = f"{log['name']}_epoch" if log["on_step"] and log["on_epoch"] else log["name"]
            kept = {k: log[k] for k in _KEPT if k in log}
            self.running[key] = {**entry, "log": {**kept, "sync_dist": bool(log.get("sync_dist"))}}

    # --- Lightning hooks ----------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.open = True

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.open = True  # a session resumed inside an epoch starts here

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log every aggregate's epoch value (one row with Lightning's epoch-end values) and start afresh."""
        self.open = False
        running, self.running = self.running, {}
        for key in sorted(running):  # every rank reduces the same keys in the same order
            entry, args = running[key], dict(running[key]["log"])
            reduction = entry["reduction"]
            value = entry["value"].to(pl_module.device)
            count = entry["count"].to(pl_module.device) if entry["count"] is not None else None
            if args.pop("sync_dist") and not args.get("rank_zero_only") and trainer.world_size > 1:
                value = trainer.strategy.reduce(value.clone(), reduce_op=reduction)  # as Lightning syncs it
                if count is not None:
                    count = trainer.strategy.reduce(count.clone(), reduce_op=reduction)
            if count is not None:
                value = value / count
            L.LightningModule.log(pl_module, key, value, on_step=False, on_epoch=True, batch_size=1, **args)


def epoch_aggregates(trainer: L.Trainer) -> EpochAggregates | None:
    """The trainer's :class:`EpochAggregates` callback, if it has one."""
    return next((cb for cb in trainer.callbacks if isinstance(cb, EpochAggregates)), None)  # type: ignore[attr-defined]
