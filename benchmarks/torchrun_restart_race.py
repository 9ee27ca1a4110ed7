"""A torchrun restart whose ranks come up at different times, without this package (by hand, not a test).

Attempt 0: both ranks join a gloo group and exit 143 (a stop at a step). torchrun restarts them; in
attempt 1 rank 1 starts 8 s late, as a heavy import would. With torch's rendezvous store shared
between torchrun and the workers (torch 2.13's default), attempt 1 fails (``Gloo connectFullMesh failed
... Connection refused``) or waits until torchrun is killed; with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``
both ranks print ``done``::

    timeout 120 uv run python -m torch.distributed.run --standalone --nproc-per-node=2 --max-restarts=1 \
        benchmarks/torchrun_restart_race.py
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 uv run python -m torch.distributed.run --standalone \
        --nproc-per-node=2 --max-restarts=1 benchmarks/torchrun_restart_race.py

Results: benchmarks/RESULTS.md, "Issue 34" (the torchrun restart)."""

import datetime
import os
import sys
import time

import torch.distributed as dist

attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if attempt == "1" and os.environ["RANK"] == "1":
    time.sleep(8)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
print(
    "rank",
    dist.get_rank(),
    "attempt",
    attempt,
    "joined",
    {k: v for k, v in os.environ.items() if k == "TORCHELASTIC_USE_AGENT_STORE"},
    flush=True,
)
dist.barrier()
if attempt == "0":
    sys.exit(143)
print("done", dist.get_rank(), flush=True)
