"""What the leave-one-out selection score of VICReg / Barlow Twins costs against the training step.

For one method, one model (the real Hydra config, ``+hvp=on``) and one random batch, times in
interleaved rounds -- step, selection, table, step, selection, table, ... -- so that the load of a
shared machine hits all three alike:

* ``step``: a baseline training step (both views, loss, backward, SGD step), HVP's selection off;
* ``selection``: the whole selection pass (``score_candidates``: N no-grad forwards of B with frozen
  BatchNorm/RNG state, plus the candidate table);
* ``table``: the leave-one-out table alone (``pair_table`` on the N x B projections of that pass).

and reports the medians and the medians of the per-round ratios selection/step and table/step
(docs/DESIGN.md, section 5). Usage, from the repository root::

    nice -n 10 uv run python benchmarks/batch_loss_score_cost.py --method vicreg --width 16 \\
        --batch-size 64 --proj-dim 2048 --rounds 8 --threads 1
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from hvp_lightning.methods import METHODS

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=["vicreg", "barlow_twins"], default="vicreg")
    p.add_argument("--width", type=int, default=16, help="backbone.width of resnet18_cifar")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--crop", type=int, default=32)
    p.add_argument("--proj-dim", type=int, default=2048, help="projector hidden and output width (D)")
    p.add_argument("--num-views", type=int, default=4, help="hvp.num_views (N)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.warmup < 0 or args.num_views < 2:
        p.error("need --rounds >= 1, --warmup >= 0, --num-views >= 2")
    return args


def build(args: argparse.Namespace):
    ov = [
        f"method={args.method}_cifar",
        "backbone=resnet18_cifar",
        f"backbone.width={args.width}",
        "data=synthetic",
        "logger=csv",
        f"method.batch_size={args.batch_size}",
        f"data.crop_size={args.crop}",
        f"method.proj_hidden_dim={args.proj_dim}",
        f"method.proj_dim={args.proj_dim}",
        "+hvp=on",
        f"hvp.num_views={args.num_views}",
    ]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=ov)
    torch.manual_seed(0)
    model = METHODS[args.method](cfg).train()
    model.log = lambda *a, **k: None  # type: ignore[method-assign]  # no Trainer attached
    return model


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build(args)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    b = args.batch_size
    views = [torch.randn(b, 3, args.crop, args.crop, generator=g) for _ in range(args.num_views)]
    batch = {"views": views, "label": torch.zeros(b, dtype=torch.long), "index": torch.arange(b)}
    pair = {**batch, "views": views[:2]}
    with torch.no_grad():
        z = torch.stack([model.forward_view(v) for v in views])

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model.ssl_step(pair, 0).backward()  # the baseline step: HVP off
        opt.step()

    def selection() -> None:
        model.score_candidates(batch)

    def table() -> None:
        with torch.no_grad():
            model.pair_table(z, (z[0], z[1]), 0)

    times: dict[str, list[float]] = {"step": [], "selection": [], "table": []}
    for r in range(args.warmup + args.rounds):
        for name, fn in (("step", step), ("selection", selection), ("table", table)):
            t0 = time.perf_counter()
            fn()
            if r >= args.warmup:
                times[name].append(time.perf_counter() - t0)
    cmd = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    print(
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC  {platform.node()}  {platform.processor() or ''}"
        f"  cpus {os.cpu_count()}  torch {torch.__version__}  threads {torch.get_num_threads()}"
        f"  load {os.getloadavg()[0]:.1f}"
    )
    print(cmd)
    for name, ts in times.items():
        print(f"{name:<10} median {statistics.median(ts):.4f} s  min {min(ts):.4f} s")
    for name in ("selection", "table"):
        ratios = [t / s for t, s in zip(times[name], times["step"])]
        print(
            f"{name}/step  median of per-round ratios {statistics.median(ratios):.3f}  "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
