"""One table per Hydra multirun: ``<sweep_dir>/sweep_summary.csv``, a row per job (and on request
a plot of the jobs' quality against their model FLOPs: :func:`plot_flops`).

The table is built from disk alone -- each job dir's ``.hydra/overrides.yaml`` (written by
Hydra before the job starts) and the ``summary.json`` that :func:`hvp_lightning.training.driver.run`
writes at its end -- so it comes out the same whether the jobs ran here (basic launcher) or
on SLURM nodes (submitit). :class:`SweepSummary` (``hydra.callbacks`` in conf/config.yaml)
writes it after every job, in the job's process, and once more when the multirun ends, in
the submitting process: Hydra skips ``on_multirun_end`` when a job raised, so the per-job
writes are what leave a table (with ``status=failed`` rows) after a failed sweep.
``python -m hvp_lightning.cluster.sweep <sweep_dir>`` rebuilds it by hand, e.g. after SLURM killed
a job (then no callback runs at all).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from ..run.atomic import atomic_write_text
from ..run.directory import RunDir

log = logging.getLogger(__name__)

FILENAME = "sweep_summary.csv"
DIRNAME_MAX_BYTES = 120
# summary.json's "cost" entries (docs/logging.md "What a run costs")
COST_COLUMNS = (
    "total_flops",
    "selection_flops_share",
    "train_flops_per_image",
    "selection_flops_per_image",
    "baseline_flops_per_image",
    "images_per_s",
)
# After the override columns; hvp_* are summary.json's "hvp" entries ("off" marks a baseline run).
RESULT_COLUMNS = (
    "overrides",
    "knn_top1",
    "knn_top1_init",
    "knn_top5",
    "monitor_rankme",
    "monitor_feature_std",
    "monitor_collapse_epoch",
    "epochs",
    "steps",
    "budget_flops",
    *COST_COLUMNS,
    "hvp_mode",
    "hvp_num_views",
    "hvp_every_n_steps",
    "hvp_selection_selected_loss_mean",
    "hvp_selection_candidate_loss_mean",
    "hvp_trained_loss_mean",
    "hvp_nonfinite_candidates",
    "wall_time_s",
    "status",
    "error",
    "run_dir",
)
HVP_KEYS = (
    "mode",
    "num_views",
    "every_n_steps",
    "selection_selected_loss_mean",
    "selection_candidate_loss_mean",
    "trained_loss_mean",
    "nonfinite_candidates",
)


class Job(NamedTuple):
    """What one sweep job left on disk."""

    run_dir: str
    overrides: list[str]
    summary: dict[str, Any] | None  # None: no summary.json (the job failed or never finished)
    error: str | None = None


def split_override(override: str) -> tuple[str, str]:
    """``+hvp=on`` -> (``hvp``, ``on``): the column name is the config key without ``+``/``++``/``~``."""
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def job_row(job: Job) -> dict[str, Any]:
    """The CSV row of one job: its overrides, one per column, then its results."""
    row: dict[str, Any] = dict(split_override(o) for o in job.overrides)
    s = job.summary or {}
    hvp = s.get("hvp") or {}
    row.update(
        overrides=" ".join(job.overrides),
        knn_top1=s.get("knn_top1"),
        knn_top1_init=s.get("knn_top1_init"),
        knn_top5=s.get("knn_top5"),
        # the label-free monitors: a sweep on unlabelled images (data=images) has no k-NN to compare
        monitor_rankme=s.get("monitor_rankme"),
        monitor_feature_std=s.get("monitor_feature_std"),
        monitor_collapse_epoch=s.get("monitor_collapse_epoch"),
        epochs=s.get("epochs"),
        steps=s.get("steps"),
        budget_flops=(s.get("budget") or {}).get("flops"),
        wall_time_s=s.get("wall_time_s"),
        status="ok" if job.summary is not None else "failed",
        error=job.error or "",
        run_dir=job.run_dir,
    )
    row.update({k: (s.get("cost") or {}).get(k) for k in COST_COLUMNS})  # none in runs from before cost reporting
    row.update({f"hvp_{k}": hvp.get(k) for k in HVP_KEYS})
    if job.summary is not None and not s.get("hvp_enabled"):
        row["hvp_mode"] = "off"
    return row


def sweep_csv(jobs: list[Job]) -> str:
    """The whole table as CSV text: override keys as columns (first seen first), then RESULT_COLUMNS;
    empty cells where a job has no such override or value."""
    rows = [job_row(j) for j in jobs]
    keys = [k for j in jobs for k, _ in map(split_override, j.overrides) if k not in RESULT_COLUMNS]
    columns = [*dict.fromkeys(keys), *RESULT_COLUMNS]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    return out.getvalue()


def swept_keys(argv: Sequence[str]) -> list[tuple[str, str | None]]:
    """(key, package) of every override that ``argv`` sweeps (``seed=0,1``, ``lr=range(1,4)``), in order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    args = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(args)
    except Exception:  # not Hydra overrides (e.g. submitit's own argv on a SLURM node): no order to keep
        return []
    return [(o.key_or_group, o.package) for o in parsed if o.is_sweep_override()]


