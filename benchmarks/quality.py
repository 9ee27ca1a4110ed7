"""Does HVP help here? Baseline vs HVP arms x seeds, pretrained with identical settings.

    uv run python benchmarks/quality.py --scale cpu                 # 75 runs: 5 methods x 5 arms x 3 seeds
    uv run python benchmarks/quality.py --scale gpu --jobs 1        # 90 runs (SimSiam too): full CIFAR-10, 100 epochs
    uv run python benchmarks/quality.py --scale cpu --report-only --results benchmarks/RESULTS.md

Every run is ``train.py`` with the scale's common overrides, the method, the seed and the
arm's HVP keys, nothing else (the report checks the saved configs for that). Runs go to
``<out>/<method>/<arm>/seed<k>``; a run with a ``summary.json`` is skipped, one with
``checkpoints/last.ckpt`` continues where it stopped (train.py resumes it), so the benchmark can
run as a series of short jobs: call the same command again (``--time-budget-min`` stops it
cleanly before a job's wall-clock limit). Each finished run then gets a linear probe on frozen
features (``eval.py protocol=linear protocol.augment=false``).

The report (``<out>/report.md``, ``quality.json``, ``knn_curves.png``) gives per arm the mean and
standard deviation over seeds of the final k-NN (k=20, T=0.07) and linear top-1, and the
difference to the baseline paired by seed with a 95% t-interval, plus the k-NN curves per epoch
(mean and min-max band over seeds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CIFAR = "data.mean=[0.4914,0.4822,0.4465] data.std=[0.247,0.243,0.261] data/aug=cifar".split()

# Same candidates (N=4) for every HVP arm: hard vs random separates the choice from the extra views.
ARMS: dict[str, list[str]] = {
    "baseline": [],
    "hard": ["+hvp=on", "hvp.num_views=4", "hvp.mode=hard"],
    "random": ["+hvp=on", "hvp.num_views=4", "hvp.mode=random"],
    "hard_every2": ["+hvp=on", "hvp.num_views=4", "hvp.mode=hard", "hvp.every_n_steps=2"],
    "easy": ["+hvp=on", "hvp.num_views=4", "hvp.mode=easy"],
    # Compute-matched control, opt-in (``--arms ... baseline_long``): the baseline trained for the
    # scale's ``long_epochs``, about the compute of ``hard`` (an N=4 HVP step costs ~1.6x a baseline
    # step: RESULTS.md, overhead). Answers "is HVP better than simply training longer?".
    "baseline_long": [],
}
LONG_ARM = "baseline_long"
DEFAULT_ARMS = [a for a in ARMS if a != LONG_ARM]  # the equal-images-seen comparison
MIN_BASELINE_GAIN = 0.02  # a method is reported only if its baseline's k-NN gains this much over init
NO_FIGURE = "Figure: none (no method reported)"
HVP_KEYS = ("hvp",)  # the only top-level config key allowed to differ between arms
ARM_KEYS = {LONG_ARM: {"trainer.max_epochs"}}  # what else an arm may change, by design


@dataclass(frozen=True)
class Scale:
    """One benchmark size: overrides shared by every arm, per-method overrides, how to run jobs."""

    description: str
    common: list[str]
    per_method: dict[str, list[str]]
    threads_per_job: int
    jobs: int
    linear: list[str]
    long_epochs: int  # baseline_long: ~1.6 x trainer.max_epochs (equal compute with hard, N=4)


SCALES: dict[str, Scale] = {
    # 75 runs on 2 cores (5 methods x 5 arms x 3 seeds; SimSiam left out below): fixed 5k-image subset,
    # ResNet-18 (CIFAR stem) at width 8, batch 256, 12 epochs (228 optimiser steps, 58k images seen
    # per run), k-NN every epoch on a fixed 2k-image test subset with the 5k training images as bank.
    # Two 1-thread jobs at a time (measured faster than one 2-thread job for this small net).
    "cpu": Scale(
        description="CIFAR-10 5k-image train subset, 2k test subset, ResNet-18 CIFAR stem width 8, "
        "batch 256, 12 epochs, 2 jobs x 1 thread",
        common=[
            "backbone=resnet18_narrow",
            "backbone.width=8",
            "data=imagefolder",
            "data.root=../shared/datasets/cifar10",
            *CIFAR,
            "data.train_subset=5000",
            "data.test_subset=2000",
            "data.num_workers=1",
            "method.batch_size=256",
            "trainer=cpu",
            "trainer.max_epochs=12",
            "eval.every_n_epochs=1",
            "logger=csv",
            "checkpoint.every_n_epochs=null",
            "+trainer.enable_progress_bar=false",
        ],
        per_method={
            "simclr": [
                "method=simclr_cifar",
                "method.proj_hidden_dim=512",
                "method.proj_dim=128",
                "method.optimizer.warmup_epochs=2",
            ],
            # No SimSiam at this budget: its baseline ended below its own random-init k-NN in every
            # seed (RESULTS.md, 2026-11-22), so its arms could not say whether HVP helps.
            # BYOL and MoCo v3: their CIFAR presets with the heads narrowed like SimCLR's above.
            "byol": [
                "method=byol_cifar",
                "method.proj_hidden_dim=512",
                "method.proj_dim=128",
                "method.pred_hidden_dim=512",
                "method.optimizer.warmup_epochs=2",
            ],
            "mocov3": [
                "method=mocov3_cifar",
                "method.proj_hidden_dim=512",
                "method.proj_dim=128",
                "method.pred_hidden_dim=512",
                "method.optimizer.warmup_epochs=2",
            ],
            # VICReg and Barlow Twins: their CIFAR presets with the 3-layer projector narrowed from 2048 to
            # 1024 (still 16x the width-8 backbone's 64 features; these losses want a wide projector).
            "vicreg": [
                "method=vicreg_cifar",
                "method.proj_hidden_dim=1024",
                "method.proj_dim=1024",
                "method.optimizer.warmup_epochs=2",
            ],
            "barlow_twins": [
                "method=barlow_twins_cifar",
                "method.proj_hidden_dim=1024",
                "method.proj_dim=1024",
                "method.optimizer.warmup_epochs=2",
            ],
        },
        threads_per_job=1,
        jobs=2,
        linear=["protocol.epochs=100", "protocol.batch_size=256"],
        long_epochs=19,
    ),
    # The paper-like scale for one GPU: full CIFAR-10 train split, ResNet-18 CIFAR stem at full
    # width, 100 epochs, k-NN every 5 epochs on the full test split, bf16.
    "gpu": Scale(
        description="CIFAR-10 full train split (50k), full test split (10k), ResNet-18 CIFAR stem, "
        "batch 512, 100 epochs, bf16-mixed, 1 GPU",
        common=[
            "backbone=resnet18_cifar",
            "data=imagefolder",
            "data.root=../shared/datasets/cifar10",
            *CIFAR,
            "data.num_workers=8",
            "method.batch_size=512",
            "trainer=gpu",
            "trainer.max_epochs=100",
            "eval.every_n_epochs=5",
            "logger=csv",
            "checkpoint.every_n_epochs=25",
            "+trainer.enable_progress_bar=false",
        ],
        per_method={
            "simclr": ["method=simclr_cifar"],
            "simsiam": ["method=simsiam_cifar"],
            "byol": ["method=byol_cifar"],
            "mocov3": ["method=mocov3_cifar"],
            "vicreg": ["method=vicreg_cifar"],
            "barlow_twins": ["method=barlow_twins_cifar"],
        },
        threads_per_job=8,
        jobs=1,
        linear=["protocol.epochs=100", "protocol.batch_size=512", "accelerator=gpu"],
        long_epochs=160,
    ),
}


@dataclass(frozen=True)
class Job:
    method: str
    arm: str
    seed: int
    run_dir: Path

    @property
    def name(self) -> str:
        return f"{self.method}/{self.arm}/seed{self.seed}"


def plan(scale: Scale, methods: list[str], arms: list[str], seeds: list[int], out: Path) -> list[Job]:
    """Seeds outermost: a benchmark stopped early still has whole seeds of every arm to compare."""
    return [Job(m, a, s, out / m / a / f"seed{s}") for s in seeds for m in methods for a in arms]


def train_command(scale: Scale, job: Job) -> list[str]:
    common = scale.common
    if job.arm == LONG_ARM:
        common = [
            f"trainer.max_epochs={scale.long_epochs}" if o.startswith("trainer.max_epochs=") else o for o in common
        ]
    return [
        sys.executable,
        "train.py",
        *common,
        *scale.per_method[job.method],
        f"seed={job.seed}",
        *ARMS[job.arm],
        f"hydra.run.dir={job.run_dir}",
    ]


def linear_command(scale: Scale, job: Job) -> list[str]:
    return [
        sys.executable,
        "eval.py",
        "protocol=linear",
        f"ckpt={job.run_dir}",
        "protocol.augment=false",
        "progress_bar=false",
        "logger=csv",
        *scale.linear,
    ]


def _run(cmd: list[str], log: Path, threads: int, deadline: float | None) -> int:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=env)
        while proc.poll() is None:
            if deadline is not None and time.time() > deadline:
                proc.terminate()  # last.ckpt of the last finished epoch stays; the next call resumes
                proc.wait(60)
                return -15
            time.sleep(2)
        return proc.returncode


def run_job(scale: Scale, job: Job, deadline: float | None, linear: bool) -> dict[str, Any]:
    """Pretrain (or resume, or skip when done), then the linear probe. Returns timings."""
    log = job.run_dir / "benchmark.log"
    out: dict[str, Any] = {"job": job.name, "pretrain_s": 0.0, "linear_s": 0.0, "status": "ok"}
    steps = [("pretrain", train_command(scale, job), job.run_dir / "summary.json")]
    if linear:
        steps.append(("linear", linear_command(scale, job), job.run_dir / "eval" / "linear" / "eval_summary.json"))
    for name, cmd, result in steps:
        if result.is_file():
            continue
        t = time.time()
        rc = _run(cmd, log, scale.threads_per_job, deadline)
        out[f"{name}_s"] = time.time() - t
        if rc != 0:
            out["status"] = "stopped" if rc == -15 else f"{name} failed (exit {rc}, see {log})"
            break
    return out


def run_all(scale: Scale, jobs: list[Job], n_parallel: int, budget_min: float | None, linear: bool) -> None:
    deadline = time.time() + 60 * budget_min if budget_min else None
    todo = [j for j in jobs if not _done(j, linear)]
    print(
        f"{len(jobs) - len(todo)}/{len(jobs)} runs already done; running {len(todo)} with {n_parallel} "
        f"parallel job(s) x {scale.threads_per_job} thread(s)",
        flush=True,
    )
    start, finished = time.time(), 0
    with ThreadPoolExecutor(n_parallel) as pool:
        pending: set[Future] = set()
        queue = list(todo)
        while queue or pending:
            while queue and len(pending) < n_parallel and (deadline is None or time.time() < deadline):
                pending.add(pool.submit(run_job, scale, queue.pop(0), deadline, linear))
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                res = fut.result()
                finished += 1
                elapsed = time.time() - start
                eta = elapsed / finished * (len(todo) - finished)
                print(
                    f"[{finished}/{len(todo)}] {res['job']}: {res['status']} (pretrain {res['pretrain_s']:.0f} s, "
                    f"linear {res['linear_s']:.0f} s) | elapsed {elapsed / 60:.1f} min, "
                    f"ETA {eta / 60:.1f} min",
                    flush=True,
                )
    left = [j.name for j in jobs if not _done(j, linear)]
    if left:
        print(
            f"{len(left)} run(s) not finished (run the same command again to continue): {', '.join(left[:6])}"
            + (" ..." if len(left) > 6 else ""),
            flush=True,
        )


def _done(job: Job, linear: bool) -> bool:
    return (job.run_dir / "summary.json").is_file() and (
        not linear or (job.run_dir / "eval" / "linear" / "eval_summary.json").is_file()
    )


# --- report ---------------------------------------------------------------------------------
def t_interval(diffs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided t confidence interval of paired differences (n-1 degrees of freedom)."""
    from scipy import stats

    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def mean_std(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, (math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else math.nan)


def load_results(jobs: list[Job]) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """(method, arm) -> seed -> {knn, linear, curve, wall_s, config} for finished runs."""
    res: dict[tuple[str, str], dict[int, dict[str, Any]]] = defaultdict(dict)
    for j in jobs:
        f = j.run_dir / "summary.json"
        if not f.is_file():
            continue
        s = json.loads(f.read_text())
        lin = j.run_dir / "eval" / "linear" / "eval_summary.json"
        res[(j.method, j.arm)][j.seed] = {
            "knn": s["knn_top1"],
            "knn_init": s.get("knn_top1_init"),
            "wall_s": s["wall_time_s"],
            "curve": [(h["epoch"], h["top1"]) for h in s.get("knn_history", [])],
            "linear": json.loads(lin.read_text())["metrics"]["top1"] if lin.is_file() else None,
            "images_seen": s["images_seen"],
            "hvp": s.get("hvp"),
        }
    return res


def config_differences(jobs: list[Job]) -> list[str]:
    """Keys, other than hvp, seed and an arm's own ARM_KEYS, whose values differ between the runs
    of one method."""
    import yaml

    from hvp_lightning.evaluation.loggers import flatten

    problems: list[str] = []
    by_method: dict[str, list[tuple[Job, dict]]] = defaultdict(list)
    for j in jobs:
        f = j.run_dir / "config.yaml"
        if f.is_file():
            cfg = yaml.safe_load(f.read_text())
            by_method[j.method].append(
                (
                    j,
                    {
                        k: v
                        for k, v in flatten(cfg, sep=".").items()
                        if k.split(".")[0] not in (*HVP_KEYS, "seed", "resume")
                    },
                )
            )
    for method, runs in by_method.items():
        ref_job, ref = runs[0]
        for j, c in runs[1:]:
            allowed = ARM_KEYS.get(j.arm, set()) | ARM_KEYS.get(ref_job.arm, set())
            for k in sorted((set(ref) | set(c)) - allowed):
                if ref.get(k) != c.get(k):
                    problems.append(f"{method}: {k} differs ({ref_job.name}: {ref.get(k)!r}, {j.name}: {c.get(k)!r})")
    return problems


def learning_methods(res: dict, methods: list[str], min_gain: float = MIN_BASELINE_GAIN) -> tuple[list[str], list[str]]:
    """The methods whose baseline learns at this budget (seed-mean final k-NN at least
    ``min_gain`` above the seed-mean k-NN at random init), and a line for each one left out:
    comparing arms of a method that does not learn measures noise."""
    keep, notes = [], []
    for m in methods:
        runs = [r for r in res.get((m, "baseline"), {}).values() if r["knn_init"] is not None]
        if not runs:
            keep.append(m)  # nothing to judge yet
            continue
        final = sum(r["knn"] for r in runs) / len(runs)
        init = sum(r["knn_init"] for r in runs) / len(runs)
        if final - init >= min_gain:
            keep.append(m)
        else:
            notes.append(
                f"- {m}: not reported, its baseline does not learn at this budget (final k-NN "
                f"{_pct(final)}% vs {_pct(init)}% at random init, mean of {len(runs)} seeds)"
            )
    return keep, notes


def _pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.2f}"


