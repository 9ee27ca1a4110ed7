"""Nothing waits forever: every wait on another process has a limit, and a stop request ends a
run even where it waits.

A rank waits on the other ranks in every collective (DDP's gradient all-reduce, the k-NN
gather, the stop agreement) and on its loader workers for every batch. Where the other side
never answers -- a rank stopped or hung, a worker stuck at its start -- torch would wait 30
minutes (gloo's default) or forever (a loader without a timeout), and an unattended sweep job
holds its GPUs until the time limit. So:

* every collective and every loader wait is limited to ``limits.wait_s`` seconds (the process
  group's timeout, :func:`ddp_strategy`; the loaders' ``timeout``,
  :func:`hvp_lightning.data.workers.worker_options`); past it the run fails with an error that
  says which rank waited for what (:func:`describe_wait_error`), and :func:`end_descendants`
  ends the processes this one started (the other ranks Lightning launched, loader workers), so
  none is left waiting or stopped. The last checkpoint is untouched (they are written
  atomically).
* a Python signal handler runs only between bytecodes of the main thread, never while it waits
  in native code (a collective, a loader queue): SIGTERM or Ctrl-C would be noted and never acted
  on. :class:`StopWatch` reads the signal on a thread of its own (the interpreter's wakeup fd) and
  gives the run ``limits.stop_grace_s`` seconds to stop at a step the normal way
  (:class:`hvp_lightning.training.preemption.StopOnSignal`); if it has not by then, it ends the process
  and its descendants itself, with status ``128 + signal``.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import traceback
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from ..run.process_rank import env_rank
from ..schema.run import TrainerSettings

# --- collectives --------------------------------------------------------------------------------
DDP_STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {},
    "ddp_find_unused_parameters_false": {"find_unused_parameters": False},
    "ddp_find_unused_parameters_true": {"find_unused_parameters": True},
}


def several_processes(devices: Any, num_nodes: int, accelerator: str) -> bool:
    """Whether Lightning's ``strategy: auto`` makes this a multi-process (DDP) run."""
    if num_nodes > 1:
        return True
    if isinstance(devices, (list, tuple)):
        return len(devices) > 1
    if isinstance(devices, str) and devices not in ("auto", "-1"):
        devices = len([d for d in devices.split(",") if d.strip()]) if "," in devices else int(devices)
    if isinstance(devices, int) and devices != -1:
        return devices > 1
    import torch  # devices auto / -1: every GPU, or one CPU process

    return accelerator in ("auto", "gpu", "cuda") and torch.cuda.device_count() > 1


def ddp_strategy(trainer: TrainerSettings, wait_s: float) -> Any:
    """``trainer.strategy`` with the process group's timeout set to ``wait_s``: a
    ``DDPStrategy`` for ``ddp`` (and its ``find_unused_parameters`` variants) and for ``auto``
    where that means several processes; any other strategy as given. A collective that waits
    longer raises (gloo) or aborts the process (NCCL's watchdog) instead of waiting 30 minutes."""
    strategy = trainer.strategy
    if strategy == "auto" and several_processes(trainer.devices, trainer.num_nodes, trainer.accelerator):
        strategy = "ddp"
    if strategy not in DDP_STRATEGIES:
        return strategy
    from .distributed import AttemptStoreDDP  # Lightning: imported only for a DDP run

    return AttemptStoreDDP(timeout=timedelta(seconds=wait_s), **DDP_STRATEGIES[strategy])


# --- the error when a limit was reached -----------------------------------------------------------
class WaitedTooLong(RuntimeError):
    """A rank waited longer than ``limits.wait_s`` for another rank or for its loader workers."""


def _where(err: BaseException) -> str:
    """The innermost frame of the traceback outside torch: the code that waited."""
    frames = traceback.extract_tb(err.__traceback__)
    ours = [f for f in frames if "/torch/" not in f.filename]
    f = (ours or frames)[-1] if frames else None
    return f"{Path(f.filename).name}:{f.lineno} in {f.name}" if f is not None else "unknown code"


