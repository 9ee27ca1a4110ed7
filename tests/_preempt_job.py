"""``PREEMPT_AT_STEP=K PREEMPT_MARKER=<file> [PREEMPT_RANK=R] python -m tests._preempt_job <train.py overrides>``:
train.py whose rank R, in the middle of the step that starts at global step K (after its backward,
before its optimiser step), writes its pid to the marker file and waits there (at most 120 s) until
a SIGUSR2 from outside -- the test's ``os.kill``, as SLURM's would -- has reached it. The signal
lands in the middle of a step, at a step the test knows.

Lightning's DDP launcher starts the other ranks as ``python -m tests._preempt_job ...`` again,
with the same environment: each installs the same hook, and only rank R waits.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def wait_mid_step(step: int, rank: int, marker: Path) -> None:
    from hvp_lightning.methods.base import SSLMethod
    from hvp_lightning.training.preemption import StopOnSignal

    def on_before_optimizer_step(self: Any, optimizer: Any) -> None:
        trainer = self.trainer
        if trainer.global_step != step or trainer.global_rank != rank:
            return
        (stop,) = (c for c in trainer.callbacks if isinstance(c, StopOnSignal))
        marker.write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not stop.received and time.monotonic() < deadline:
            time.sleep(0.01)

    SSLMethod.on_before_optimizer_step = on_before_optimizer_step  # type: ignore[method-assign]


def main() -> None:
    wait_mid_step(
        int(os.environ["PREEMPT_AT_STEP"]), int(os.environ.get("PREEMPT_RANK", "0")), Path(os.environ["PREEMPT_MARKER"])
    )
    from hvp_lightning.cli import train

    train()


if __name__ == "__main__":
    main()
