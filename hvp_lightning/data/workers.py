"""Where loader workers come from: a clean fork server, never the training process.

A training process is never single-threaded (gloo, the pin-memory thread, W&B, Lightning's
observers). A child forked from it can inherit a lock that another thread held at the moment of
the fork and wait on it forever before it runs a line of Python (CPython gh-112275: the runtime's
thread-list lock, taken without the GIL whenever a native thread makes or drops a thread state).
A k-NN pass that forked fresh workers hung a resumed DDP run that way. So no loader of this
package forks from the training process: every loader with workers starts them through
:func:`worker_context`, multiprocessing's ``forkserver``. Its server is a fresh interpreter (exec'd,
not forked), single-threaded, that has imported torch and this package's datasets once
(:data:`PRELOAD`); each worker is a fork of it, so a worker starts in milliseconds instead of
importing torch anew (what a plain ``spawn`` costs). The server ends with the process that
started it.

The job signals (:mod:`hvp_lightning.run.job_signals`) reach every process of a SLURM step or a
stopped VM, the server included: the server is started with them ignored (an ignored signal stays
ignored across ``exec`` and ``fork``), so neither it nor a worker it forks can be ended by one
before the worker's own rule (:func:`hvp_lightning.run.job_signals.leave_job_signals_to_trainer`)
is in place. Where ``forkserver`` does not exist (Windows), workers are spawned.

What a worker needs -- the dataset, its transforms, the ``worker_init_fn`` -- is pickled to it, so
all of it is picklable (tested for every loader the package builds).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import threading
from multiprocessing import forkserver
from multiprocessing.context import BaseContext
from typing import Any

from ..run.job_signals import job_signals, leave_job_signals_to_trainer

# Imported by the fork server before it forks the first worker: what unpickling any of this
# package's datasets and transforms imports (torch, torchvision, PIL and the data modules; not
# Lightning, which none of them needs: tested), and the main script (whose module-level code each
# worker would otherwise run again).
PRELOAD = [
    "__main__",
    "torch",
    "torchvision.datasets",
    "hvp_lightning.data.items",
    "hvp_lightning.data.iou_policy",
    "hvp_lightning.data.resident",
    "hvp_lightning.data.textures",
    "hvp_lightning.run.job_signals",
]

_lock = threading.Lock()
_context: BaseContext | None = None


def worker_context() -> BaseContext:
    """The multiprocessing context every loader worker of this package starts from: ``forkserver``
    (its server started now, once per process, with the job signals ignored; module docstring),
    else ``spawn``. Call it early (a run does, when its data module is built): the server
    imports :data:`PRELOAD` while the training process sets up."""
    global _context
    with _lock:
        if _context is None:
            if "forkserver" not in multiprocessing.get_all_start_methods():
                _context = multiprocessing.get_context("spawn")
            else:
                _context = multiprocessing.get_context("forkserver")
                _context.set_forkserver_preload(PRELOAD)
                _start_server_ignoring(job_signals())
        return _context


def _start_server_ignoring(signals: list[signal.Signals]) -> None:
    """Start the fork server with ``signals`` ignored from its first instruction. Their handlers in
    this process are set aside for the few milliseconds of the server's ``exec``; outside the main
    thread (where handlers cannot be set, and none of this package's are), the server starts as is.
    (Should it be ended, multiprocessing starts a plain one on the next worker.)"""
    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in signals}
    try:
        forkserver.ensure_running()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def server_pid() -> int | None:
    """The fork server's process id, once started (diagnostics and tests)."""
    return getattr(forkserver._forkserver, "_forkserver_pid", None)  # noqa: SLF001 -- the stdlib's one server


def worker_options(num_workers: int, wait_s: float, persistent: bool = False) -> dict[str, Any]:
    """``DataLoader`` keyword arguments for ``num_workers`` workers started from
    :func:`worker_context`, each with the job-signal rule, and a limit on every wait for a batch:
    a loader whose workers do not deliver one within ``wait_s`` seconds raises instead of waiting
    forever (``limits.wait_s``). ``persistent``: the workers outlive an epoch or a k-NN pass."""
    if num_workers == 0:
        return {"num_workers": 0}
    return {
        "num_workers": num_workers,
        "multiprocessing_context": worker_context(),
        "worker_init_fn": functools.partial(leave_job_signals_to_trainer, trainer_pid=os.getpid()),
        "timeout": float(wait_s),
        "persistent_workers": persistent,
    }
