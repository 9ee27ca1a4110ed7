"""``KILL_AT_STEP=k python -m tests._killed_train <train.py overrides>``: train.py that SIGKILLs its whole
process group (every DDP rank and loader worker: a node lost, a ``kill -9``) when rank 0
finishes optimiser step k, before that step's own checkpoint could be written (Lightning
runs checkpoint callbacks after the others), so the run loses the work since its last one.

A real kill, not an exception: nothing after it runs (no ``finally``, no ``atexit``, no
flush). Lightning's DDP launcher restarts this same module for the other ranks
(``python -m tests._killed_train ...``, same environment); only rank 0 kills. Start it with
``start_new_session=True`` so that the group is the run's alone.
"""

from __future__ import annotations

import os
import signal

from lightning.pytorch.callbacks import Callback


class KillAtStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.is_global_zero and trainer.global_step == self.step:
            os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> None:
    from hvp_lightning.cli import train
    from hvp_lightning.training import driver as driver

    step, callbacks = int(os.environ["KILL_AT_STEP"]), driver.analysis_callbacks
    driver.analysis_callbacks = lambda *args: [*callbacks(*args), KillAtStep(step)]  # the run's other callbacks
    train()


if __name__ == "__main__":
    main()
