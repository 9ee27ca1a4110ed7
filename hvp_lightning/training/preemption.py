"""Stop requests: SLURM's warning before a pre-emption or its time limit, and SIGTERM from anywhere
else (a spot VM's or Kubernetes' notice, ``docker stop``, torchrun). Either way the run finishes the
step it is in, checkpoints it, and exits; running the same command again (the requeued job, torchrun's
restart, the user) continues exactly there.

SLURM warns a job before it kills it: hydra-submitit-launcher submits with
``--signal=USR2@<signal_delay_s>`` (USR2 ``signal_delay_s`` seconds before the time limit;
``scancel --signal=USR2`` and pre-emption with ``PreemptParameters=send_user_signal`` send
the same). submitit handles that signal in every task it starts: rank 0 re-dumps the job,
``scontrol requeue``-s it and exits (``submitit.core.job_environment.SignalHandler``). Left
alone, that handler runs wherever the signal lands, in the middle of a step, and the requeued
job continues from the last epoch-end checkpoint. Outside SLURM, a SIGTERM is followed by a
SIGKILL after a grace period (often 30 s), and Lightning's own SIGTERM handling stops at the next
batch without a checkpoint.

:class:`StopOnSignal` puts a handler of its own in front of both (:func:`stop_signals`: SLURM's
signal, and SIGTERM outside SLURM, where SLURM's requeue sends it to a job already stopping)
while the run trains:

1. the handler only notes that the signal came (nothing else is safe in the middle of a step);
2. at every training batch end where the optimiser stepped, the ranks agree whether any of
   them has seen a signal (one all-reduce of a flag): signals reach the ranks at slightly
   different moments, or only one of them, and all of them must stop after the same step;
3. once they agree, every rank finishes that step (the LightningModule's batch-end work such
   as the EMA teacher and the step's log rows) and the checkpoint ``last.ckpt`` is written
   before the next step starts, with the RNG streams as they were at the step's end;
4. then, for SLURM's signal, the handler that was there before (submitit's) runs on every rank:
   it requeues the job on rank 0 and exits with status 255 (``sys.exit(-1)``), or, where it
   refuses (too many time-outs), raises submitit's error; the other ranks wait for rank 0 at a
   barrier and exit with status ``128 + signal``, as do all ranks where no handler was installed
   before (a local run) and all ranks stopped by SIGTERM (143): "stopped at a step, resumable".

A rank stuck where no Python handler runs (a collective whose peer is gone) is ended after
``limits.stop_grace_s`` by :class:`hvp_lightning.cluster.waits.StopWatch`. Loader workers get the
signals too, and leave them to the training process (:mod:`hvp_lightning.run.job_signals`).

The requeued job runs the same command in the same run dir, which resumes ``last.ckpt``
(:func:`hvp_lightning.training.checkpoint.resume_checkpoint`). Lightning's own SLURM auto-requeue
(a SIGUSR1 handler that saves from inside the handler, mid-step) is switched off:
:func:`cluster_plugins`. docs/DESIGN.md "Pre-emption" argues the choice.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import lightning as L
import torch

from ..run.job_signals import preempt_signal
from ..run.records import RunRecord
from .checkpoint import RunCheckpoint, rng_state

log = logging.getLogger(__name__)


def under_slurm() -> bool:
    """Whether this process is a SLURM task (Lightning's test: ``srun``-started, not interactive)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return SLURMEnvironment.detect()


def stop_signals() -> list[signal.Signals]:
    """The signals that stop a run at a step: :func:`preempt_signal`, and SIGTERM outside SLURM
    (under SLURM it is the requeue's own, sent while the run already stops, or ``scancel``'s)."""
    return list(dict.fromkeys([preempt_signal(), *([] if under_slurm() else [signal.SIGTERM])]))


def cluster_plugins() -> list[Any]:
    """Trainer plugins for the cluster: under SLURM, Lightning's SLURM environment without its
    auto-requeue, so that Lightning installs no requeue handler of its own (it would save a
    checkpoint from inside the signal handler, in the middle of a step) -- :class:`StopOnSignal`
    and submitit requeue. Empty elsewhere (Lightning picks its environment as usual)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if under_slurm() else []


def agree(trainer: L.Trainer, signum: int) -> int:
    """The largest of the ranks' ``signum`` (0: none received), on every rank (a collective: all
    ranks call it at the same step)."""
    if trainer.world_size == 1:
        return signum
    t = torch.tensor([float(signum)], device=trainer.strategy.root_device)
    return int(trainer.strategy.reduce(t, reduce_op="max").item())


class StopOnSignal(L.Callback):
    """Stop after the step at which any rank has received one of :func:`stop_signals`, write
    ``last.ckpt`` at that step and, for SLURM's signal, hand over to the handler that was
    installed before (module docstring). ``checkpointer`` writes the checkpoint; ``record`` notes
    the session's time and the W&B step of the stop in sessions.json."""

    def __init__(self, checkpointer: RunCheckpoint, record: RunRecord) -> None:
        self.checkpointer = checkpointer
        self.record = record
        self.signals = stop_signals()
        self.signum = self.signals[0]  # the signal the run stops for (the ranks agree on it)
        self.received = 0  # the first stop signal this process received (its handler sets it)
        self.previous: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int | None] = {}
        self.installed = False
        self.pending = False  # the ranks agreed to stop; the step they stop after is done
        self.rng: dict[str, Any] | None = None  # this rank's RNG streams at the end of that step
        self.last_step = -1  # global step of the last agreement

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.received = self.received or signum

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Take the signal once training starts: after Lightning has noted the handlers in place
        (its own teardown puts them back, on every path). Before that, nothing is trained that
        the last checkpoint lacks, and the previous handler acts at once."""
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._note) for s in self.signals}
            self.installed = True

    def give_back(self) -> None:
        """Put the previous handler back (Lightning runs ``teardown`` only when the fit ends
        normally: a stop or a failure ends it with an exception)."""
        if self.installed:
            for s, handler in self.previous.items():
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)
            self.installed = False

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.give_back()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.give_back()
        if self.received and not self.pending:  # the fit ended before a batch end could act on it
            name = signal.Signals(self.received).name  # this process's own signal: no agreement was reached
            log.warning("%s came after the last training step; the run finishes instead of stopping", name)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        step = trainer.global_step
        if step == self.last_step:  # accumulating gradients: no optimiser step at this batch
            return
        self.last_step = step
        agreed = agree(trainer, self.received)
        if agreed:
            self.signum, self.pending = signal.Signals(agreed), True
            self.rng = rng_state()  # before the next batch's device-side augmentations draw

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.pending:  # the previous step is complete: module hooks done, its rows logged
            self.checkpointer.save_step(trainer, self.rng)
            self._stop(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.pending:  # agreed at an epoch's last step: its epoch-end checkpoint is this step's
            self._stop(trainer)

    def _stop(self, trainer: L.Trainer) -> None:
        self.record.note_checkpoint_step(trainer)  # W&B rewind point, this session's time
        if trainer.is_global_zero:
            log.warning(
                "%s: stopped after step %d with checkpoint %s; the run continues from there "
                "(requeued by submitit, or the same command again)",
                self.signum.name,
                trainer.global_step,
                self.checkpointer.last_path,
            )
        else:  # each task's log says why it ended
            log.warning(
                "%s: stopped after step %d (rank %d)", self.signum.name, trainer.global_step, trainer.global_rank
            )
        mark_wandb_preempting(trainer)
        previous = self.previous.get(self.signum) if self.signum == preempt_signal() else None
        self.give_back()
        outcome: BaseException = SystemExit(128 + self.signum)
        if callable(previous):  # SLURM's signal: submitit's handler (SIGTERM's, Lightning's, is not called)
            try:
                previous(self.signum, None)  # submitit: rank 0 requeues, then sys.exit(-1)
            except BaseException as err:  # noqa: BLE001 -- raised again below, after the barrier
                outcome = err
        trainer.strategy.barrier("preempted")  # no rank exits before rank 0 has requeued
        raise outcome


def mark_wandb_preempting(trainer: L.Trainer) -> None:
    """Tell W&B the run is being pre-empted (shown as such, not as crashed, until it resumes)."""
    from lightning.pytorch.loggers import WandbLogger

    if trainer.is_global_zero and isinstance(trainer.logger, WandbLogger):
        mark = getattr(trainer.logger.experiment, "mark_preempting", None)
        if callable(mark):
            mark()
