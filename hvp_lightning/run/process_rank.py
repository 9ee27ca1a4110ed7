"""This process's rank, from its launcher's environment: what code can tell before a Trainer
exists (building datasets) or where Lightning is not imported (loader workers, their fork server).
Torch- and Lightning-free; the variables and their order are Lightning's (``rank_zero_only``)."""

from __future__ import annotations

import os

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


def env_rank() -> int:
    """The first of :data:`RANK_VARIABLES` that is set, else 0 (one process)."""
    for key in RANK_VARIABLES:
        value = os.environ.get(key)
        if value is not None:
            return int(value)
    return 0
