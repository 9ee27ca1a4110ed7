"""Does HVP help here, and is it worth its compute? Baseline vs HVP arms x seeds, at equal images
and at equal model FLOPs.

    uv run python benchmarks/quality.py --scale cpu --methods simclr   # 50 runs: 10 arms x 5 seeds
    uv run python benchmarks/quality.py --scale gpu --methods simclr   # the same on one GPU: full CIFAR-10, 100 epochs
    uv run python benchmarks/quality.py --scale cpu --methods simclr --report-only --results benchmarks/RESULTS.md
    uv run python benchmarks/quality.py --scale saturation --jobs 1    # 30 runs out to saturation
    uv run python benchmarks/quality.py --scale saturation --data DIR --sizes 2000:100   # on your own image folder

Every run is ``train.py`` with the scale's common overrides, the method, the seed and the
arm's keys, nothing else (the report checks the saved configs for that). An arm is either a set of
HVP keys, trained for the scale's epochs (equal images), or ``baseline@<arm>``: the baseline
trained for the model FLOPs of ``<arm>``'s run of the same seed (``budget.match``, equal FLOPs;
whole epochs, within half of one). Runs go to ``<out>/<method>/<arm>/seed<k>``; a run with a
``summary.json`` is skipped, one with ``checkpoints/last.ckpt`` continues where it stopped
(train.py resumes it), so the benchmark can run as a series of short jobs: call the same command
again (``--time-budget-min`` stops it cleanly before a job's wall-clock limit). A ``baseline@``
run waits for the run it matches; one whose budget comes to the epochs of a finished baseline run
of its seed is that run (a link to its directory: the same config but for the budget keys, so
the same training). Each finished run then gets a linear probe on frozen features
(``eval.py protocol=linear protocol.augment=false``).

``baseline_x<k>`` is the baseline trained for k times the scale's epochs (its own schedule): the
ceiling of training longer, which the saturation scale compares every HVP arm with. ``--sizes N[:E]``
runs the scale on N training images (E epochs) each, under ``<out>/n<N>/``; ``--data DIR`` on your own
ImageNet-layout image folder instead of CIFAR-10; ``--set KEY=VALUE`` overrides any of the scale's keys.

The report (``<out>/report.md``, ``quality.json``, ``knn_flops.png``) gives per arm its model
FLOPs (summary.json ``cost``) against the baseline's, the mean and standard deviation over seeds
of the final k-NN (k=20, T=0.07) and linear top-1, the difference to the baseline at equal
images and to ``baseline@<arm>`` at equal FLOPs, paired by seed with 95% t-intervals, a verdict
line computed from those, and a figure: k-NN against model FLOPs (curves, and the final k-NN of
each run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CIFAR = "data.mean=[0.4914,0.4822,0.4465] data.std=[0.247,0.243,0.261] data/aug=cifar".split()

# Same candidates (N=4) for every HVP arm: hard vs random separates the choice from the extra views.
HVP4 = ["+hvp=on", "hvp.num_views=4"]
ARMS: dict[str, list[str]] = {
    "baseline": [],
    "hard": [*HVP4, "hvp.mode=hard"],
    # The cheaper selections: candidates scored at half size, a quarter of each batch
    # scored, both halved (the cheapest), and the crops' geometry alone (no selection forward).
    "scale50": [*HVP4, "hvp.mode=hard", "hvp.selection_scale=0.5"],
    "fraction25": [*HVP4, "hvp.mode=hard", "hvp.selection_fraction=0.25"],
    "scale50_fraction50": [*HVP4, "hvp.mode=hard", "hvp.selection_scale=0.5", "hvp.selection_fraction=0.5"],
    "min_iou": [*HVP4, "hvp.mode=min_iou"],
    # The paper's controls (the earlier default): uniform choice, every 2nd step, the easiest pair.
    "random": [*HVP4, "hvp.mode=random"],
    "hard_every2": [*HVP4, "hvp.mode=hard", "hvp.every_n_steps=2"],
    "easy": [*HVP4, "hvp.mode=easy"],
}
BASE = "baseline"
AT = "@"  # baseline@<arm>: the baseline trained for <arm>'s model FLOPs (budget.match)
TIMES = "_x"  # baseline_x<k>: the baseline trained for k times the scale's epochs (the ceiling of training longer)
ALL_ARMS = [*ARMS, *(f"{BASE}{AT}{a}" for a in ARMS if a != BASE)]
SELECTIONS = ["hard", "scale50", "fraction25", "scale50_fraction50"]  # the arms whose selection costs FLOPs
DEFAULT_ARMS = [BASE, *SELECTIONS, "min_iou", *(f"{BASE}{AT}{a}" for a in SELECTIONS)]
PAPER_ARMS = [BASE, "hard", "random", "hard_every2", "easy"]
TARGET_RATIO = 1.2  # the target: a selection at <= 1.2x the baseline's model FLOPs per image ...
MIN_BASELINE_GAIN = 0.02  # a method is reported only if its baseline's k-NN gains this much over init
NO_FIGURE = "Figure: none (no method reported)"
HVP_KEYS = ("hvp",)  # the only top-level config key allowed to differ between arms ...
BUDGET_KEYS = {"trainer.max_epochs", "budget.match", "budget.flops"}  # ... and these for baseline@<arm>


def matched(arm: str) -> str | None:
    """The arm whose FLOPs ``arm`` trains for (``baseline@hard`` -> ``hard``); None for an arm of keys."""
    return arm.split(AT, 1)[1] if AT in arm else None


def longer(arm: str) -> float | None:
    """The multiple of the scale's epochs ``baseline_x<k>`` trains for (``baseline_x2`` -> 2.0);
    None for any other arm."""
    if not arm.startswith(BASE + TIMES):
        return None
    try:
        k = float(arm[len(BASE + TIMES) :])
    except ValueError:
        return None
    return k if k > 0 and math.isfinite(k) else None


def longer_epochs(arm: str, epochs: int) -> int:
    """``baseline_x<k>``'s epochs at a scale of ``epochs``: the closest whole number, at least 1."""
    k = longer(arm)
    assert k is not None, arm
    return max(1, round(k * epochs))


def baseline_family(arm: str) -> bool:
    return arm == BASE or arm.startswith(BASE + AT) or longer(arm) is not None


def known_arm(arm: str) -> str:
    """argparse type of ``--arms``: an arm of keys, ``baseline@<arm of keys>`` or ``baseline_x<k>``."""
    if arm in ALL_ARMS or longer(arm) is not None:
        return arm
    raise argparse.ArgumentTypeError(
        f"unknown arm {arm!r}: one of {', '.join(ALL_ARMS)}, or baseline_x<k> (the baseline at k times the epochs)"
    )


@dataclass(frozen=True)
class Scale:
    """One benchmark size: overrides shared by every arm, per-method overrides, how to run jobs."""

    description: str
    common: list[str]
    per_method: dict[str, list[str]]
    threads_per_job: int
    jobs: int
    linear: list[str]
    arms: tuple[str, ...] = ()  # the scale's default --arms (empty: DEFAULT_ARMS)
    # (training images, epochs) per data size (--sizes): each runs under <out>/n<images>/, a figure panel each
    sizes: tuple[tuple[int, int], ...] = ()

    @property
    def epochs(self) -> int:
        """The epochs of every arm but ``baseline@<arm>`` and ``baseline_x<k>`` (which set their own)."""
        return int(option(self.common, "trainer.max_epochs"))  # type: ignore[arg-type]

    @property
    def train_images(self) -> int | None:
        value = option(self.common, "data.train_subset")
        return None if value in (None, "null") else int(value)  # type: ignore[arg-type]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def option(overrides: list[str], key: str) -> str | None:
    """The value ``overrides`` give ``key`` (the last one), or None."""
    values = [o.split("=", 1)[1] for o in overrides if "=" in o and _key(o) == key]
    return values[-1] if values else None


def set_options(overrides: list[str], *changes: str) -> list[str]:
    """``overrides`` with each ``key=value`` of ``changes`` in place of the key's own (appended where
    the key has none): Hydra refuses a key given twice."""
    out = list(overrides)
    for change in changes:
        at = [i for i, o in enumerate(out) if _key(o) == _key(change)]
        if at:
            out[at[0]] = change
            out = [o for i, o in enumerate(out) if i not in at[1:]]
        else:
            out.append(change)
    return out