def job_dir_name(overrides: Sequence[str], argv: Sequence[str] | None = None) -> str:
    """A sweep job's overrides as one safe dir name (``${hvp_dirname:${hydra.overrides.task}}`` in
    hydra.sweep.subdir): ``k=v`` joined by ',', the keys the command line sweeps first, in its order,
    so that a name cut to DIRNAME_MAX_BYTES still tells the jobs apart (Hydra's override_dirname
    sorts them, and ``method=...,seed=...`` would fall behind ten fixed ``data.*=`` keys); the rest
    sorted as Hydra does. A '/' (data.root=/x/y) would nest dirs: it becomes '_'. The sweep table
    keeps the full overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    swept = swept_keys(sys.argv[1:] if argv is None else argv)
    lines = [str(o) for o in overrides]
    parsed = OverridesParser.create().parse_overrides(lines)
    rank = {
        line: swept.index(key) if (key := (o.key_or_group, o.package)) in swept else len(swept)
        for line, o in zip(lines, parsed)
    }
    name = ",".join(sorted(lines, key=lambda line: (rank[line], line)))
    return name.replace("/", "_").encode()[:DIRNAME_MAX_BYTES].decode(errors="ignore")


# Registered on import: train.py imports this module, and Hydra imports it for the callback
# before it resolves a job's dir, on SLURM nodes too (when it unpickles the launcher).
OmegaConf.register_new_resolver("hvp_dirname", job_dir_name, replace=True)


def _natural_key(path: Path) -> list[Any]:
    """Job dirs start with the job number: 2_... before 10_..."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.as_posix())]


def read_jobs(sweep_dir: Path) -> list[Job]:
    """Every job dir under ``sweep_dir`` (found by its ``.hydra/overrides.yaml``), in job order."""
    dirs = sorted(RunDir.started_under(sweep_dir), key=lambda d: _natural_key(d.path.relative_to(sweep_dir)))
    jobs = []
    for d in dirs:
        overrides = yaml.safe_load(d.overrides.read_text()) or []
        summary = json.loads(d.summary.read_text()) if d.summary.is_file() else None
        error = d.error.read_text().strip() if d.error.is_file() else None
        jobs.append(Job(str(d), [str(o) for o in overrides], summary, error))
    return jobs


def write_sweep_summary(sweep_dir: Path | str) -> Path:
    """(Re)write ``<sweep_dir>/sweep_summary.csv`` through a uniquely named temporary file and a
    rename: jobs on several nodes may write it at once (the last rename wins; a job's table can
    miss one that finished at the same moment, the one written at the end of the sweep cannot)."""
    sweep_dir = Path(sweep_dir)
    path = sweep_dir / FILENAME
    atomic_write_text(path, sweep_csv(read_jobs(sweep_dir)))
    return path


