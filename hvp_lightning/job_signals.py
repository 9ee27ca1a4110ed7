"""The signal SLURM warns a job with before a pre-emption or its time limit, and who acts on it.

SLURM signals every process of a job step (``--signal=USR2@...``, ``scancel --signal=USR2``): the
training processes and each one's DataLoader workers alike. A worker is a fork of its training
process, so it inherits the Python handler in place when it was forked -- submitit's, which
checkpoints and requeues the job, or :class:`hvp_lightning.preemption.StopOnSignal`'s. Several
workers running submitit's handler at once race on its pickle ("A temporary saved file already
exists") and requeue the job from the middle of a step. Only the training process may act:
every loader of this package starts its workers with :func:`leave_job_signals_to_trainer`, and
before that runs (a worker just forked), the handler they inherit does nothing outside the process
that installed it: :func:`handled_in_this_process_only`, around a run.

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
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


def preempt_signal() -> signal.Signals:
    """The signal submitit treats as pre-emption: ``SIGUSR2``, or ``SIG$SUBMITIT_PREEMPT_SIGNAL``."""
    return signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]


class OwnProcessOnly:
    """A signal handler that calls ``handler`` in the process that made it, and does nothing in its
    forks (which inherit it)."""

    def __init__(self, handler: Callable[[int, FrameType | None], Any]) -> None:
        self.handler, self.owner = handler, os.getpid()

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() == self.owner:
            self.handler(signum, frame)


@contextmanager
def handled_in_this_process_only() -> Iterator[None]:
    """While inside, the handler in place for :func:`preempt_signal` (submitit's, under SLURM) acts
    in this process only: a loader worker forked from it and signalled before its
    ``worker_init_fn`` has run does nothing. Put back on the way out. A no-op outside the main
    thread, where no Python handler is in place, or inside another such block."""
    sig = preempt_signal()
    current = signal.getsignal(sig)
    guarded = isinstance(current, OwnProcessOnly) and current.owner == os.getpid()
    if threading.current_thread() is not threading.main_thread() or not callable(current) or guarded:
        yield
        return
    guard = OwnProcessOnly(current)
    signal.signal(sig, guard)
    try:
        yield
    finally:
        if signal.getsignal(sig) is guard:
            signal.signal(sig, current)


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
