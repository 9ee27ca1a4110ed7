"""The signals a job is told to stop with, and who acts on them.

Two signals ask a run to stop: SLURM's warning before a pre-emption or its time limit
(:func:`preempt_signal`, ``--signal=USR2@...``, ``scancel --signal=USR2``), and SIGTERM, which a
spot VM, Kubernetes, ``docker stop`` or torchrun sends before its SIGKILL (and SLURM at the end
of a requeue). Both can reach every process of the job, loader workers and their fork server
included. Only the training process may act on them
(:class:`hvp_lightning.preemption.StopOnSignal`: finish the step, checkpoint it, exit); a worker
running submitit's handler would checkpoint and requeue the job from the middle of a step, once
per worker.

So the fork server that starts every loader worker ignores both
(:mod:`hvp_lightning.data.workers`), and each worker, once started
(:func:`leave_job_signals_to_trainer`), ignores the pre-emption signal and on SIGTERM goes on
serving its training process -- which is finishing its step and needs the next batches to get to
its checkpoint -- for :data:`WORKER_GRACE_S` seconds at most; then the kernel ends it (SIGALRM),
wherever it is. Normally its loader ends it before that. Torch-free, so that any loader can use it.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

# How long a loader worker serves on after a SIGTERM: longer than a training process takes to
# stop at a step (limits.stop_grace_s), after which it ends its workers itself.
WORKER_GRACE_S = 120


def preempt_signal() -> signal.Signals:
    """The signal submitit treats as pre-emption: ``SIGUSR2``, or ``SIG$SUBMITIT_PREEMPT_SIGNAL``."""
    return signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]


def job_signals() -> list[signal.Signals]:
    """Every signal that asks a run to stop: :func:`preempt_signal` and SIGTERM."""
    return list(dict.fromkeys([preempt_signal(), signal.SIGTERM]))


def _end_later(signum: int, frame: FrameType | None) -> None:
    """Let the kernel end this process :data:`WORKER_GRACE_S` seconds from now (SIGALRM's default
    action needs no Python to run: it ends a worker stuck in native code too)."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(WORKER_GRACE_S)


def leave_job_signals_to_trainer(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: this worker ignores :func:`preempt_signal` and serves on
    for a while after a SIGTERM (module docstring).

    Args:
        worker_id: the worker's index in its loader (unused: every worker does the same).
    """
    signal.signal(preempt_signal(), signal.SIG_IGN)
    if preempt_signal() != signal.SIGTERM:
        signal.signal(signal.SIGTERM, _end_later)
