"""Atomic file writes: the new content goes to a temporary file next to the target, is flushed
to disk and then ``os.replace``-d over it, so readers (and a run resumed after a crash or
SIGKILL mid-write) see the old file or the complete new one, never a truncated one.

Torch-free, so the modules that run before the heavy imports (hvp_lightning/cluster/sweep.py) share it
with the checkpoint and log writers.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(file)`` on a new temporary file next to ``path``, fsync, then rename it over
    ``path``. The temporary's name (``.<name>.tmp-<pid>-<random>``) is unique per call, so
    writers in several processes or on several nodes may replace one file at once (the last
    rename wins)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    f = open(tmp, "xb")  # the usual permissions (umask), unlike mkstemp's; outside the try: not ours if it exists
    try:
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # some file systems refuse fsync on directories
        pass


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write` of ``text``, UTF-8 encoded."""
    atomic_write(path, lambda f: f.write(text.encode()))
