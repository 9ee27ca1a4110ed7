"""The signal SLURM warns a job with before a pre-emption or its time limit, and who acts on it.

SLURM signals every process of a job step (``--signal=USR2@...``, ``scancel --signal=USR2``): the
training processes and each one's DataLoader workers alike. A worker is a fork of its training
process, so it inherits the Python handler in place when it was forked -- submitit's, which
checkpoints and requeues the job, or :class:`hvp_lightning.preemption.StopOnSignal`'s. Several
workers running submitit's handler at once race on its pickle ("A temporary saved file already
exists") and requeue the job from the middle of a step. Only the training process may act:
every loader of this package starts its workers with :func:`leave_job_signal_to_trainer`.
Torch-free, so that any loader can use it.
"""

from __future__ import annotations

import os
import signal


def preempt_signal() -> signal.Signals:
    """The signal submitit treats as pre-emption: ``SIGUSR2``, or ``SIG$SUBMITIT_PREEMPT_SIGNAL``."""
    return signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]


def leave_job_signal_to_trainer(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: this worker ignores :func:`preempt_signal`; its training
    process handles it, and ends the worker with the loader.

    Args:
        worker_id: the worker's index in its loader (unused: every worker does the same).
    """
    signal.signal(preempt_signal(), signal.SIG_IGN)