def derive(
    scale: Scale, data: Path | None = None, size: int | None = None, epochs: int | None = None, extra: tuple = ()
) -> Scale:
    """The scale on other data (``--data``: an ImageNet-layout folder, with the folder's own defaults
    for normalisation and views instead of CIFAR-10's), another training-set size or epochs, and
    ``--set`` overrides (last, in place of the same keys)."""
    common, notes = list(scale.common), []
    if data is not None:
        cifar_keys = {_key(o) for o in CIFAR}
        common = set_options([o for o in common if _key(o) not in cifar_keys], f"data.root={data}")
        notes.append(f"data {data} (its own normalisation and views: data=imagefolder's defaults)")
    if size is not None:
        common = set_options(common, f"data.train_subset={size}")
        notes.append(f"{size} training images")
    if epochs is not None:
        common = set_options(common, f"trainer.max_epochs={epochs}")
        notes.append(f"{epochs} epochs")
    if extra:
        common = set_options(common, *extra)
        notes.append("overrides " + " ".join(extra))
    if not notes:
        return scale
    return replace(scale, common=common, description=f"{scale.description}; here: {', '.join(notes)}")


SATURATION_EPOCHS = 80  # the saturation scale's E at 2k images, batch 64: the pilot (benchmarks/README.md)


def cifar_subset_run(train: int, batch: int, epochs: int, eval_every: int) -> list[str]:
    """The CPU scales' common overrides: the width-8 CIFAR-stem ResNet-18 on a fixed subset of
    ``train`` CIFAR-10 images (k-NN on a fixed 2k test subset), one loader worker, CSV logs."""
    return [
        "backbone=resnet18_narrow",
        "backbone.width=8",
        "data=imagefolder",
        "data.root=../shared/datasets/cifar10",
        *CIFAR,
        f"data.train_subset={train}",
        "data.test_subset=2000",
        "data.num_workers=1",
        f"method.batch_size={batch}",
        "trainer=cpu",
        f"trainer.max_epochs={epochs}",
        f"eval.every_n_epochs={eval_every}",
        "logger=csv",
        "checkpoint.every_n_epochs=null",
        "+trainer.enable_progress_bar=false",
    ]


