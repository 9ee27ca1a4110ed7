"""A compute budget instead of epochs: ``budget.flops`` / ``budget.match`` set ``trainer.max_epochs``
from the run's counted model FLOPs (docs/configuration.md "A compute budget instead of epochs").

A step costs what summary.json's ``cost.total_flops`` adds up (:meth:`~hvp_lightning.run.perf.StepFlops.total`,
per image from :func:`.cost.count_step_flops`): each image of an optimiser step -- every process's,
every micro-batch's -- costs ``train + selection`` on HVP's selecting steps (``global_step %
hvp.every_n_steps == 0``) and ``baseline`` on the others. So a budget, and a matched run's total,
are in the units of ``cost.total_flops``, whatever a selection costs.

Whole epochs: the run trains the number of epochs whose FLOPs come closest to the budget (within
half an epoch's; the start-up line and summary.json say how close), and everything that spans
the run -- learning-rate, momentum and weight-decay schedules, warm-ups, k-NN passes, kept
checkpoints, the IoU policy -- spans those epochs as it spans a preset's. Not steps: a run
that Lightning ends with ``max_steps`` inside an epoch does not resume exactly from an epoch's
checkpoint (Lightning 2.6 takes such a fit for iteration-based and counts the restored epoch
twice), and an exact resume is this project's contract.

The epochs are derived once, at a run's start, and stored in its config (``trainer.max_epochs``):
a resumed run keeps them, unless its command changes the budget.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import fail, matched_flops, warn_long_warmup
from ..device import local_processes
from ..errors import ConfigError
from ..run.directory import RunDir
from ..run.perf import StepFlops
from ..run.process_rank import env_rank
from ..schema import TrainConfig
from ..schema.run import check_iou_warmup, trainer_extras

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Epoch:
    """One epoch's optimiser steps, as Lightning runs them.

    Attributes:
        steps: optimiser steps per epoch (an incomplete accumulation at its end is a step too).
        step_images: images of a step, every process's and micro-batch's.
        last_images: images of the epoch's last step: fewer when ``trainer.accumulate_grad_batches``
            does not divide the epoch's batches.
    """

    steps: int
    step_images: int
    last_images: int


def epoch_of(train_images: int, batch_size: int, processes: int, accumulate: int = 1, limit: float = 1.0) -> Epoch:
    """The epoch of ``train_images`` images: each process's share (``len // processes``) in full
    batches (drop_last), cut by ``trainer.limit_train_batches`` (``limit``: a fraction, or an int:
    batches) as Lightning cuts it, ``accumulate`` batches a step."""
    batches = train_images // processes // batch_size
    batches = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
    if batches < 1:
        raise ConfigError(f"method.batch_size={batch_size} is not allowed: an epoch of {train_images} images "
                          f"over {processes} processes holds no full batch")  # fmt: skip
    steps = math.ceil(batches / accumulate)
    per_batch = batch_size * processes
    return Epoch(steps, per_batch * accumulate, per_batch * (batches - (steps - 1) * accumulate))


def run_flops(epochs: int, flops: StepFlops, epoch: Epoch, every_n_steps: int = 1) -> int:
    """Model FLOPs of a run's first ``epochs`` epochs (what ``cost.total_flops`` adds up)."""

    def epoch_flops(e: int) -> int:  # epoch e: optimiser steps [start, end)
        start, end = e * epoch.steps, (e + 1) * epoch.steps
        selecting = -(-end // every_n_steps) - -(-start // every_n_steps)  # steps s with s % every_n_steps == 0
        short = epoch.step_images - epoch.last_images  # what the epoch's last step lacks
        selected = selecting * epoch.step_images - (short if (end - 1) % every_n_steps == 0 else 0)
        return flops.total(epoch.steps * epoch.step_images - short, selected)

    period = every_n_steps // math.gcd(epoch.steps, every_n_steps)  # epochs until the selecting steps repeat
    cycles, extra = divmod(epochs, period)
    return cycles * sum(map(epoch_flops, range(period))) + sum(map(epoch_flops, range(extra)))


def closest_count(budget: float, cost: Callable[[int], int]) -> int:
    """The count n >= 1 whose ``cost(n)`` comes closest to ``budget`` (a tie: the smaller);
    ``cost`` grows with n."""
    if cost(1) <= 0:
        raise ValueError("an epoch of no model FLOPs")
    hi = 1
    while cost(hi) < budget:
        hi *= 2
    lo = hi // 2  # cost(lo) < budget <= cost(hi) (lo = 0 when hi = 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) < budget else (lo, mid)
    return lo if lo >= 1 and budget - cost(lo) <= cost(hi) - budget else hi


def _check_at_least_half_an_epoch(cfg: TrainConfig, target: float, one_epoch: int) -> None:
    """Whole epochs come within half an epoch of a budget only if it holds half of one: a smaller
    one would train a whole epoch, many times what was asked."""
    if target >= one_epoch / 2:
        return
    b = cfg.budget
    why = f"one epoch of this run is {one_epoch:.4g} model FLOPs, and a budget sets whole epochs"
    if b.flops is not None:
        fail("budget.flops", b.flops, f"at least half of one epoch ({one_epoch / 2:.4g}): {why}")
    fail("budget.match", b.match, f"a run of at least half of one epoch's FLOPs (it trained {target:.4g}): {why}")


@dataclass(frozen=True)
class BudgetPlan:
    """What a budget set (summary.json's ``budget``).

    Attributes:
        flops: the budget: ``budget.flops``, or the matched run's ``cost.total_flops`` (None on a
            resume whose matched run dir is no longer there).
        match: ``budget.match``.
        epochs: the ``trainer.max_epochs`` it set.
        steps: the optimiser steps of those epochs.
        planned_flops: their model FLOPs.
        kept: a resumed run's stored epochs, not counted again.
    """

    flops: float | None
    match: str | None
    epochs: int
    steps: int
    planned_flops: int
    kept: bool = False

    def summary(self) -> dict[str, Any]:
        return {
            "flops": self.flops,
            "match": self.match,
            "epochs": self.epochs,
            "steps": self.steps,
            "planned_flops": self.planned_flops,
        }

    def line(self, epochs_before: int) -> str:
        """The start-up line: the budget, the epochs it set and how close they come to it."""
        source = f" (the total of {self.match})" if self.match else ""
        budget = f"{self.flops:.4g} model FLOPs{source}" if self.flops is not None else f"the FLOPs of {self.match}"
        if self.kept:
            return f"budget: {budget} -> trainer.max_epochs={self.epochs} ({self.steps} steps), the run's own (resumed)"
        replaced = f", in place of trainer.max_epochs={epochs_before}" if epochs_before != self.epochs else ""
        epoch = self.planned_flops / self.epochs
        off = 100 * (self.planned_flops / self.flops - 1) if self.flops else 0.0
        return (
            f"budget: {budget} -> trainer.max_epochs={self.epochs} ({self.steps} steps{replaced}): "
            f"{self.planned_flops:.4g} model FLOPs, {off:+.2f}% of the budget (whole epochs: within half of one, "
            f"{50 * epoch / self.planned_flops:.1f}%)"
        )


def apply_budget(
    cfg: TrainConfig, flops: StepFlops | None, train_images: int, stored: TrainConfig | None = None
) -> BudgetPlan | None:
    """The ``trainer.max_epochs`` that ``cfg.budget`` sets (None without one), as the plan's
    ``epochs`` (the run takes the changed copy of its config): ``flops`` the run's counted step,
    ``train_images`` its training set, ``stored`` the config of the checkpoint it resumes (its
    epochs are kept if the budget is the same). Says what it set in one start-up line."""
    if not cfg.budget.sets_epochs:
        return None
    b = cfg.budget
    key, value = ("budget.flops", b.flops) if b.flops is not None else ("budget.match", b.match)
    if flops is None:
        raise ConfigError(f"{key}={value!r} is not allowed: a run whose model FLOPs are counted (this method's "
                          "step could not be, see the warning above); set trainer.max_epochs instead")  # fmt: skip
    t = cfg.trainer
    processes = local_processes(t) * t.num_nodes
    limit = trainer_extras(t).get("limit_train_batches", 1.0)  # a +trainer.* key: Lightning's default
    epoch = epoch_of(train_images, cfg.method.batch_size, processes, t.accumulate_grad_batches, limit)
    every = cfg.hvp.every_n_steps if cfg.hvp_on else 1  # type: ignore[union-attr]

    def cost(epochs: int) -> int:
        return run_flops(epochs, flops, epoch, every)

    kept = stored is not None and stored.budget == b
    target = float(b.flops) if b.flops is not None else _matched(cfg, required=not kept)
    if not kept:
        _check_at_least_half_an_epoch(cfg, target, cost(1))  # type: ignore[arg-type]
    epochs = stored.trainer.max_epochs if kept else closest_count(target, cost)  # type: ignore[union-attr,arg-type]
    plan = BudgetPlan(target, b.match, epochs, epochs * epoch.steps, cost(epochs), kept)
    policy = cfg.data.iou_policy
    if policy is not None and policy.enabled:
        check_iou_warmup(policy.warmup_epochs, plan.epochs, "the budget's trainer.max_epochs")
    if env_rank() == 0:
        log.info(plan.line(t.max_epochs))
    warn_long_warmup(cfg.with_values({"trainer.max_epochs": plan.epochs}))
    return plan


def _matched(cfg: TrainConfig, required: bool) -> float | None:
    """The matched run's total (a warning if it trained another method, backbone or data set: the
    budget is its FLOPs all the same); on a resume that keeps its epochs, None if that run is gone."""
    run_dir = cfg.budget.match
    try:
        total = matched_flops(run_dir)
    except ConfigError:
        if required:
            raise
        return None
    summary = json.loads(RunDir(run_dir).summary.read_text())
    ours = {"method": cfg.method.name, "backbone": cfg.backbone.name, "dataset": cfg.data.name}
    other = [f"{k} {summary[k]} there, {v} here" for k, v in ours.items() if summary.get(k) not in (None, v)]
    if other and required and env_rank() == 0:
        log.warning("budget.match=%s is a run of another setup (%s): this run trains for its FLOPs all the same",
                    run_dir, "; ".join(other))  # fmt: skip
    return total