def describe_wait_error(err: BaseException, wait_s: float) -> str | None:
    """A one-line account of ``err`` if it is a wait limit that fired -- which rank waited, for
    what, from where -- else None."""
    text = str(err)
    low = text.lower()
    rank = env_rank()
    if "dataloader timed out after" in low:
        return (
            f"rank {rank} waited more than {wait_s:g} s (limits.wait_s) for a batch from its loader workers "
            f"({_where(err)}); a worker is stuck or too slow: {text}"
        )
    collective = ("timed out" in low or "timeout" in low) and any(
        word in low for word in ("gloo", "nccl", "collective", "recv", "send", "pair", "watchdog", "barrier")
    )
    if collective:
        return (
            f"rank {rank} waited more than {wait_s:g} s (limits.wait_s) for the other ranks in a collective "
            f"({_where(err)}); another rank is stopped, hung or gone: {text.splitlines()[0] if text else err!r}"
        )
    return None


# --- ending what this process started -------------------------------------------------------------
def descendants(pid: int | None = None) -> list[int]:
    """Every living descendant of ``pid`` (default: this process), from ``/proc``; empty where
    there is none."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def end_descendants() -> list[int]:
    """SIGKILL every descendant of this process (stopped ones too): the ranks Lightning
    launched, the loader workers' fork server and its workers. Returns their pids."""
    pids = descendants()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


# --- stop requests while waiting -----------------------------------------------------------------
class StopWatch:
    """While inside (a run), SIGTERM and SIGINT are also seen by a watcher thread, through the
    interpreter's wakeup fd (written by the C-level handler, which runs wherever the main thread
    is). If the process has not left the block ``grace_s`` seconds after the first one, the
    watcher says so on stderr, ends the process's descendants and exits with ``128 + signal``.

    The signals still need a Python handler for the wakeup fd to see them: Lightning's SIGTERM
    handler, :class:`hvp_lightning.training.preemption.StopOnSignal`'s, Python's SIGINT one. Outside the
    main thread, or where another wakeup fd is in use, it does nothing."""

    WATCHED = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.left = threading.Event()
        self.active = False

    def __enter__(self) -> StopWatch:
        if threading.current_thread() is not threading.main_thread():
            return self
        self.reader, self.writer = socket.socketpair()
        self.writer.setblocking(False)
        previous = signal.set_wakeup_fd(self.writer.fileno(), warn_on_full_buffer=False)
        if previous != -1:  # someone else's (an event loop): leave it
            signal.set_wakeup_fd(previous)
            self.reader.close()
            self.writer.close()
            return self
        self.active = True
        threading.Thread(target=self._watch, name="hvp-stop-watch", daemon=True).start()
        return self

    def __exit__(self, kind: type | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self.active:
            self.left.set()
            signal.set_wakeup_fd(-1)
            self.writer.close()  # the watcher reads EOF and ends
            self.active = False

    def _watch(self) -> None:
        while True:
            try:
                data = self.reader.recv(64)
            except OSError:
                return
            if not data:
                self.reader.close()
                return
            watched = [s for s in data if s in self.WATCHED]
            if watched:
                if not self.left.wait(self.grace_s):
                    self._force(signal.Signals(watched[0]))
                return

    def _force(self, signum: signal.Signals) -> None:
        ended = end_descendants()
        message = (
            f"rank {env_rank()}: {signum.name} came {self.grace_s:g} s ago (limits.stop_grace_s) and this "
            f"process has not stopped at a step: it waits on another rank or on a loader worker. Exiting "
            f"now with {128 + signum} without a new checkpoint (the last one is intact); ended "
            f"{len(ended)} process(es) it started.\n"
        )
        try:
            os.write(2, message.encode())
        finally:
            os._exit(128 + signum)