def summary_table(
    res: dict, methods: list[str], arms: list[str], metric: str, ref: str = "baseline"
) -> tuple[list[str], dict]:
    """Markdown rows for one metric (knn or linear) and the numbers behind them; differences are
    to the ``ref`` arm, paired by seed."""
    rows = [
        f"| method | arm | seeds | {metric} top-1 % (mean ± sd) | diff to {ref}, pp (95% CI) | "
        f"per-seed % | wall min/run |",
        "|---|---|---|---|---|---|---|",
    ]
    numbers: dict[str, Any] = {}
    for m in methods:
        base = {s: r[metric] for s, r in res.get((m, ref), {}).items() if r[metric] is not None}
        for a in arms:
            runs = {s: r for s, r in res.get((m, a), {}).items() if r[metric] is not None}
            if not runs:
                continue
            vals = [runs[s][metric] for s in sorted(runs)]
            mean, sd = mean_std(vals)
            paired = [runs[s][metric] - base[s] for s in sorted(runs) if s in base]
            if a != ref and paired:
                d, lo, hi = t_interval(paired)
                diff = f"{100 * d:+.2f} ({_pct(lo)}, {_pct(hi)})" if len(paired) > 1 else f"{100 * d:+.2f} (n=1)"
            else:
                d = lo = hi = math.nan
                diff = "—"
            wall = sum(r["wall_s"] for r in runs.values()) / len(runs) / 60
            rows.append(
                f"| {m} | {a} | {len(vals)} | {_pct(mean)} ± {_pct(sd)} | {diff} | "
                f"{', '.join(_pct(v) for v in vals)} | {wall:.1f} |"
            )
            numbers[f"{m}/{a}"] = {
                "mean": mean,
                "sd": sd,
                "n": len(vals),
                "diff": d,
                "ci": [lo, hi],
                "per_seed": dict(zip(sorted(runs), vals)),
                "wall_min": wall,
            }
    return rows, numbers


