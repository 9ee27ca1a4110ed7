"""Do the label-free monitors see a real collapse? SimSiam without its stop-gradient collapses
within an epoch (Chen & He 2021, Fig. 2); with it, it does not. Both arms train on the same
unlabelled folder (``data=images``) and print RankMe, feature std x sqrt(d) and the collapse
verdict at every epoch (docs/data.md "Label-free monitors").

    uv run python benchmarks/collapse_monitor.py IMAGE_DIR [--epochs 3] [--monitor 256] [--batch 128]

The arm without stop-gradient patches ``simsiam_loss`` in the SimSiam module for this process
only (``data.num_workers=0``: the loss runs here anyway).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import torch.nn.functional as F
from hydra import compose, initialize_config_dir

import hvp_lightning.methods.simsiam as simsiam_module
from hvp_lightning.nn.health import collapse_reason
from hvp_lightning.training.driver import run

REPO = Path(__file__).resolve().parents[1]


def loss_without_stop_gradient(p1, p2, z1, z2):
    """SimSiam's loss with gradients through the targets too: the collapsing variant."""
    return -0.5 * (
        F.cosine_similarity(p1.float(), z2.float(), dim=-1) + F.cosine_similarity(p2.float(), z1.float(), dim=-1)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images", type=Path)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--monitor", type=int, default=256)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    original = simsiam_module.simsiam_loss
    for arm, loss in (("stop-gradient (SimSiam)", original), ("no stop-gradient", loss_without_stop_gradient)):
        simsiam_module.simsiam_loss = loss
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose(
                "config",
                overrides=[
                    "method=simsiam_cifar",
                    "trainer=cpu",
                    "logger=csv",
                    "data=images",
                    f"data.root={args.images}",
                    f"data.monitor_size={args.monitor}",
                    "data.num_workers=0",
                    f"method.batch_size={args.batch}",
                    f"trainer.max_epochs={args.epochs}",
                    "+trainer.enable_progress_bar=false",
                    "+trainer.enable_model_summary=false",
                ],
            )
        with tempfile.TemporaryDirectory() as run_dir:
            summary = run(cfg, run_dir)
        d = summary["monitor_dim"]
        print(f"{arm}: d={d}, n={summary['monitor_images']}")
        for h in summary["monitor_history"]:
            verdict = collapse_reason(h["rankme"], h["feature_std"], d) or "healthy"
            std = h["feature_std"] * math.sqrt(d)
            print(f"  epoch {h['epoch']:g}: RankMe {h['rankme']:.2f}, feature std {std:.4f}/sqrt(d) -> {verdict}")
    simsiam_module.simsiam_loss = original


if __name__ == "__main__":
    main()
