"""Training-loader throughput of another checkout (A, e.g. main before a change) against this
one (B), in one process, interleaved A, B, B, A, ... so that a loaded machine's drift hits both
alike (a benchmark, not a test).

A's ``hvp_lightning`` is copied under the package name ``hvp_base`` (its modules import each
other relatively), so both versions load side by side. Each arm builds the training views as
``train.py`` does on the CPU (Hydra config from its own ``conf/``, ``SSLDataModule``, colour in
the workers) and times ``--batches`` batches after ``--warmup`` with fresh loader workers
(``benchmarks/loader.py``'s ``timed_batches``). The last line is the median of the per-pair
ratios B/A.

    git worktree add /tmp/base main
    uv run python benchmarks/loader_ab.py --base /tmp/base --rounds 6
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from torch.utils.data import DataLoader

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from loader import timed_batches  # noqa: E402


def arm(package: str, conf: Path, args: argparse.Namespace) -> tuple[DataLoader, Callable[[Any], Any]]:
    """The training loader of ``package`` (``hvp_lightning`` or ``hvp_base``) as train.py builds it on CPU."""
    datamodule = importlib.import_module(f"{package}.data.datamodule")
    methods = importlib.import_module(f"{package}.methods")
    overrides = [
        "data=synthetic",
        f"data.image_size={args.image_size}",
        f"data.train_size={args.images}",
        f"method={args.method}",
        f"data.crop_size={args.crop}",
        f"data.num_workers={args.workers}",
        f"method.batch_size={args.batch_size}",
        "logger=csv",
        "trainer=cpu",
    ]
    if args.views > 2:
        overrides += ["+hvp=on", f"hvp.num_views={args.views}"]
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    dm = datamodule.SSLDataModule(
        cfg.data,
        methods.METHODS[cfg.method.name].view_augs(cfg),
        args.batch_size,
        args.workers,
        cfg.seed,
        colour_in_workers=True,
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    fresh = DataLoader(
        loader.dataset,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=args.workers,
        collate_fn=loader.collate_fn,
    )
    return fresh, lambda b: dm.on_after_batch_transfer(b, 0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", type=Path, required=True, help="the other checkout (A)")
    p.add_argument("--method", default="simsiam")
    p.add_argument("--images", type=int, default=640)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--crop", type=int, default=32)
    p.add_argument("--views", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6, help="A/B pairs (order alternates: A B, B A, ...)")
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="loader_ab_"))
    shutil.copytree(args.base / "hvp_lightning", tmp / "hvp_base")
    sys.path.insert(0, str(tmp))
    arms = {"A": arm("hvp_base", args.base / "conf", args), "B": arm("hvp_lightning", REPO / "conf", args)}
    device = torch.device("cpu")
    ratios = []
    for r in range(args.rounds):
        rate = {}
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            loader, finish = arms[side]
            rate[side] = timed_batches(loader, finish, device, args.warmup, args.batches)
        ratios.append(rate["B"] / rate["A"])
        print(f"pair {r + 1}: A {rate['A']:.1f} B {rate['B']:.1f} images/s, B/A {ratios[-1]:.3f}", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"B/A median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}, "
        f"{len(ratios)} pairs)"
    )


if __name__ == "__main__":
    main()
