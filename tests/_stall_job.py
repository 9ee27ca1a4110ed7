"""``STALL_AT_STEP=k STALL_RANK=r STALL_MARKER=<file> python -m tests._stall_job <train.py overrides>``:
train.py whose rank r, at the start of the training batch after optimiser step k, writes its pid to
the marker file and stops itself (SIGSTOP): a rank frozen mid-training, as a hung node or a
debugger would leave it. The other ranks go on until they wait for it in a collective.

Lightning's DDP launcher starts the other ranks as ``python -m tests._stall_job ...`` again, with
the same environment: each installs the same hook, and only rank r stops.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any


def main() -> None:
    # Ctrl-C as in a terminal: a process started in the background by a non-interactive shell
    # (`cmd &`, nohup: how a CI runner may start the suite) inherits SIGINT ignored, and Python
    # then installs no SIGINT handler at all, so the SIGINT test would send a signal nobody sees.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import lightning as L

    from hvp_lightning.cli import train
    from hvp_lightning.training import driver as driver

    step, rank, marker = (
        int(os.environ["STALL_AT_STEP"]),
        int(os.environ["STALL_RANK"]),
        Path(os.environ["STALL_MARKER"]),
    )

    class Stall(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step == step and trainer.global_rank == rank:
                marker.write_text(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGSTOP)

    callbacks = driver.analysis_callbacks
    driver.analysis_callbacks = lambda *args: [*callbacks(*args), Stall()]  # the run's other callbacks too
    train()


if __name__ == "__main__":
    main()