SCALES: dict[str, Scale] = {
    # 75 runs on 2 cores (5 methods x 5 arms x 3 seeds; SimSiam left out below): fixed 5k-image subset,
    # ResNet-18 (CIFAR stem) at width 8, batch 256, 12 epochs (228 optimiser steps, 58k images seen
    # per run), k-NN every epoch on a fixed 2k-image test subset with the 5k training images as bank.
    # Two 1-thread jobs at a time (measured faster than one 2-thread job for this small net).
    "cpu": Scale(
        description="CIFAR-10 5k-image train subset, 2k test subset, ResNet-18 CIFAR stem width 8, "
        "batch 256, 12 epochs, 1 thread per run",
        common=cifar_subset_run(train=5000, batch=256, epochs=12, eval_every=1),
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
    ),
    # Out to saturation: does HVP pay where training longer stops paying? The cpu scale's
    # network and SimCLR on a fixed 2k-image subset (the few thousand images of a user pretraining on
    # their own data), batch 64 (31 steps an epoch), for E epochs, E from a pilot (benchmarks/README.md):
    # the baseline's last quarter adds less than 1 k-NN point. Arms: the baseline at E and at 2E (the
    # ceiling of training longer), HVP at E against the baseline at its FLOPs, and the cheapest
    # selection within 1.2x the baseline's FLOPs against its own. k-NN every 5 epochs.
    "saturation": Scale(
        description=f"CIFAR-10 2k-image train subset, 2k test subset, ResNet-18 CIFAR stem width 8, "
        f"batch 64, {SATURATION_EPOCHS} epochs (the pilot's baseline: its last quarter adds < 1 k-NN point), "
        "k-NN every 5 epochs, 1 thread per run",
        common=cifar_subset_run(train=2000, batch=64, epochs=SATURATION_EPOCHS, eval_every=5),
        per_method={
            "simclr": [
                "method=simclr_cifar",
                "method.proj_hidden_dim=512",
                "method.proj_dim=128",
                "method.optimizer.warmup_epochs=10",
            ],
        },
        threads_per_job=1,
        jobs=1,
        linear=["protocol.epochs=100", "protocol.batch_size=256"],
        arms=(
            BASE,
            "hard",
            "scale50_fraction50",
            f"{BASE}{TIMES}2",
            f"{BASE}{AT}hard",
            f"{BASE}{AT}scale50_fraction50",
        ),
        sizes=((2000, SATURATION_EPOCHS),),
    ),
    # The paper-like scale for one GPU: full CIFAR-10 train split, ResNet-18 CIFAR stem at full
    # width, 100 epochs, k-NN every 5 epochs on the full test split, bf16. The training images are
    # held on the GPU and the views cut and coloured there (data.on_device): 4 candidate views of
    # 50k images an epoch would keep 16 CPU cores' loader workers behind the GPU.
    "gpu": Scale(
        description="CIFAR-10 full train split (50k, held on the GPU), full test split (10k), ResNet-18 CIFAR "
        "stem, batch 512, 100 epochs, bf16-mixed, 1 GPU",
        common=[
            "backbone=resnet18_cifar",
            "data=imagefolder",
            "data.root=../shared/datasets/cifar10",
            *CIFAR,
            "data.on_device=true",
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

    @property
    def matched_dir(self) -> Path | None:
        """The run a ``baseline@<arm>`` job trains for the FLOPs of: ``<arm>``'s, same method and seed."""
        other = matched(self.arm)
        return None if other is None else self.run_dir.parent.parent / other / self.run_dir.name


def plan(scale: Scale, methods: list[str], arms: list[str], seeds: list[int], out: Path) -> list[Job]:
    """Seeds outermost: a benchmark stopped early still has whole seeds of every arm to compare;
    within a seed the ``baseline@<arm>`` runs last (each waits for the run it matches)."""
    ordered = sorted(arms, key=lambda a: matched(a) is not None)
    return [Job(m, a, s, out / m / a / f"seed{s}") for s in seeds for m in methods for a in ordered]


def train_command(scale: Scale, job: Job) -> list[str]:
    common = scale.common
    if job.matched_dir is not None:
        keys = [f"budget.match={job.matched_dir}"]
    elif longer(job.arm) is not None:  # the baseline's command with its own epochs
        keys, common = [], set_options(common, f"trainer.max_epochs={longer_epochs(job.arm, scale.epochs)}")
    else:
        keys = ARMS[job.arm]
    return [
        sys.executable,
        "train.py",
        *common,
        *scale.per_method[job.method],
        f"seed={job.seed}",
        *keys,
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


def _descendants_cpu(root: int, seen: dict[tuple[int, int], float]) -> None:
    """Records in ``seen`` ((pid, start time) -> CPU seconds) the user + system time so far of each
    live process below ``root`` (Linux ``/proc``; elsewhere nothing): the loader workers and their
    fork server, which ``root`` never waits for, so ``wait4`` does not count them."""
    if not Path("/proc/self/stat").is_file():
        return
    tick, children, stats = os.sysconf("SC_CLK_TCK"), defaultdict(list), {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        children[int(fields[1])].append(int(name))
        stats[int(name)] = (int(fields[19]), (int(fields[11]) + int(fields[12])) / tick)
    stack = list(children[root])
    while stack:
        pid = stack.pop()
        stack += children[pid]
        start, cpu = stats[pid]
        seen[(pid, start)] = cpu


def _run(cmd: list[str], log: Path, threads: int, deadline: float | None) -> tuple[int, float]:
    """Runs ``cmd`` (its output to ``log``) until it ends or ``deadline``; returns its exit status
    (-15: stopped at the deadline) and the CPU seconds it took: its own and those of the processes
    it waited for (``wait4``), plus every other process below it as last seen, sampled every second
    (:func:`_descendants_cpu`; a process's last second before it ends can be missed)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=env)
        stopped, below = False, {}
        while True:
            _descendants_cpu(proc.pid, below)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if not stopped and deadline is not None and time.time() > deadline:
                proc.terminate()  # last.ckpt of the last finished epoch stays; the next call resumes
                stopped = True
            time.sleep(1)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        return (-15 if stopped else proc.returncode), usage.ru_utime + usage.ru_stime + sum(below.values())


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
        rc, cpu = _run(cmd, log, scale.threads_per_job, deadline)
        out[f"{name}_s"] = time.time() - t
        with (job.run_dir / TIMES_FILE).open("a") as fh:  # every session of the run: the sweep's CPU-hours
            line = {"step": name, "wall_s": round(out[f"{name}_s"], 2), "cpu_s": round(cpu, 2),
                    "threads": scale.threads_per_job, "exit": rc, "end": round(time.time())}  # fmt: skip
            fh.write(json.dumps(line) + "\n")
        if rc != 0:
            out["status"] = "stopped" if rc == -15 else f"{name} failed (exit {rc}, see {log})"
            break
    return out


# Per run, one line per train.py or eval.py session this script ran: wall and CPU seconds (the
# process and those it waited for), threads, exit status. The report's CPU-hours add them up.
TIMES_FILE = "benchmark_times.jsonl"


def _done(job: Job, linear: bool) -> bool:
    return (job.run_dir / "summary.json").is_file() and (
        not linear or (job.run_dir / "eval" / "linear" / "eval_summary.json").is_file()
    )


def budget_epochs(matched_run: Path) -> int:
    """The epochs ``budget.match=<matched_run>`` gives the baseline, counted as
    ``hvp_lightning.training.budget`` counts them: the whole epochs whose model FLOPs come closest
    to that run's ``cost.total_flops`` (a tie: the fewer), a baseline epoch costing
    ``baseline_flops_per_image`` for each of the matched run's images per epoch."""
    from hvp_lightning.training.budget import closest_count

    s = json.loads((matched_run / "summary.json").read_text())
    cost = s["cost"]
    per_epoch = cost["baseline_flops_per_image"] * cost["images"] // s["epochs"]
    return closest_count(float(cost["total_flops"]), lambda e: e * per_epoch)


Slot = tuple[str, int, int]  # (method, seed, epochs) of a baseline-family run: one training


def _slot(scale: Scale, job: Job) -> Slot | None:
    """What a baseline-family job trains: None for the other arms, and for a ``baseline@`` job
    whose matched run is not finished (it waits)."""
    if job.arm == BASE:
        return job.method, job.seed, scale.epochs
    if longer(job.arm) is not None:
        return job.method, job.seed, longer_epochs(job.arm, scale.epochs)
    if job.matched_dir is None or not (job.matched_dir / "summary.json").is_file():
        return None
    return job.method, job.seed, budget_epochs(job.matched_dir)


def _same_run(job: Job, slot: Slot, linear: bool) -> Path | None:
    """A finished (not linked) baseline-family run of the job's method and seed with the slot's epochs."""
    for arm_dir in sorted(job.run_dir.parent.parent.iterdir()):
        run = arm_dir / job.run_dir.name
        if arm_dir.name == job.arm or not baseline_family(arm_dir.name) or run.is_symlink():
            continue
        other = Job(job.method, arm_dir.name, job.seed, run)
        if _done(other, linear) and json.loads((run / "summary.json").read_text())["epochs"] == slot[2]:
            return run
    return None


def next_job(scale: Scale, queue: list[Job], busy: set[Slot], linear: bool) -> tuple[Job, Slot | None] | None:
    """The first job of ``queue`` that can start (removed from it), and its slot; a ``baseline@``
    job whose epochs a finished baseline run of its seed has becomes a link to it instead (and the
    search goes on); one whose matched run is unfinished, or whose slot a running job trains, waits."""
    for job in list(queue):
        if job.matched_dir is not None and not (job.matched_dir / "summary.json").is_file():
            continue
        slot = _slot(scale, job)
        if slot is not None and slot in busy:
            continue
        queue.remove(job)
        if job.matched_dir is not None and not job.run_dir.exists() and slot is not None:
            same = _same_run(job, slot, linear)
            if same is not None:
                job.run_dir.parent.mkdir(parents=True, exist_ok=True)
                job.run_dir.symlink_to(os.path.relpath(same, job.run_dir.parent), target_is_directory=True)
                print(f"{job.name}: {slot[2]} epochs, the run of {same.parent.name} (linked)", flush=True)
                continue
        return job, slot
    return None


def run_all(scale: Scale, jobs: list[Job], n_parallel: int, budget_min: float | None, linear: bool, out: Path) -> None:
    """Runs the unfinished jobs, ``n_parallel`` at a time, each as soon as it can start
    (:func:`next_job`); the load average goes to ``<out>/load.tsv`` every minute, for the report."""
    deadline = time.time() + 60 * budget_min if budget_min else None
    todo = [j for j in jobs if not _done(j, linear)]
    print(
        f"{len(jobs) - len(todo)}/{len(jobs)} runs already done; running {len(todo)} with {n_parallel} "
        f"parallel job(s) x {scale.threads_per_job} thread(s)",
        flush=True,
    )
    out.mkdir(parents=True, exist_ok=True)
    start, finished, queue = time.time(), 0, list(todo)
    running: dict[Future, Slot | None] = {}
    with ThreadPoolExecutor(n_parallel) as pool, (out / "load.tsv").open("a") as load:
        while True:
            while len(running) < n_parallel and (deadline is None or time.time() < deadline):
                picked = next_job(scale, queue, {s for s in running.values() if s}, linear)
                if picked is None:
                    break
                running[pool.submit(run_job, scale, picked[0], deadline, linear)] = picked[1]
            if not running:
                break
            done, _ = wait(running, timeout=60, return_when=FIRST_COMPLETED)
            load.write(f"{time.time():.0f}\t{os.getloadavg()[0]:.2f}\t{len(running)}\n")
            load.flush()
            for fut in done:
                del running[fut]
                res = fut.result()
                finished += 1
                elapsed = time.time() - start
                eta = elapsed / finished * (len(todo) - finished)
                print(
                    f"[{finished}/{len(todo)}] {res['job']}: {res['status']} (pretrain {res['pretrain_s']:.0f} s, "
                    f"linear {res['linear_s']:.0f} s) | elapsed {elapsed / 60:.1f} min, "
                    f"ETA {eta / 60:.1f} min (at most: links take none)",
                    flush=True,
                )
    left = [j.name for j in jobs if not _done(j, linear)]
    if left:
        print(
            f"{len(left)} run(s) not finished (run the same command again to continue): {', '.join(left[:6])}"
            + (" ..." if len(left) > 6 else ""),
            flush=True,
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


Results = dict[tuple[str, str], dict[int, dict[str, Any]]]


def load_results(jobs: list[Job]) -> Results:
    """(method, arm) -> seed -> {knn, linear, curve, wall_s, cost, ...} for finished runs."""
    res: Results = defaultdict(dict)
    for j in jobs:
        f = j.run_dir / "summary.json"
        if not f.is_file():
            continue
        s = json.loads(f.read_text())
        lin = j.run_dir / "eval" / "linear" / "eval_summary.json"
        cost = s.get("cost") or {}
        flops = cost.get("total_flops")
        res[(j.method, j.arm)][j.seed] = {
            "knn": s["knn_top1"],
            "knn_init": s.get("knn_top1_init"),
            "wall_s": s["wall_time_s"],
            "curve": [(h["epoch"], h["top1"]) for h in s.get("knn_history", [])],
            "linear": json.loads(lin.read_text())["metrics"]["top1"] if lin.is_file() else None,
            "images_seen": s["images_seen"],
            "epochs": s.get("epochs"),
            "hvp": s.get("hvp"),
            "flops": flops,
            # model FLOPs per image over the run, in units of the baseline step's (1 = the baseline)
            "per_image": flops / cost["images"] if flops else None,
            "ratio": flops / cost["images"] / cost["baseline_flops_per_image"] if flops else None,
            "train_per_image": cost.get("train_flops_per_image"),
            "selection_per_image": cost.get("selection_flops_per_image"),
            "images_per_s": cost.get("images_per_s"),
            "linked": j.run_dir.is_symlink(),
            "times": _times(j.run_dir),
        }
    return res


def _times(run_dir: Path) -> dict[str, float] | None:
    """Wall and CPU seconds of the sessions this script ran for a run (:data:`TIMES_FILE`), per step
    (``pretrain_wall``, ``pretrain_cpu``, ``linear_wall``, ``linear_cpu``); None without that file
    (a run trained before it was written)."""
    f = run_dir / TIMES_FILE
    if not f.is_file():
        return None
    out = {f"{step}_{kind}": 0.0 for step in ("pretrain", "linear") for kind in ("wall", "cpu")}
    for line in f.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out[f"{r['step']}_wall"] += r["wall_s"]
            out[f"{r['step']}_cpu"] += r["cpu_s"]
    return out


def config_differences(jobs: list[Job]) -> list[str]:
    """Keys, other than hvp, seed and (for ``baseline@<arm>`` and ``baseline_x<k>``) the budget's and
    the epochs, whose values differ between the runs of one method."""
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
            own_epochs = [a for a in (j.arm, ref_job.arm) if matched(a) or longer(a) is not None]
            allowed = BUDGET_KEYS if own_epochs else set()
            for k in sorted((set(ref) | set(c)) - allowed):
                if ref.get(k) != c.get(k):
                    problems.append(f"{method}: {k} differs ({ref_job.name}: {ref.get(k)!r}, {j.name}: {c.get(k)!r})")
    return problems


def learning_methods(res: Results, methods: list[str]) -> tuple[list[str], list[str]]:
    """The methods whose baseline learns at this budget (seed-mean final k-NN at least
    MIN_BASELINE_GAIN above the seed-mean k-NN at random init), and a line for each one left out:
    comparing arms of a method that does not learn measures noise."""
    keep, notes, min_gain = [], [], MIN_BASELINE_GAIN
    for m in methods:
        runs = [r for r in res.get((m, BASE), {}).values() if r["knn_init"] is not None]
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


def _pct(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.2f}"


def _diff(d: float, lo: float, hi: float, n: int) -> str:
    return f"{100 * d:+.2f} ({_pct(lo)}, {_pct(hi)})" if n > 1 else f"{100 * d:+.2f} (n=1)"


def _values(res: Results, m: str, a: str, metric: str) -> dict[int, float]:
    return {s: r[metric] for s, r in res.get((m, a), {}).items() if r[metric] is not None}


def paired(res: Results, m: str, arm: str, ref: str, metric: str) -> dict[str, Any] | None:
    """``arm`` minus ``ref`` over the seeds both have: mean, 95% t-interval, per-seed differences."""
    a, b = _values(res, m, arm, metric), _values(res, m, ref, metric)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    diffs = [a[s] - b[s] for s in seeds]
    d, lo, hi = t_interval(diffs)
    return {"diff": d, "ci": [lo, hi], "n": len(seeds), "per_seed": dict(zip(seeds, diffs))}


def summary_table(res: Results, methods: list[str], arms: list[str], metric: str) -> tuple[list[str], dict]:
    """Markdown rows for one metric (knn or linear) at equal images: each arm against the
    baseline, paired by seed."""
    rows = [
        f"| method | arm | seeds | {metric} top-1 % (mean ± sd) | diff to baseline, pp (95% CI) | "
        f"per-seed % | wall min/run |",
        "|---|---|---|---|---|---|---|",
    ]
    numbers: dict[str, Any] = {}
    for m in methods:
        for a in arms:
            runs = _values(res, m, a, metric)
            if not runs:
                continue
            vals = [runs[s] for s in sorted(runs)]
            mean, sd = mean_std(vals)
            pair = paired(res, m, a, BASE, metric) if a != BASE else None
            diff = _diff(pair["diff"], *pair["ci"], pair["n"]) if pair else "—"
            own = [r for r in res[(m, a)].values() if not r["linked"]]
            wall = sum(r["wall_s"] for r in own) / len(own) / 60 if own else math.nan
            rows.append(
                f"| {m} | {a} | {len(vals)} | {_pct(mean)} ± {_pct(sd)} | {diff} | "
                f"{', '.join(_pct(v) for v in vals)} | {wall:.1f} |"
            )
            numbers[f"{m}/{a}"] = {
                "mean": mean,
                "sd": sd,
                "n": len(vals),
                "diff": pair["diff"] if pair else math.nan,
                "ci": pair["ci"] if pair else [math.nan, math.nan],
                "per_seed": dict(zip(sorted(runs), vals)),
                "wall_min": wall,
            }
    return rows, numbers


def _mean(res: Results, m: str, a: str, key: str) -> float:
    xs = [r[key] for r in res.get((m, a), {}).values() if r[key] is not None]
    return sum(xs) / len(xs) if xs else math.nan


def cost_table(res: Results, methods: list[str], arms: list[str]) -> tuple[list[str], dict]:
    """Per arm: epochs, model FLOPs per image (train + selection, from summary.json ``cost``),
    their mean over the run against the baseline step's (``x baseline/image``), the run's total
    against the baseline arm's, whether the arm is within the target, images/s, wall time."""
    rows = [
        "| method | arm | seeds | epochs | train + selection MFLOPs/image | x baseline/image | total FLOPs | "
        f"x baseline total | <= {TARGET_RATIO}x | images/s | wall min/run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    numbers: dict[str, Any] = {}
    for m in methods:
        base_total = _mean(res, m, BASE, "flops")
        for a in arms:
            runs = res.get((m, a), {})
            if not runs:
                continue
            ratio, total = _mean(res, m, a, "ratio"), _mean(res, m, a, "flops")
            epochs = sorted({r["epochs"] for r in runs.values()})
            within = "—" if baseline_family(a) else ("yes" if ratio <= TARGET_RATIO else "no")
            own = [r for r in runs.values() if not r["linked"]]
            wall = sum(r["wall_s"] for r in own) / len(own) / 60 if own else math.nan
            linked = len(runs) - len(own)
            train, select = (_mean(res, m, a, k) / 1e6 for k in ("train_per_image", "selection_per_image"))
            rows.append(
                f"| {m} | {a} | {len(runs)} | {', '.join(map(str, epochs))} | {train:.1f} + {select:.1f} | "
                f"{ratio:.3f} | {total:.4g} | {total / base_total:.3f} | {within} | "
                f"{_mean(res, m, a, 'images_per_s'):.0f} | {wall:.1f}{f' ({linked} linked)' if linked else ''} |"
            )
            numbers[f"{m}/{a}"] = {"ratio_per_image": ratio, "total_flops": total, "ratio_total": total / base_total,
                                   "epochs": epochs, "within_target": within == "yes"}  # fmt: skip
    return rows, numbers


def equal_flops_ref(res: Results, m: str, arm: str) -> str | None:
    """The run that had ``arm``'s model FLOPs: ``baseline@<arm>``, or the baseline itself where the
    arm's selection costs none (``min_iou``, ``random``: equal images are equal FLOPs)."""
    if (m, f"{BASE}{AT}{arm}") in res:
        return f"{BASE}{AT}{arm}"
    runs = res.get((m, arm), {}).values()
    if runs and all(r["selection_per_image"] == 0 for r in runs):
        return BASE
    return None


def equal_flops_table(res: Results, methods: list[str], arms: list[str], metric: str) -> tuple[list[str], dict]:
    """Each arm against the baseline run that had its model FLOPs (:func:`equal_flops_ref`),
    paired by seed; the achieved FLOPs ratio per seed (whole epochs: within half of one)."""
    rows = [
        f"| method | arm | x baseline/image | against | its FLOPs / arm's | arm {metric} % | against, {metric} % | "
        "diff, pp (95% CI) | per-seed diff, pp |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    numbers: dict[str, Any] = {}
    for m in methods:
        for a in arms:
            ref = None if baseline_family(a) else equal_flops_ref(res, m, a)
            pair = paired(res, m, a, ref, metric) if ref else None
            if pair is None:
                continue
            seeds = list(pair["per_seed"])
            achieved = [res[(m, ref)][s]["flops"] / res[(m, a)][s]["flops"] for s in seeds]  # type: ignore[index]
            arm_v, ref_v = _values(res, m, a, metric), _values(res, m, ref, metric)  # type: ignore[arg-type]
            arm_mean, arm_sd = mean_std([arm_v[s] for s in seeds])
            ref_mean, ref_sd = mean_std([ref_v[s] for s in seeds])
            rows.append(
                f"| {m} | {a} | {_mean(res, m, a, 'ratio'):.3f} | {ref} | "
                f"{min(achieved):.3f}{f'-{max(achieved):.3f}' if max(achieved) > min(achieved) else ''} | "
                f"{_pct(arm_mean)} ± {_pct(arm_sd)} | {_pct(ref_mean)} ± {_pct(ref_sd)} | "
                f"{_diff(pair['diff'], *pair['ci'], pair['n'])} | "
                f"{', '.join(f'{100 * d:+.2f}' for d in pair['per_seed'].values())} |"
            )
            numbers[f"{m}/{a}"] = {**pair, "against": ref, "achieved_flops_ratio": achieved,
                                   "ratio_per_image": _mean(res, m, a, "ratio")}  # fmt: skip
    return rows, numbers


def verdict(numbers: dict[str, Any], method: str, label: str = "k-NN") -> str:
    """One line from the equal-FLOPs comparisons of ``method``: does a selection at <= TARGET_RATIO
    times the baseline's model FLOPs per image beat the baseline at equal FLOPs (95% interval
    above 0)? Names those that do, or the best one that does not; then the arms above the target."""
    rows = {k.split("/", 1)[1]: v for k, v in numbers.items() if k.split("/", 1)[0] == method}
    cheap = {a: v for a, v in rows.items() if v["ratio_per_image"] <= TARGET_RATIO}
    dear = {a: v for a, v in rows.items() if v["ratio_per_image"] > TARGET_RATIO}

    def say(a: str, v: dict[str, Any]) -> str:
        return f"{a} ({v['ratio_per_image']:.2f}x) {_diff(v['diff'], *v['ci'], v['n'])} pp"

    head = f"Verdict, {method}, {label} at equal FLOPs"
    if not cheap:
        line = f"{head}: no arm at <= {TARGET_RATIO}x the baseline's model FLOPs per image has finished"
    elif wins := [a for a, v in cheap.items() if v["n"] > 1 and v["ci"][0] > 0]:
        line = f"{head}: above the baseline (95% CI above 0) at <= {TARGET_RATIO}x its model FLOPs per image: " + (
            "; ".join(say(a, cheap[a]) for a in wins)
        )
    else:
        best = max(cheap, key=lambda a: cheap[a]["diff"])
        line = (
            f"{head}: no selection at <= {TARGET_RATIO}x the baseline's model FLOPs per image is above the baseline "
            f"(none has its 95% CI above 0); best: {say(best, cheap[best])}"
        )
    if dear:
        line += f". Above {TARGET_RATIO}x: " + "; ".join(say(a, v) for a, v in dear.items())
    return line + "."


def crossings(res: Results, methods: list[str], arms: list[str]) -> list[str]:
    """Per arm at the scale's epochs: at which k-NN passes the seed-mean curve is at or above the baseline's."""
    lines = []
    for m in methods:
        base = _mean_curve(res.get((m, BASE), {}))
        for a in arms:
            if baseline_family(a) or not base:  # a budget's schedule is stretched: not comparable by epoch
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


def last_quarter(run: dict[str, Any]) -> float | None:
    """The k-NN a run gained in its last quarter: at its end minus at the evaluated epoch closest to
    3/4 of its epochs (the pilot's criterion for saturation: under 1 point). None without that pass."""
    curve = dict(run["curve"])
    if not run["epochs"] or not curve:
        return None
    end = max(curve)
    target = 0.75 * run["epochs"]
    near = min((e for e in curve if 0 < e < end), key=lambda e: abs(e - target), default=None)
    if near is None or abs(near - target) > 0.1 * run["epochs"]:
        return None
    return curve[end] - curve[near]


def _baselines(res: Results, m: str, arms: list[str]) -> list[str]:
    """The baseline-family arms of ``m`` with finished runs, by their runs' mean epochs."""
    have = [a for a in arms if baseline_family(a) and res.get((m, a))]
    return sorted(have, key=lambda a: (_mean(res, m, a, "epochs"), a))


def length_table(res: Results, methods: list[str], arms: list[str], metric: str) -> tuple[list[str], dict]:
    """The baseline at each length measured (E, the budgets of the HVP arms, ``baseline_x<k>``):
    its epochs, FLOPs against the baseline's, the metric, its difference to the baseline at E paired
    by seed, and (k-NN) what its own last quarter added."""
    rows = [
        f"| method | baseline | seeds | epochs | x baseline FLOPs | {metric} top-1 % (mean ± sd) | "
        "diff to baseline, pp (95% CI) | last quarter adds, pp (95% CI) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    numbers: dict[str, Any] = {}
    for m in methods:
        base_total = _mean(res, m, BASE, "flops")
        for a in _baselines(res, m, arms):
            vals = _values(res, m, a, metric)
            if not vals:
                continue
            mean, sd = mean_std([vals[s] for s in sorted(vals)])
            pair = paired(res, m, a, BASE, metric) if a != BASE else None
            quarters = [q for q in map(last_quarter, res[(m, a)].values()) if q is not None]
            quarter = t_interval(quarters) if quarters and metric == "knn" else None
            epochs = sorted({r["epochs"] for r in res[(m, a)].values()})
            rows.append(
                f"| {m} | {a} | {len(vals)} | {', '.join(map(str, epochs))} | "
                f"{_mean(res, m, a, 'flops') / base_total:.3f} | {_pct(mean)} ± {_pct(sd)} | "
                f"{_diff(pair['diff'], *pair['ci'], pair['n']) if pair else '—'} | "
                f"{_diff(*quarter, len(quarters)) if quarter else '—'} |"
            )
            numbers[f"{m}/{a}"] = {
                "epochs": epochs,
                "flops_ratio": _mean(res, m, a, "flops") / base_total,
                "mean": mean,
                "sd": sd,
                "diff": pair["diff"] if pair else math.nan,
                "ci": pair["ci"] if pair else [math.nan, math.nan],
                "last_quarter": quarter[0] if quarter else None,
                "last_quarter_ci": list(quarter[1:]) if quarter else None,
            }
    return rows, numbers


def ceiling_table(res: Results, methods: list[str], arms: list[str], metric: str) -> tuple[list[str], dict]:
    """Each HVP arm against the ceiling: the baseline of any length measured with the highest mean
    (chosen after the fact, so the test is against the luckiest baseline), paired by seed."""
    rows = [
        f"| method | arm | x baseline FLOPs | ceiling | its epochs | its x baseline FLOPs | arm {metric} % | "
        f"ceiling {metric} % | diff, pp (95% CI) | per-seed diff, pp |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    numbers: dict[str, Any] = {}
    for m in methods:
        base_total = _mean(res, m, BASE, "flops")
        means = {a: statistics.fmean(v.values()) for a in _baselines(res, m, arms) if (v := _values(res, m, a, metric))}
        if len(means) < 2:
            continue
        top = max(means, key=lambda a: means[a])
        for a in arms:
            pair = None if baseline_family(a) else paired(res, m, a, top, metric)
            if pair is None:
                continue
            seeds = list(pair["per_seed"])
            arm_v, top_v = _values(res, m, a, metric), _values(res, m, top, metric)
            arm_mean, arm_sd = mean_std([arm_v[s] for s in seeds])
            top_mean, top_sd = mean_std([top_v[s] for s in seeds])
            epochs = sorted({r["epochs"] for r in res[(m, top)].values()})
            rows.append(
                f"| {m} | {a} | {_mean(res, m, a, 'flops') / base_total:.3f} | {top} | {', '.join(map(str, epochs))} | "
                f"{_mean(res, m, top, 'flops') / base_total:.3f} | {_pct(arm_mean)} ± {_pct(arm_sd)} | "
                f"{_pct(top_mean)} ± {_pct(top_sd)} | {_diff(pair['diff'], *pair['ci'], pair['n'])} | "
                f"{', '.join(f'{100 * d:+.2f}' for d in pair['per_seed'].values())} |"
            )
            numbers[f"{m}/{a}"] = {**pair, "ceiling": top, "ceiling_epochs": epochs}
    return rows, numbers


def ceiling_verdict(numbers: dict[str, Any], method: str, label: str = "k-NN") -> str | None:
    """One line: does any HVP arm end above the best baseline of any length (95% interval above 0)?"""
    rows = {k.split("/", 1)[1]: v for k, v in numbers.items() if k.split("/", 1)[0] == method}
    if not rows:
        return None
    top = next(iter(rows.values()))["ceiling"]
    head = f"Ceiling, {method}, {label}: against the best baseline of any length measured ({top})"
    wins = [a for a, v in rows.items() if v["n"] > 1 and v["ci"][0] > 0]
    if wins:
        return (
            f"{head}, above it (95% CI above 0): "
            + "; ".join(f"{a} {_diff(rows[a]['diff'], *rows[a]['ci'], rows[a]['n'])} pp" for a in wins)
            + "."
        )
    best = max(rows, key=lambda a: rows[a]["diff"])
    v = rows[best]
    best_diff = _diff(v["diff"], *v["ci"], v["n"])
    return f"{head}, no HVP arm is above it (none has its 95% CI above 0); best: {best} {best_diff} pp."


def saturation_line(res: Results, methods: list[str]) -> list[str]:
    """The pilot's criterion on the baseline at the scale's epochs (what its last quarter added) and,
    where a ``baseline_x<k>`` ran, the stronger test: what a whole schedule k times as long added.
    A cosine schedule's last quarter adds little at any length (its lr is near 0 there), so only the
    second says whether training longer has stopped paying."""
    lines = []
    for m in methods:
        quarters = [q for q in map(last_quarter, res.get((m, BASE), {}).values()) if q is not None]
        if not quarters:
            continue
        d, lo, hi = t_interval(quarters)
        epochs = max(r["epochs"] for r in res[(m, BASE)].values())
        ok = "under 1 point: saturated by the criterion" if d < 0.01 else "1 point or more: NOT saturated, train longer"
        line = (
            f"- {m}: the baseline's last quarter (epochs {round(0.75 * epochs)}-{epochs}) adds "
            f"{_diff(d, lo, hi, len(quarters))} pp k-NN over {len(quarters)} seed(s): {ok}"
        )
        longest = max((a for (mm, a) in res if mm == m and longer(a) is not None), key=longer, default=None)
        pair = paired(res, m, longest, BASE, "knn") if longest else None
        if pair:
            lo2 = pair["ci"][0]
            pays = (
                "training longer still pays (its interval is above 0)"
                if pair["n"] > 1 and lo2 > 0
                else "no gain shown from training longer (its interval reaches 0)"
            )
            line += (
                f"; a whole schedule {longer(longest):g}x as long (`{longest}`) adds "
                f"{_diff(pair['diff'], *pair['ci'], pair['n'])} pp: {pays}"
            )
        lines.append(line)
    return lines


def hours_table(res: Results, methods: list[str], arms: list[str], threads: int) -> tuple[list[str], dict]:
    """What the runs took: per arm the runs trained (links take none), wall hours of pretraining and
    linear probes, thread-hours (wall x threads per run) and the CPU hours measured (the processes'
    own and those they waited for: :data:`TIMES_FILE`)."""
    rows = [
        "| method | arm | runs trained | pretraining h | linear probe h | thread-h | CPU h (measured) | wall min/run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    numbers: dict[str, Any] = {}
    total = defaultdict(float)
    for m in methods:
        for a in arms:
            own = [r for r in res.get((m, a), {}).values() if not r["linked"]]
            if not own:
                continue
            t = {"pretrain_wall": 0.0, "linear_wall": 0.0, "cpu": 0.0}
            measured = all(r["times"] for r in own)
            for r in own:
                times = r["times"] or {}
                t["pretrain_wall"] += times.get("pretrain_wall") or r["wall_s"]
                t["linear_wall"] += times.get("linear_wall", 0.0)
                t["cpu"] += times.get("pretrain_cpu", 0.0) + times.get("linear_cpu", 0.0)
            wall = t["pretrain_wall"] + t["linear_wall"]
            for k, v in (*t.items(), ("runs", len(own)), ("wall", wall)):
                total[k] += v
            total["unmeasured"] += not measured
            rows.append(
                f"| {m} | {a} | {len(own)} | {t['pretrain_wall'] / 3600:.2f} | {t['linear_wall'] / 3600:.2f} | "
                f"{wall * threads / 3600:.2f} | {'%.2f' % (t['cpu'] / 3600) if measured else 'n/a'} | "
                f"{wall / len(own) / 60:.1f} |"
            )
            numbers[f"{m}/{a}"] = {"runs": len(own), **t, "wall": wall, "cpu_measured": measured}
    if total["runs"]:
        rows.append(
            f"| all | | {total['runs']:.0f} | {total['pretrain_wall'] / 3600:.2f} | "
            f"{total['linear_wall'] / 3600:.2f} | {total['wall'] * threads / 3600:.2f} | "
            f"{total['cpu'] / 3600:.2f}{' (some n/a)' if total['unmeasured'] else ''} | "
            f"{total['wall'] / total['runs'] / 60:.1f} |"
        )
    numbers["all"] = dict(total)
    return rows, numbers


def arm_styles(arms: list[str]) -> dict[str, dict[str, Any]]:
    """A colour per arm of keys (the baseline black); ``baseline@<arm>`` takes its arm's colour,
    dashed, with open markers."""
    keyed = [a for a in arms if not baseline_family(a)]
    colour = {BASE: "black", **{a: f"C{i % 10}" for i, a in enumerate(keyed)}}
    styles = {}
    for a in arms:
        other = matched(a)
        c = colour.get(other or a, "gray")
        styles[a] = {"color": c, "ls": "--" if other else "-", "marker": "s" if other else "o", "open": bool(other)}
        if longer(a) is not None:  # the baseline trained longer: black, dotted
            styles[a] = {"color": "black", "ls": ":", "marker": "^", "open": True}
    return styles


def plot_flops(res: Results, methods: list[str], arms: list[str], path: Path, title: str) -> None:
    """Per method, two panels: the seed-mean k-NN curve of each arm against the model FLOPs trained
    so far (an epoch's share of the run's total), and the final k-NN of every run against its total
    FLOPs with each arm's mean and 95% t-interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = arm_styles(arms)
    fig, axes = plt.subplots(len(methods), 2, figsize=(13, 4.8 * len(methods)), squeeze=False)
    for (ax_c, ax_f), m in zip(axes, methods):
        for a in arms:
            runs = res.get((m, a), {})
            runs = {s: r for s, r in runs.items() if r["flops"]}
            if not runs:
                continue
            st = styles[a]
            curve = _mean_curve(runs)
            total, epochs = _mean(res, m, a, "flops"), max(r["epochs"] for r in runs.values())
            es = sorted(curve)
            ax_c.plot([total * e / epochs for e in es], [100 * curve[e] for e in es], color=st["color"], ls=st["ls"],
                      lw=1.8 if a in (BASE, "hard") else 1.2, label=f"{a} (n={len(runs)})")  # fmt: skip
            xs = [r["flops"] for r in runs.values()]
            ys = [100 * r["knn"] for r in runs.values()]
            face = "none" if st["open"] else st["color"]
            ax_f.scatter(xs, ys, s=14, facecolors=face, edgecolors=st["color"], marker=st["marker"], alpha=0.5)
            mean, lo, hi = t_interval(ys) if len(ys) > 1 else (ys[0], ys[0], ys[0])
            ax_f.errorbar([sum(xs) / len(xs)], [mean], yerr=[[mean - lo], [hi - mean]], color=st["color"],
                          marker=st["marker"], mfc=face, ms=7, capsize=4, label=a)  # fmt: skip
        base_total = _mean(res, m, BASE, "flops")
        if not math.isnan(base_total):
            ax_f.axvline(TARGET_RATIO * base_total, color="gray", ls=":", lw=1, label=f"{TARGET_RATIO}x the baseline's")
        for ax in (ax_c, ax_f):
            ax.set_xlabel("model FLOPs trained (summary.json cost.total_flops)")
            ax.set_ylabel("k-NN top-1 % (k=20, T=0.07)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        ax_c.set_title(f"{m}: k-NN during training (mean over seeds)")
        ax_f.set_title(f"{m}: final k-NN per run; mean and 95% t-interval per arm")
    legend = "dashed, open: the baseline trained for that arm's FLOPs (budget.match)"
    fig.suptitle(f"{textwrap.fill(title, suptitle_chars(fig, 10))}\n{legend}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def suptitle_chars(fig: Any, fontsize: float) -> int:
    """How many characters of a ``fontsize`` title fit the figure's width (an average glyph is about
    0.55 em): a longer title is wrapped, not cut at the figure's edges."""
    return max(40, int(fig.get_figwidth() * 72 / (0.55 * fontsize)) - 4)


def band_curve(runs: dict[int, dict[str, Any]]) -> list[tuple[float, float, float, float]]:
    """(model FLOPs, mean, min, max of k-NN over seeds) at each evaluated epoch that every seed's run
    has, and at the runs' ends (whose epochs may differ by one between seeds: ``budget.match``); an
    epoch's FLOPs are its share of its run's total."""
    runs = {s: r for s, r in runs.items() if r["flops"] and r["curve"] and r["epochs"]}
    if not runs:
        return []
    per_seed = {s: {round(e, 2): (r["flops"] * e / r["epochs"], v) for e, v in r["curve"]} for s, r in runs.items()}
    ends = {s: max(c) for s, c in per_seed.items()}
    common = set.intersection(*(set(c) for c in per_seed.values()))
    points = []
    for key in [*sorted(e for e in common if all(e < end for end in ends.values())), None]:
        at = [per_seed[s][ends[s] if key is None else key] for s in per_seed]
        ys = [v for _, v in at]
        points.append((statistics.fmean(x for x, _ in at), statistics.fmean(ys), min(ys), max(ys)))
    return points


def plot_bands(panels: list[tuple[str, Results]], methods: list[str], arms: list[str], path: Path, title: str) -> None:
    """k-NN against model FLOPs: a panel per data size (column) and method (row), a line per arm
    (its seed mean) with its seed band (min to max over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = arm_styles(arms)
    fig, axes = plt.subplots(len(methods), len(panels), figsize=(7 * len(panels), 5 * len(methods)), squeeze=False)
    for row, m in zip(axes, methods):
        for ax, (label, res) in zip(row, panels):
            for a in arms:
                points = band_curve(res.get((m, a), {}))
                if not points:
                    continue
                st, n = styles[a], len(res[(m, a)])
                xs, mean, lo, hi = zip(*points)
                lw = 1.8 if a in (BASE, "hard") else 1.3
                ax.plot(xs, [100 * y for y in mean], color=st["color"], ls=st["ls"], lw=lw, label=f"{a} (n={n})")
                ax.fill_between(xs, [100 * y for y in lo], [100 * y for y in hi], color=st["color"], alpha=0.12, lw=0)
                ax.plot(xs[-1:], [100 * mean[-1]], marker=st["marker"], color=st["color"],
                        mfc="none" if st["open"] else st["color"], ms=6)  # fmt: skip
            ax.set_xlabel("model FLOPs trained (summary.json cost.total_flops)")
            ax.set_ylabel("k-NN top-1 % (k=20, T=0.07)")
            ax.set_title(f"{m}, {label}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower right")
    legend = "line: mean over seeds; band: min to max over seeds; marker: the run's end"
    fig.suptitle(f"{textwrap.fill(title, suptitle_chars(fig, 9))}\n{legend}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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


def load_line(out: Path) -> str:
    """The 1-minute load average sampled while the runs trained (``<out>/load.tsv``, every call's)."""
    f = out / "load.tsv"
    rows = [line.split("\t") for line in f.read_text().splitlines() if line.strip()] if f.is_file() else []
    if not rows:
        return "Load: not recorded (no runs trained by this script's calls in this folder)."
    loads, jobs = [float(r[1]) for r in rows], sorted({int(r[2]) for r in rows})
    days = sorted({time.strftime("%Y-%m-%d %H:%M", time.gmtime(int(r[0]))) for r in (rows[0], rows[-1])})
    return (
        f"Load average (1 min) while training, sampled every minute ({len(loads)} samples, {' to '.join(days)} UTC, "
        f"{'/'.join(map(str, jobs))} run(s) at a time): median {statistics.median(loads):.2f}, "
        f"{min(loads):.2f}-{max(loads):.2f}."
    )


def report(
    scale_name: str,
    scale: Scale,
    jobs: list[Job],
    methods: list[str],
    arms: list[str],
    out: Path,
    command: str,
    png: Path | None = None,
    heading: str = "",
) -> str:
    """Write report.md, quality.json and the figure (to ``png``, default ``<out>/knn_flops.png``)
    and return the report's markdown (``heading``: after the scale in its title, e.g. the data size)."""
    res = load_results(jobs)
    done = sum(len(v) for v in res.values())
    methods, left_out = learning_methods(res, methods)
    keyed = [a for a in arms if not matched(a) and longer(a) is None]
    cost_rows, cost_num = cost_table(res, methods, arms)
    sections: list[str] = []
    numbers: dict[str, Any] = {"cost": cost_num}
    verdicts: list[str] = []
    for metric, label in (("knn", "k-NN"), ("linear", "Linear probe")):
        rows, num = summary_table(res, methods, keyed, metric)
        frows, fnum = equal_flops_table(res, methods, keyed, metric)
        numbers[metric], numbers[f"{metric}_equal_flops"] = num, fnum
        sections += [
            f"{label}, equal images (every arm {scale.epochs} epochs; differences to the baseline, paired by seed):",
            "",
            *rows,
            "",
        ]
        if len(frows) > 2:
            sections += [
                f"{label}, equal model FLOPs (each arm against the baseline trained for its run's FLOPs, "
                f"`baseline@<arm>`, or the baseline itself where the selection costs none; paired by seed):",
                "",
                *frows,
                "",
            ]
            verdicts += [verdict(fnum, m, label) for m in methods]
        if any(longer(a) is not None for a in arms):  # the baseline trained longer: the ceiling
            lrows, lnum = length_table(res, methods, arms, metric)
            crows, cnum = ceiling_table(res, methods, arms, metric)
            numbers[f"{metric}_lengths"], numbers[f"{metric}_ceiling"] = lnum, cnum
            sections += [
                f"{label}, the baseline at each length measured (its own schedule over its epochs; differences "
                "to the baseline at the scale's epochs, paired by seed):",
                "",
                *lrows,
                "",
            ]
            if len(crows) > 2:
                sections += [
                    f"{label}, each arm against the ceiling: the baseline of any length with the highest mean "
                    "(paired by seed):",
                    "",
                    *crows,
                    "",
                ]
                verdicts += [v for m in methods if (v := ceiling_verdict(cnum, m, label))]
    hrows, hnum = hours_table(res, methods, arms, scale.threads_per_job)
    numbers["hours"] = hnum
    saturation = saturation_line(res, methods)
    diffs = config_differences(jobs)
    checked = "checked: saved configs agree on every other key"
    if diffs:
        checked = "CONFIGS DIFFER: " + "; ".join(diffs[:5])
    png = png or out / "knn_flops.png"
    figure = NO_FIGURE
    if any(r["flops"] for v in res.values() for r in v.values()) and methods:  # matplotlib cannot draw zero panels
        plot_flops(res, methods, arms, png, f"{scale_name} scale: {scale.description}")
        figure = f"Figure: `{png.relative_to(REPO) if png.is_relative_to(REPO) else png}`"
    own = [r for v in res.values() for r in v.values() if not r["linked"]]
    walls = [r["wall_s"] for r in own]
    inits = [r["knn_init"] for r in own if r["knn_init"] is not None]
    linked = [f"{m}/{a}/seed{s}" for (m, a), v in res.items() for s, r in v.items() if r["linked"]]
    lines = [
        f"### Quality benchmark, {scale_name} scale{heading} ({time.strftime('%Y-%m-%d')})",
        "",
        f"Command: {command}  ",
        f"Machine: {machine()}  ",
        f"Setup: {scale.description}. Arms differ only in the HVP keys, `baseline@<arm>` only in "
        f"`budget.match` and the epochs it sets, `baseline_x<k>` only in its epochs ({checked}).  ",
        f"Runs finished: {done}/{len(jobs)}"
        + (f", {len(linked)} of them a link to a baseline run of the same epochs" if linked else "")
        + f"; pretraining wall time {sum(walls) / 60:.0f} min in all (per run, including the k-NN passes: "
        f"{min(walls, default=0) / 60:.1f}-{max(walls, default=0) / 60:.1f} min).  ",
        f"{load_line(out)}  ",
        f"k-NN at random init (same for all arms of a seed): {_pct(min(inits, default=math.nan))}-"
        f"{_pct(max(inits, default=math.nan))}%.",
        "",
        *(["Methods left out:", "", *left_out, ""] if left_out else []),
        f"Model FLOPs (summary.json `cost`; x baseline/image: the run's FLOPs per image over the baseline step's, "
        f"the target is <= {TARGET_RATIO}x):",
        "",
        *cost_rows,
        "",
        *sections,
        *(
            [
                "Saturation (the pilot's criterion: under 1 k-NN point in the baseline's last quarter):",
                "",
                *saturation,
                "",
            ]
            if saturation
            else []
        ),  # fmt: skip
        f"Time (wall: one run's own sessions of train.py and eval.py; {scale.threads_per_job} thread(s) per run):",
        "",
        *hrows,
        "",
        "Curves (seed-mean k-NN of each arm vs the baseline's, per epoch, at equal images):",
        "",
        *crossings(res, methods, keyed),
        "",
        *[f"**{v}**" for v in verdicts],
        *([""] if verdicts else []),
        figure,
        "",
    ]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    numbers.update(verdicts=verdicts, config_differences=diffs)
    (out / "quality.json").write_text(json.dumps(numbers, indent=2, default=float))
    return text


def size_arg(text: str) -> tuple[int, int | None]:
    """``--sizes``' ``N`` or ``N:E``: training images, and their epochs if given."""
    try:
        n, _, e = text.partition(":")
        size, epochs = int(n), (int(e) if e else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a size is N or N:E (training images, epochs)") from None
    if size < 1 or (epochs is not None and epochs < 1):
        raise argparse.ArgumentTypeError(f"{text!r}: images and epochs are at least 1")
    return size, epochs


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=sorted(SCALES), default="cpu")
    p.add_argument("--methods", nargs="+", default=None, help="default: every method of the scale")
    p.add_argument(
        "--arms",
        nargs="+",
        default=None,
        type=known_arm,
        metavar="ARM",
        help=f"default: the scale's (saturation: {' '.join(SCALES['saturation'].arms)}), else "
        f"{' '.join(DEFAULT_ARMS)}; the paper's controls: {' '.join(PAPER_ARMS)}; baseline@<arm>: the baseline "
        f"for <arm>'s FLOPs; baseline_x<k>: the baseline for k times the epochs. Arms: {', '.join(ARMS)}",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    p.add_argument("--out", type=Path, default=None, help="default: runs/quality-<scale>[-<data folder name>]")
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="your own labelled image folder (ImageNet layout: train/<class>/*, test/<class>/* or val/) in place "
        "of CIFAR-10, with the folder defaults' normalisation and views (data=imagefolder)",
    )
    p.add_argument(
        "--sizes",
        nargs="+",
        type=size_arg,
        default=None,
        metavar="N[:E]",
        help="training-set sizes (data.train_subset), each with its epochs E (default: the scale's for that size, "
        "or --epochs, or the scale's epochs); runs under <out>/n<N>/, a figure panel each "
        "(default: the scale's sizes, saturation: 2000)",
    )
    p.add_argument("--epochs", type=int, default=None, help="the scale's epochs (E) instead of its own")
    p.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="train.py overrides in place of the scale's (e.g. data.crop_size=64 data/aug=cifar)",  # fmt: skip
    )
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
    p.add_argument("--dry-run", action="store_true", help="print the commands and the model FLOPs of each arm's run")
    args = p.parse_args(argv)
    scale = SCALES[args.scale]
    args.methods = args.methods or list(scale.per_method)
    unknown = [m for m in args.methods if m not in scale.per_method]
    if unknown:
        p.error(f"--methods {unknown} not in this scale; allowed: {sorted(scale.per_method)}")
    args.arms = args.arms or list(scale.arms or DEFAULT_ARMS)
    if any("=" not in o for o in args.set):
        p.error(f"--set takes KEY=VALUE overrides, not {[o for o in args.set if '=' not in o]}")
    if BASE not in args.arms and (args.report_only or args.results):
        p.error("a report needs the baseline arm in --arms (differences are taken to it)")
    return args


def planned_flops(scale: Scale, job: Job) -> tuple[float, float]:
    """Model FLOPs of a job's run before it trains, as train.py counts them (meta device): per image
    over the run in units of the baseline step's, and in all. A ``baseline@<arm>`` job: its arm's."""
    from hydra import compose, initialize_config_dir

    from hvp_lightning.config import check_options
    from hvp_lightning.run.perf import StepFlops
    from hvp_lightning.training.budget import epoch_of, run_flops
    from hvp_lightning.training.cost import count_step_flops

    arm = matched(job.arm) or job.arm
    overrides = train_command(scale, Job(job.method, arm, job.seed, job.run_dir))[2:]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[o for o in overrides if not o.startswith("hydra.")])
    with contextlib.chdir(REPO):  # the data root is relative to the repository, as train.py runs
        cfg = check_options(cfg)  # resolves data.crop_size=auto from the images
    flops: StepFlops = count_step_flops(cfg)
    d = cfg.data  # the scales' training sets: a subset, the built-in textures, or CIFAR-10's train split
    images = d.train_subset or (d.train_size if d.name == "synthetic" else CIFAR10_TRAIN)
    found = folder_images(d.root) if d.name == "imagefolder" else None
    if found is not None:  # --data: a subset of at most what is there
        images = min(int(images), found)
    epoch = epoch_of(int(images), cfg.method.batch_size, 1)
    every = cfg.hvp.every_n_steps if cfg.hvp is not None else 1
    epochs = cfg.trainer.max_epochs  # the scale's, or baseline_x<k>'s own
    total = run_flops(epochs, flops, epoch, every)
    return total / (epochs * epoch.steps * epoch.step_images) / flops.baseline, float(total)


CIFAR10_TRAIN = 50_000  # the train split's images, where a scale trains on all of them


def folder_images(root: str) -> int | None:
    """The files under an image folder's ``train/`` (a folder other than the shared CIFAR-10 copy:
    ``--data``), None for that copy (the scales' subsets are smaller than its train split)."""
    path = (REPO / root).resolve()
    if path == (REPO / "../shared/datasets/cifar10").resolve() or not (path / "train").is_dir():
        return None
    return sum(1 for f in (path / "train").rglob("*") if f.is_file())


def dry_run(scale: Scale, jobs: list[Job]) -> None:
    """The train.py commands, then each arm's planned model FLOPs per run (seeds do not change them)
    and the plan's total: with a measured rate (summary.json ``cost.model_flops_per_s``), its time."""
    for j in jobs:
        print(" ".join(train_command(scale, j)))
    from hvp_lightning.errors import ConfigError

    per_arm, total = {}, 0.0
    for j in jobs:
        key = (j.method, j.arm)
        if key not in per_arm:
            try:
                per_arm[key] = planned_flops(scale, j)
            except ConfigError as err:  # e.g. the data not here yet: the commands are what matters
                print(f"\nmodel FLOPs not counted: {err}")
                return
        total += per_arm[key][1]
    print("\nplanned model FLOPs per run (baseline@<arm>: about its arm's, within half an epoch):")
    for (m, a), (ratio, flops) in per_arm.items():
        unit = (
            "the baseline run's total: the baseline step, trained longer"
            if matched(a)
            else "the baseline step per image"
        )
        print(f"  {m} {a}: {flops:.4g} ({ratio:.3f}x {unit})")
    print(f"all {len(jobs)} runs: {total:.4g} model FLOPs (k-NN passes and linear probes not counted)")


@dataclass(frozen=True)
class Setting:
    """One data size of a call: its scale (``derive``d), run folder and label."""

    size: int | None
    scale: Scale
    out: Path

    @property
    def label(self) -> str:
        images = self.size or self.scale.train_images
        return f"{images} training images, {self.scale.epochs} epochs" if images else f"{self.scale.epochs} epochs"


def settings(args: argparse.Namespace) -> tuple[Path, list[Setting]]:
    """The call's run folder and its settings: one per ``--sizes`` entry (or the scale's sizes), each
    in ``<out>/n<N>/``; without sizes the scale itself in ``<out>``."""
    scale = SCALES[args.scale]
    data = args.data.resolve() if args.data else None
    name = f"quality-{args.scale}" + (f"-{data.name}" if data else "")
    out = (args.out or REPO / "runs" / name).resolve()
    own = dict(scale.sizes)
    sizes = args.sizes or [(n, None) for n in own]
    extra = tuple(args.set)
    if not sizes:
        return out, [Setting(None, derive(scale, data, None, args.epochs, extra), out)]
    return out, [
        Setting(n, derive(scale, data, n, e or args.epochs or own.get(n) or scale.epochs, extra), out / f"n{n}")
        for n, e in sizes
    ]


def sizes_report(
    scale_name: str, parts: list[tuple[Setting, str]], methods: list[str], arms: list[str], seeds: list[int],
    out: Path, command: str, png: Path | None = None,
) -> str:  # fmt: skip
    """Each size's report under one heading, the figure with a panel per size (``<out>/knn_flops.png``
    or ``png``) and the CPU-hours of all of them; written to ``<out>/report.md``."""
    results = [(st, load_results(plan(st.scale, methods, arms, seeds, st.out))) for st, _ in parts]
    learning = [m for m in methods if all(m in learning_methods(res, [m])[0] for _, res in results)]
    png = png or out / "knn_flops.png"
    figure = NO_FIGURE
    if learning and any(r["flops"] for _, res in results for v in res.values() for r in v.values()):
        title = f"{scale_name} scale: {parts[0][0].scale.description}"
        plot_bands([(st.label, res) for st, res in results], learning, arms, png, title)
        figure = f"Figure (a panel per data size): `{png.relative_to(REPO) if png.is_relative_to(REPO) else png}`"
    threads = parts[0][0].scale.threads_per_job
    hours = [(st, hours_table(res, methods, arms, threads)[1]["all"]) for st, res in results]
    rows = ["| data size | runs trained | wall h | thread-h | CPU h (measured) |", "|---|---|---|---|---|"]
    rows += [
        f"| {st.label} | {h.get('runs', 0):.0f} | {h.get('wall', 0) / 3600:.2f} | "
        f"{h.get('wall', 0) * threads / 3600:.2f} | {h.get('cpu', 0) / 3600:.2f} |"
        for st, h in hours
    ]
    wall = sum(h.get("wall", 0) for _, h in hours)
    rows.append(f"| all | {sum(h.get('runs', 0) for _, h in hours):.0f} | {wall / 3600:.2f} | "
                f"{wall * threads / 3600:.2f} | {sum(h.get('cpu', 0) for _, h in hours) / 3600:.2f} |")  # fmt: skip
    lines = [
        f"## Quality benchmark, {scale_name} scale, {len(parts)} data size(s) ({time.strftime('%Y-%m-%d')})",
        "",
        f"Command: {command}",
        "",
        "CPU-hours of the whole call (every size):",
        "",
        *rows,
        "",
        figure,
        "",
        *(text for _, text in parts),
    ]
    text = "\n".join(lines)
    (out / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out, parts = settings(args)
    if args.data is not None and not args.data.is_dir():
        raise SystemExit(f"--data {args.data}: not a folder (an ImageNet-layout one: train/<class>/*, test/ or val/)")
    plans = [(st, plan(st.scale, args.methods, args.arms, args.seeds, st.out)) for st in parts]
    if args.dry_run:
        for st, jobs in plans:
            dry_run(st.scale, jobs)
        return
    if not args.report_only:
        start = time.time()
        for st, jobs in plans:
            left = None if args.time_budget_min is None else args.time_budget_min - (time.time() - start) / 60
            if left is not None and left <= 0:
                break
            run_all(st.scale, jobs, args.jobs or st.scale.jobs, left, not args.no_linear, st.out)
    if BASE not in args.arms:  # e.g. more arms beside a running benchmark
        print("no baseline arm: runs only; build the report with all arms and --report-only")
        return
    command = "`uv run python benchmarks/quality.py " + " ".join(argv) + "`"
    if args.report_only:  # say so: the runs themselves came from an earlier call without it
        command += " (builds this report from finished runs, which the same command trains without --report-only)"
    # With --results the figure goes beside that file (committed with it), not only into runs/.
    png = args.results.parent / f"quality_{args.scale}_knn_flops.png" if args.results else None
    if parts[0].size is None:
        st, jobs = plans[0]
        text = report(args.scale, st.scale, jobs, args.methods, args.arms, st.out, command, png)
    else:
        texts = [
            (st, report(args.scale, st.scale, jobs, args.methods, args.arms, st.out, command, heading=f", {st.label}"))
            for st, jobs in plans
        ]
        text = sizes_report(args.scale, texts, args.methods, args.arms, args.seeds, out, command, png)
    print(text)
    if args.results:
        with args.results.open("a") as fh:
            fh.write(f"\n{text}\n")
            if NO_FIGURE not in text:
                fh.write(f"![k-NN against model FLOPs, {args.scale} scale]({png.name})\n")  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
