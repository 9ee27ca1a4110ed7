"""The signals a job is told to stop with, and who acts on them.

Two signals ask a run to stop: SLURM's warning before a pre-emption or its time limit
(:func:`preempt_signal`, ``--signal=USR2@...``, ``scancel --signal=USR2``), and SIGTERM, which a
spot VM, Kubernetes, ``docker stop`` or torchrun sends before its SIGKILL (and SLURM at the end
of a requeue). Both can reach every process of the job, loader workers and their fork server
included. Only the training process may act on them
(:class:`hvp_lightning.training.preemption.StopOnSignal`: finish the step, checkpoint it, exit); a worker
running submitit's handler would checkpoint and requeue the job from the middle of a step, once
per worker.

So the fork server that starts every loader worker ignores both
(:mod:`hvp_lightning.data.workers`), and each worker, once started
(:func:`leave_job_signals_to_trainer`), ignores the pre-emption signal. A SIGTERM from its own
training process (its loader's shutdown, that process's exit) ends a worker at once; one from
anyone else leaves it serving its training process -- which is finishing its step and needs the
next batches to get to its checkpoint -- for :data:`WORKER_GRACE_S` seconds at most, after which
the kernel ends it (SIGALRM), wherever it is. Normally its loader ends it before that. Torch-free,
so that any loader can use it.
"""

from __future__ import annotations

import os
import signal
import threading
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


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    os._exit(0)


def _answer_sigterm(trainer_pid: int) -> None:
    """A worker's SIGTERM, read on a thread of its own with its sender: from its training process
    (its loader ending it, or that process's exit) it ends now; from anyone else (a VM's shutdown,
    slurmstepd) it serves on and lets the kernel end it :data:`WORKER_GRACE_S` seconds later
    (SIGALRM's default action needs no Python to run: it ends a worker stuck in native code too)."""
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        if info.si_pid == trainer_pid:
            os._exit(0)
        signal.alarm(WORKER_GRACE_S)


def leave_job_signals_to_trainer(worker_id: int, trainer_pid: int | None = None) -> None:
    """A DataLoader ``worker_init_fn``: this worker ignores :func:`preempt_signal` and, on a SIGTERM
    that its training process (``trainer_pid``) did not send, serves on for a while (module
    docstring). Where the sender cannot be told (no ``sigwaitinfo``, no ``trainer_pid``), a SIGTERM
    ends it quietly (status 0).

    Args:
        worker_id: the worker's index in its loader (unused: every worker does the same).
        trainer_pid: the process that made the loader (:func:`hvp_lightning.data.workers.worker_options`).
    """
    signal.signal(preempt_signal(), signal.SIG_IGN)
    if preempt_signal() == signal.SIGTERM:
        return
    if trainer_pid is None or not hasattr(signal, "sigwaitinfo"):
        signal.signal(signal.SIGTERM, _exit_quietly)
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # this thread and every later one
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # inherited ignored; blocked, it waits for the reader
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    threading.Thread(target=_answer_sigterm, args=(trainer_pid,), name="hvp-sigterm", daemon=True).start()
