"""train.py as a SLURM task runs it under hydra-submitit-launcher, pre-empted in the middle of a
step -- what tests/test_preemption.py drives.

    PREEMPT_AT_STEP=K [PREEMPT_RANK=R] python -m tests._preempt_job <train.py overrides>
        train.py, with SIGUSR2 sent to rank R's own process in the middle of the step that
        starts at global step K (after its backward, before its optimiser step);
    PREEMPT_AT_STEP=K SUBMITIT_FOLDER_UNDER_TEST=F python -m tests._preempt_job
        the same as a submitit job: ``submitit.core.submission.process_job(F)`` runs the pickled
        :class:`TrainJob` with submitit's signal handlers installed, as in every task it starts.

DDP ranks started by Lightning run this module again (``python -m tests._preempt_job ...``)
with the overrides only: they run plain train.py, and a signal for rank R > 0 is theirs.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


class TrainJob:
    """hydra-submitit-launcher's job in small: a callable with the ``checkpoint`` method that
    submitit calls to requeue it (``BaseSubmititLauncher.checkpoint``: the same call again)."""

    def __init__(self, overrides: list[str]) -> None:
        self.overrides = list(overrides)

    def __call__(self) -> None:
        sys.argv = ["train.py", *self.overrides]
        from hvp_lightning.cli import train

        train()

    def checkpoint(self) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self)


def signal_mid_step(step: int, rank: int) -> None:
    """Send SIGUSR2 to this process in the middle of global step ``step`` when it is rank ``rank``."""
    from hvp_lightning.methods.base import SSLMethod

    def on_before_optimizer_step(self: Any, optimizer: Any) -> None:
        if self.trainer.global_step == step and self.trainer.global_rank == rank:
            os.kill(os.getpid(), signal.SIGUSR2)

    SSLMethod.on_before_optimizer_step = on_before_optimizer_step  # type: ignore[method-assign]


def main() -> None:
    signal_mid_step(int(os.environ["PREEMPT_AT_STEP"]), int(os.environ.get("PREEMPT_RANK", "0")))
    folder = os.environ.get("SUBMITIT_FOLDER_UNDER_TEST")
    if folder and "LOCAL_RANK" not in os.environ:  # rank 0 of the job: submitit's task
        from submitit.core.submission import process_job

        process_job(folder)
    else:
        TrainJob(sys.argv[1:])()


if __name__ == "__main__":
    main()