# Overrides that set how much a job trains (the plot's x axis) or repeat it (seed): not its group.
UNGROUPED = ("seed", "budget.flops", "budget.match", "trainer.max_epochs", "trainer.max_steps")
COMPUTE_KEYS = UNGROUPED[1:]
PLOTTED = {  # summary key: (panel title, scale), in panel order; a panel per key some job reports
    "knn_top1": ("k-NN top-1 (%)", 100.0),
    "monitor_rankme": ("RankMe (label-free)", 1.0),
    "monitor_feature_std": ("feature std (label-free)", 1.0),
}


def job_groups(jobs: list[Job]) -> list[str]:
    """Each job's group in the plot: its values of the keys the jobs differ in (``hvp.enabled=true``),
    seeds and the compute keys (:data:`UNGROUPED`) left out; ``all jobs`` where nothing else differs."""
    values = [dict(map(split_override, j.overrides)) for j in jobs]
    keys = dict.fromkeys(k for v in values for k in v if k not in UNGROUPED)
    varying = [k for k in keys if len({v.get(k) for v in values}) > 1]
    return [", ".join(f"{k}={v[k]}" if k in v else f"no {k}" for k in varying) or "all jobs" for v in values]


class Point(NamedTuple):
    """One finished job in the plot: its model FLOPs, the plotted value, and its compute setting
    (the values of :data:`COMPUTE_KEYS` in its overrides)."""

    flops: float
    value: float
    setting: tuple[str | None, ...]


def flops_series(jobs: list[Job]) -> dict[str, dict[str, list[Point]]]:
    """What :func:`plot_flops` draws: per panel (each :data:`PLOTTED` key that a finished job with
    a FLOP count, ``cost.total_flops``, reports: k-NN top-1 in %, then the label-free RankMe and
    feature std beside it, which are all there is on unlabelled data), each :func:`job_groups`
    group's points, one per such job."""
    done = [
        (group, j.summary, tuple(dict(map(split_override, j.overrides)).get(k) for k in COMPUTE_KEYS))
        for group, j in zip(job_groups(jobs), jobs)
        if j.summary is not None and (j.summary.get("cost") or {}).get("total_flops")
    ]
    series: dict[str, dict[str, list[Point]]] = {}
    for key, (_, scale) in PLOTTED.items():
        for group, s, setting in done:
            if s.get(key) is not None:
                point = Point(float(s["cost"]["total_flops"]), s[key] * scale, setting)
                series.setdefault(key, {}).setdefault(group, []).append(point)
    return series


def plot_flops(jobs: list[Job], out: Path, title: str) -> str | None:
    """Quality against compute (:func:`flops_series`): a colour per group, and a line through each
    group's means over the jobs of one compute setting (the seeds of a budget, say). Log x where
    the FLOPs span more than 10x, else linear from 0. Returns why nothing was drawn, or None."""
    series = flops_series(jobs)
    if not series:
        return (
            "no finished job's summary.json has cost.total_flops and k-NN or the monitors (from before cost reporting?)"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(series), figsize=(5.5 * len(series), 3.8), squeeze=False)
    flops = [p.flops for groups in series.values() for pts in groups.values() for p in pts]
    for ax, (key, groups) in zip(axes[0], series.items()):
        for i, (group, pts) in enumerate(groups.items()):
            ax.scatter([p.flops for p in pts], [p.value for p in pts], color=f"C{i}", label=group, s=18)
            settings = {p.setting: [q for q in pts if q.setting == p.setting] for p in pts}
            if len(settings) > 1:
                means = sorted(
                    (sum(q.flops for q in v) / len(v), sum(q.value for q in v) / len(v)) for v in settings.values()
                )
                ax.plot([m[0] for m in means], [m[1] for m in means], color=f"C{i}", alpha=0.6)
        if max(flops) > 10 * min(flops):
            ax.set_xscale("log")
        else:
            ax.set_xlim(left=0)  # equal budgets read as equal: not a narrow range stretched across the axis
        ax.set_xlabel("model FLOPs (summary.json cost.total_flops)")
        ax.set_title(PLOTTED[key][0])
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return None