def crossings(res: dict, methods: list[str], arms: list[str]) -> list[str]:
    """Per HVP arm: at which k-NN passes the seed-mean curve is at or above the baseline's."""
    lines = []
    for m in methods:
        base = _mean_curve(res.get((m, "baseline"), {}))
        for a in arms:
            # The long arm's schedule is stretched over more epochs: not comparable epoch by epoch.
            if a in ("baseline", LONG_ARM) or not base:
                continue
            cur = _mean_curve(res.get((m, a), {}))
            common = [e for e in sorted(cur) if e in base and e > 0]
            if not common:
                continue
            above = [e for e in common if cur[e] >= base[e]]
            last = common[-1]
            lines.append(
                f"- {m} {a}: at or above baseline at {len(above)}/{len(common)} epochs"
                + (f" ({', '.join(f'{e:g}' for e in above)})" if above else "")
                + f"; at epoch {last:g}: {100 * (cur[last] - base[last]):+.2f} pp"
            )
    return lines


def _mean_curve(runs: dict[int, dict[str, Any]]) -> dict[float, float]:
    """Epoch -> mean k-NN over the seeds that have that epoch (all seeds, for finished runs)."""
    by_epoch: dict[float, list[float]] = defaultdict(list)
    for r in runs.values():
        for e, v in r["curve"]:
            by_epoch[round(e, 2)].append(v)
    n = len(runs)
    return {e: sum(v) / len(v) for e, v in by_epoch.items() if len(v) == n}


