"""Run a function in several CPU processes joined by a gloo process group (the DDP tests).

``run_ranks(fn, args)`` spawns ``world`` processes; rank r calls ``fn(rank, world, *args)``
inside an initialised process group and its return value comes back in ``results[r]``.
Processes are forked where the platform allows (Linux): they inherit the imported modules,
which a spawned process would spend tens of seconds re-importing on a small machine.
``fn`` must be a module-level function (spawned processes import it by name).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, folder: str, fn: Callable[..., Any], args: tuple) -> None:
    torch.set_num_threads(1)  # two ranks on a small machine: no oversubscription
    # A file rendezvous: no port to pick, so no race with other processes on the machine.
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world)
    try:
        torch.save(fn(rank, world, *args), Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], args: tuple = (), world: int = 2) -> list[Any]:
    """``[fn(0, world, *args), ..., fn(world - 1, world, *args)]``, each in its own process."""
    with tempfile.TemporaryDirectory() as folder:
        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        mp.start_processes(_entry, args=(world, folder, fn, args), nprocs=world, join=True, start_method=method)
        return [torch.load(Path(folder) / f"rank{r}.pt", weights_only=False) for r in range(world)]
