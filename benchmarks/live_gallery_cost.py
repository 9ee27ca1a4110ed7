"""What the live W&B gallery (``hvp_lightning.analysis.live.LiveGallery``) costs against training.

Runs the README's main job with ``+hvp=on`` and an offline W&B logger, with a k-NN pass (and so a
gallery upload) after every epoch -- the worst case; the default is every 5 epochs -- and reports
the seconds spent in the callback's hooks against the training epochs' wall time, measured in the
same process. Usage (from the repository root):

    uv run python benchmarks/live_gallery_cost.py --epochs 2 [--override KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import lightning as L

import hvp_lightning.training.driver as train_mod
from hvp_lightning.analysis.live import LiveGallery, live_gallery_callbacks


class EpochClock(L.Callback):
    """Wall time of the training epochs alone: epoch start to its last batch's end (the k-NN pass
    after it, which Lightning runs before ``on_train_epoch_end``, is left out)."""

    def __init__(self) -> None:
        self.seconds, self._start = 0.0, 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == trainer.num_training_batches - 1:
            self.seconds += time.perf_counter() - self._start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--override", nargs="*", default=[])
    args = ap.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    from hydra import compose, initialize_config_dir

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "+hvp=on",
                "logger=wandb",
                f"trainer.max_epochs={args.epochs}",
                "eval.every_n_epochs=1",
                "eval.at_start=false",
                "+trainer.enable_progress_bar=false",
                *args.override,
            ],
        )
    made: list[L.Callback] = []

    def with_clock(c):  # the run's own callbacks, plus the epoch clock; keeps the gallery for reading
        cbs = live_gallery_callbacks(c)
        made.extend([*cbs, EpochClock()])
        return made

    train_mod.live_gallery_callbacks = with_clock
    with tempfile.TemporaryDirectory() as d:
        train_mod.run(cfg, Path(d))
    (gallery,) = [c for c in made if isinstance(c, LiveGallery)]
    (clock,) = [c for c in made if isinstance(c, EpochClock)]
    share = 100 * gallery.seconds / clock.seconds
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"overrides: {' '.join(args.override) or '-'}"
    )
    print(
        f"training epochs: {args.epochs}, {clock.seconds:.2f} s; gallery callback: {gallery.seconds:.3f} s "
        f"({share:.2f}% of the epochs' time, one upload per epoch)"
    )


if __name__ == "__main__":
    main()