def plot_curves(res: dict, methods: list[str], arms: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(methods), figsize=(6.5 * len(methods), 4.6), squeeze=False)
    colours = dict(zip(ARMS, ["black", "tab:red", "tab:blue", "tab:orange", "tab:green", "tab:gray"]))
    for ax, m in zip(axes[0], methods):
        for a in arms:
            runs = res.get((m, a), {})
            if not runs:
                continue
            by_epoch: dict[float, list[float]] = defaultdict(list)
            for r in runs.values():
                for e, v in r["curve"]:
                    by_epoch[round(e, 2)].append(100 * v)
            es = sorted(e for e in by_epoch if len(by_epoch[e]) == len(runs))
            mean = [sum(by_epoch[e]) / len(by_epoch[e]) for e in es]
            ax.plot(
                es,
                mean,
                color=colours[a],
                label=f"{a} (n={len(runs)})",
                lw=2 if a in ("baseline", "hard") else 1.3,
                ls="--" if a == LONG_ARM else "-",
            )
            if len(runs) > 1:
                ax.fill_between(
                    es,
                    [min(by_epoch[e]) for e in es],
                    [max(by_epoch[e]) for e in es],
                    color=colours[a],
                    alpha=0.15,
                    lw=0,
                )
        ax.set_title(m)
        ax.set_xlabel("epoch (0 = random init)")
        ax.set_ylabel("k-NN top-1 % (k=20, T=0.07)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}\nline: mean over seeds, band: min-max over seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine() -> str:
    """CPU model, cores, GPU (if any) and versions: what the wall times were measured on."""
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        cpu = next(
            (ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")), cpu
        )
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ", no GPU"
    return f"{cpu}, {os.cpu_count()} cores{gpu}, Python {platform.python_version()}, torch {torch.__version__}"


def report(
    scale_name: str,
    scale: Scale,
    jobs: list[Job],
    methods: list[str],
    arms: list[str],
    out: Path,
    command: str,
    png: Path | None = None,
) -> str:
    """Write report.md, quality.json and the k-NN curve figure (to ``png``, default
    ``<out>/knn_curves.png``) and return the report's markdown."""
    res = load_results(jobs)
    done = sum(len(v) for v in res.values())
    methods, left_out = learning_methods(res, methods)
    knn_rows, knn_num = summary_table(res, methods, arms, "knn")
    lin_rows, lin_num = summary_table(res, methods, arms, "linear")
    equal_compute: list[str] = []
    if LONG_ARM in arms and any(a == LONG_ARM for _, a in res):
        for metric, label, numbers_out in (("knn", "k-NN", knn_num), ("linear", "Linear probe", lin_num)):
            rows, numbers = summary_table(res, methods, [LONG_ARM, "hard"], metric, ref=LONG_ARM)
            equal_compute += [
                f"{label}: hard (as above) vs {LONG_ARM} (no HVP, {scale.long_epochs} epochs):",
                "",
                *rows,
                "",
            ]
            numbers_out.update({f"{k} vs {LONG_ARM}": v for k, v in numbers.items()})
    diffs = config_differences(jobs)
    checked = "checked: saved configs agree on every other key"
    if diffs:
        checked = "CONFIGS DIFFER: " + "; ".join(diffs[:5])
    png = png or out / "knn_curves.png"
    figure = NO_FIGURE
    if res and methods:  # matplotlib cannot draw zero panels
        plot_curves(res, methods, arms, png, f"{scale_name} scale: {scale.description}")
        figure = f"Figure: `{png.relative_to(REPO) if png.is_relative_to(REPO) else png}`"
    walls = [r["wall_s"] for v in res.values() for r in v.values()]
    inits = [r["knn_init"] for v in res.values() for r in v.values() if r["knn_init"] is not None]
    lines = [
        f"### Quality benchmark, {scale_name} scale ({time.strftime('%Y-%m-%d')})",
        "",
        f"Command: {command}  ",
        f"Machine: {machine()}  ",
        f"Setup: {scale.description}. Arms differ only in the HVP keys"
        f"{f' ({LONG_ARM}: and trainer.max_epochs={scale.long_epochs})' if LONG_ARM in arms else ''} "
        f"({checked}).  ",
        f"Runs finished: {done}/{len(jobs)}; pretraining wall time {sum(walls) / 60:.0f} min in all "
        f"(per run, including the k-NN passes: {min(walls, default=0) / 60:.1f}-"
        f"{max(walls, default=0) / 60:.1f} min).  ",
        f"k-NN at random init (same for all arms of a seed): {_pct(min(inits, default=math.nan))}-"
        f"{_pct(max(inits, default=math.nan))}%.",
        "",
        *(["Methods left out:", "", *left_out, ""] if left_out else []),
        "k-NN on the test split (final weights):",
        "",
        *knn_rows,
        "",
        "Linear probe on frozen features (centre crops, no augmentation):",
        "",
        *lin_rows,
        "",
        "Curves (seed-mean k-NN of each HVP arm vs the baseline's, per epoch):",
        "",
        *crossings(res, methods, arms),
        "",
        *(["Equal compute (differences paired by seed):", "", *equal_compute] if equal_compute else []),
        figure,
        "",
    ]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    (out / "quality.json").write_text(
        json.dumps({"knn": knn_num, "linear": lin_num, "config_differences": diffs}, indent=2, default=float)
    )
    return text


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--methods", nargs="+", default=None, help="default: every method of the scale")
    p.add_argument(
        "--arms",
        nargs="+",
        default=DEFAULT_ARMS,
        choices=list(ARMS),
        help=f"default: {' '.join(DEFAULT_ARMS)}; add {LONG_ARM} for the equal-compute control",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out", type=Path, default=None, help="default: runs/quality-<scale>")
    p.add_argument("--jobs", type=int, default=None, help="parallel runs (default: the scale's)")
    p.add_argument("--no-linear", action="store_true", help="skip the linear probes")
    p.add_argument(
        "--time-budget-min",
        type=float,
        default=None,
        help="stop (resumably) after this many minutes: for a series of short jobs",
    )
    p.add_argument("--report-only", action="store_true", help="only rebuild the report from finished runs")
    p.add_argument(
        "--results", type=Path, default=None, help="append the report to this markdown file; the figure goes beside it"
    )
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = p.parse_args(argv)
    scale = SCALES[args.scale]
    args.methods = args.methods or list(scale.per_method)
    unknown = [m for m in args.methods if m not in scale.per_method]
    if unknown:
        p.error(f"--methods {unknown} not in this scale; allowed: {sorted(scale.per_method)}")
    if "baseline" not in args.arms and (args.report_only or args.results):
        p.error("a report needs the baseline arm in --arms (differences are taken to it)")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    scale = SCALES[args.scale]
    out = (args.out or REPO / "runs" / f"quality-{args.scale}").resolve()
    jobs = plan(scale, args.methods, args.arms, args.seeds, out)
    if args.dry_run:
        for j in jobs:
            print(" ".join(train_command(scale, j)))
        return
    if not args.report_only:
        run_all(scale, jobs, args.jobs or scale.jobs, args.time_budget_min, not args.no_linear)
    if "baseline" not in args.arms:  # e.g. adding baseline_long beside a running benchmark
        print("no baseline arm: runs only; build the report with all arms and --report-only")
        return
    command = "`uv run python benchmarks/quality.py " + " ".join(argv) + "`"
    if args.report_only:  # say so: the runs themselves came from an earlier call without it
        command += " (builds this report from finished runs, which the same command trains without --report-only)"
    # With --results the figure goes beside that file (committed with it), not only into runs/.
    png = args.results.parent / f"quality_{args.scale}_knn_curves.png" if args.results else None
    text = report(args.scale, scale, jobs, args.methods, args.arms, out, command, png)
    print(text)
    if args.results:
        with args.results.open("a") as fh:
            fh.write(f"\n{text}\n")
            if NO_FIGURE not in text:
                fh.write(f"![k-NN curves, {args.scale} scale]({png.name})\n")


if __name__ == "__main__":
    main()
