"""A 2-process DDP run from shards, killed with SIGKILL mid-epoch and resumed, against the same run
uninterrupted (by hand; the tests check the same on tiny data: tests/test_determinism.py).

Converts ``--src`` (an ImageNet-layout folder, CIFAR-10 by default) into shards once, then runs
``train.py`` three times with the same overrides: straight; killed (``tests._killed_train``: the
whole process group gets SIGKILL when step ``--kill-at`` ends, before its checkpoint); resumed
(the same command in the killed run's directory). Prints the two summaries side by side and
whether the final weights are equal bit for bit; ``--out`` appends that as markdown.

    uv run python benchmarks/shards_resume.py --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvp_lightning.data.make_shards import main as make_shards  # noqa: E402

KEYS = ("steps", "train_loss", "knn_top1", "monitor_rankme", "monitor_feature_std", "skipped_images")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", type=Path, default=REPO.parent / "shared" / "datasets" / "cifar10")
    p.add_argument("--shards", type=Path, default=REPO / "benchmarks" / ".cache" / "cifar10-shards")
    p.add_argument("--images", type=int, default=1024, help="data.train_subset")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--kill-at", type=int, default=21, help="SIGKILL when this optimiser step ends")
    p.add_argument("--every", type=int, default=5, help="checkpoint.every_n_steps")
    p.add_argument("--runs", type=Path, default=REPO / "benchmarks" / ".cache" / "shards-resume")
    p.add_argument("--out", type=Path, default=None, help="append a markdown section to this file")
    return p.parse_args(argv)


def overrides(args: argparse.Namespace, pattern: str) -> list[str]:
    return [
        "method=simsiam_cifar",
        "+hvp=on",
        "hvp.num_views=4",
        "backbone.width=8",
        "data=shards",
        f'data.urls="{pattern}"',
        f"data.train_subset={args.images}",
        "data.monitor_size=256",
        f"data.eval_root={args.src}",
        "data.test_subset=1000",
        "data.num_workers=2",
        f"method.batch_size={args.batch_size}",
        f"trainer.max_epochs={args.epochs}",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        f"checkpoint.every_n_steps={args.every}",
        "eval.every_n_epochs=1",
        "logger=csv",
        "+trainer.deterministic=true",
        "+trainer.enable_progress_bar=false",
    ]


def train(cmd: list[str], run_dir: Path, env: dict[str, str] | None = None) -> tuple[int, float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [*cmd, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        start_new_session=True,
        timeout=3600,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.returncode, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not (args.src / "train").is_dir():
        raise SystemExit(f"--src {args.src}: no ImageNet-layout folder there (train/<class>/*)")
    if not (args.shards / "manifest.json").exists():
        if make_shards([str(args.src), str(args.shards), "--shard-size", "8MB"]) != 0:
            raise SystemExit("hvp-make-shards failed")
    names = sorted(p.name for p in args.shards.glob("train-*.tar"))
    pattern = f"{args.shards}/train-{{{names[0][6:-4]}..{names[-1][6:-4]}}}.tar"
    shutil.rmtree(args.runs, ignore_errors=True)
    o = overrides(args, pattern)
    straight, resumed = args.runs / "straight", args.runs / "resumed"
    _, t_straight = train([sys.executable, "train.py", *o], straight)
    code, t_killed = train(
        [sys.executable, "-m", "tests._killed_train", *o], resumed, dict(os.environ, KILL_AT_STEP=str(args.kill_at))
    )
    if code != -signal.SIGKILL:
        raise SystemExit(f"the run was not killed (exit {code}): --kill-at {args.kill_at} is past its last step")
    ckpt = torch.load(resumed / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    saved_at = ckpt["global_step"]
    _, t_resumed = train([sys.executable, "train.py", *o], resumed)

    def weights(run: Path) -> dict[str, torch.Tensor]:
        return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]

    a, b = weights(straight), weights(resumed)
    equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = (json.loads((r / "summary.json").read_text()) for r in (straight, resumed))
    rows = ["| summary.json | uninterrupted | killed and resumed |", "|---|---|---|"]
    rows += [f"| {k} | {sa.get(k)} | {sb.get(k)} |" for k in KEYS]
    rows.append(f"| final weights equal bit for bit | | {equal} |")
    head = (
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}; {len(names)} shards of {args.src.name}; killed after step {args.kill_at}, "
        f"resumed from step {saved_at}'s checkpoint; wall time straight {t_straight:.0f} s, killed "
        f"{t_killed:.0f} s, resumed {t_resumed:.0f} s"
    )
    cmd = "uv run python benchmarks/shards_resume.py " + " ".join(shlex.quote(x) for x in argv)
    text = f"{head}\n\n```bash\n{cmd}\n```\n\n" + "\n".join(rows) + "\n"
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(f"\n### shards_resume.py\n\n{text}")
    if not equal or any(sa.get(k) != sb.get(k) for k in KEYS):
        raise SystemExit("the resumed run differs from the uninterrupted one")


if __name__ == "__main__":
    main()