def _is_rank_zero() -> bool:
    """One writer per job: a multi-task SLURM job runs the Hydra job (and its callbacks) in every task."""
    for key in ("RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key]) == 0
    return True


class SweepSummary(Callback):
    """Writes ``sweep_summary.csv`` into the sweep dir of a multirun (see the module docstring)."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN or not _is_rank_zero():
            return
        if job_return.status == JobStatus.FAILED:
            err = job_return._return_value  # .return_value would re-raise it
            if isinstance(err, CompactHydraException) and err.__cause__ is not None:
                err = err.__cause__  # train.py wraps a config error so that Hydra prints it in one line
            message = " ".join(f"{type(err).__name__}: {err}".split())
            atomic_write_text(RunDir(config.hydra.runtime.output_dir).error, message + "\n")
        log.info("sweep summary so far: %s", write_sweep_summary(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        path = write_sweep_summary(config.hydra.sweep.dir)
        print(f"sweep summary: {path}")


SWEEP_DIR = "the folder `python train.py -m ...` writes (multirun/<date>/<time>), holding one subfolder per job"


def sweep_dir_problem(path: Path) -> str | None:
    """Why ``path`` is no sweep dir to tabulate, or None: a run dir or a mistyped path would
    otherwise get a one-row or a header-only table (and the missing folder made)."""
    if not path.is_dir():
        return "no such folder"
    if RunDir(path).overrides.is_file():
        return "it is a single run dir"
    if not RunDir.started_under(path):
        return "it holds no job subfolder (.hydra/overrides.yaml)"
    return None


def main(argv: list[str] | None = None, prog: str = "hvp-sweep-summary") -> int:
    """``hvp-sweep-summary SWEEP_DIR [--plot FILE]`` (``python -m hvp_lightning.cluster.sweep ...``):
    (re)write ``sweep_summary.csv`` of a Hydra multirun, e.g. after some of its jobs were rerun, and
    draw its jobs' quality against their model FLOPs (:func:`plot_flops`)."""
    import argparse

    ap = argparse.ArgumentParser(
        prog=prog,
        description="(Re)write SWEEP_DIR/sweep_summary.csv, one row per job of a Hydra multirun, from what "
        "the jobs left on disk: e.g. after SLURM killed a job or some jobs were rerun; --plot draws quality "
        "against compute.",
    )
    ap.add_argument("sweep_dir", type=Path, metavar="SWEEP_DIR", help=SWEEP_DIR)
    ap.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE",
        help="also draw k-NN top-1, RankMe and feature std (a panel each, where the jobs report it) against "
        "each job's model FLOPs, a colour per value of the swept keys (e.g. hvp.enabled), to this image file "
        "(e.g. flops.png)",
    )
    args = ap.parse_args(argv)
    if problem := sweep_dir_problem(args.sweep_dir):
        print(f"{prog}: {args.sweep_dir} is not a sweep dir ({problem}); a sweep dir is {SWEEP_DIR}", file=sys.stderr)
        return 2
    if args.plot is not None:
        from ..run.figures import plot_formats

        if args.plot.suffix.lstrip(".").lower() not in (formats := plot_formats()):
            allowed = ", ".join("." + f for f in sorted(formats))
            print(f"{prog}: --plot={args.plot} is not allowed: a file name ending in one of {allowed}", file=sys.stderr)
            return 2
    print(write_sweep_summary(args.sweep_dir))
    if args.plot is not None:
        if why := plot_flops(read_jobs(args.sweep_dir), args.plot, f"{args.sweep_dir}: quality against compute"):
            print(f"{prog}: no plot: {why}", file=sys.stderr)
            return 1
        print(args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m hvp_lightning.cluster.sweep"))
