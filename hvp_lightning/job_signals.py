"""The signal SLURM warns a job with before a pre-emption or its time limit, and who acts on it.

SLURM signals every process of a job step (``--signal=USR2@...``, ``scancel --signal=USR2``): the
training processes and each one's DataLoader workers alike. A worker is a fork of its training
process, so it inherits the Python handler in place when it was forked -- submitit's, which
checkpoints and requeues the job, or :class:`hvp_lightning.preemption.StopOnSignal`'s. Several
workers running submitit's handler at once race on its pickle ("A temporary saved file already
exists") and requeue the job from the middle of a step. Only the training process may act:
every loader of this package starts its workers with :func:`leave_job_signals_to_trainer`.

The requeue itself makes SLURM send SIGTERM to every process of the step, while the training
process is still stopping (submitit's handler ignores SIGTERM there). torch's workers end quietly
on their parent's SIGTERM only; a worker killed by slurmstepd's makes
torch raise "DataLoader worker ... is killed by signal: Terminated" in the training process, which
replaces the stop's exit and reports the requeued job as failed. A worker therefore ends with
status 0 on SIGTERM, and the training process decides what that means.
Torch-free, so that any loader can use it.
"""

from __future__ import annotations

import os
import signal
from types import FrameType


def preempt_signal() -> signal.Signals:
    """The signal submitit treats as pre-emption: ``SIGUSR2``, or ``SIG$SUBMITIT_PREEMPT_SIGNAL``."""
    return signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    os._exit(0)


def leave_job_signals_to_trainer(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: this worker ignores :func:`preempt_signal` (its training
    process handles it) and ends with status 0 on SIGTERM (module docstring).

    Args:
        worker_id: the worker's index in its loader (unused: every worker does the same).
    """
    signal.signal(preempt_signal(), signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_quietly)
