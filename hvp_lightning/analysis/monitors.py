"""``hvp-monitors RUN_DIR [--follow S] [--plot PNG]``: a run's health, pass by pass, whatever its logger.

Pretraining on one's own unlabelled images has no accuracy to watch; the label-free monitors
(RankMe and the feature std, hvp_lightning/monitors/health.py) are what shows progress or collapse. W&B
plots them online; this reads ``<run_dir>/monitors.json``, which every run rewrites at each pass
under any logger (hvp_lightning/monitors/online.py ``OnlineMonitors``), so a run on a cluster can be
watched from a login node while it trains (``--follow``), and gives one figure to look at instead
of a table. A run dir from before that record is read from its ``summary.json`` once it ended, or
from its CSV log (``logger=csv``) while it trains.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..monitors.health import collapse_reason
from ..run.directory import RunDir
from ..run.figures import plot_formats

COLUMNS = {"rankme": "monitor/rankme", "feature_std": "monitor/feature_std", "knn_top1": "knn/top1"}
EPOCH_COLUMNS = ("monitor/epoch", "knn/epoch")


@dataclass
class Row:
    """One evaluation pass: the monitors and, where the run has a labelled set, the k-NN top-1."""

    epoch: float
    step: int
    rankme: float | None = None
    feature_std: float | None = None
    knn_top1: float | None = None


def _number(text: str | None) -> float | None:
    return float(text) if text not in (None, "") else None


def read_passes(metrics_csv: Path) -> list[Row]:
    """The evaluation passes logged in a Lightning CSV log, one :class:`Row` per (epoch, step).

    Lightning writes a pass's values on one row or spread over several with the same step, and a
    resumed run may log a pass again: the last value of each key at a step wins."""
    rows: dict[tuple[int, int], Row] = {}
    with metrics_csv.open(newline="") as f:
        for line in csv.DictReader(f):
            epoch = next((_number(line.get(c)) for c in EPOCH_COLUMNS if _number(line.get(c)) is not None), None)
            values = {k: _number(line.get(c)) for k, c in COLUMNS.items()}
            if epoch is None or all(v is None for v in values.values()):
                continue
            step = int(_number(line.get("step")) or 0)
            row = rows.setdefault((int(epoch), step), Row(int(epoch), step))
            for key, value in values.items():
                if value is not None:
                    setattr(row, key, value)
    return sorted(rows.values(), key=lambda r: (r.step, r.epoch))


def from_histories(record: dict[str, Any]) -> list[Row]:
    """The passes of a run's ``monitor_history`` and ``knn_history`` (``monitors.json``, and
    ``summary.json`` at the end), one :class:`Row` per optimiser step."""
    rows: dict[int, Row] = {}
    for h in record.get("monitor_history") or []:
        row = rows.setdefault(int(h["step"]), Row(h["epoch"], int(h["step"])))
        row.rankme, row.feature_std = h["rankme"], h["feature_std"]
    for h in record.get("knn_history") or []:
        rows.setdefault(int(h["step"]), Row(h["epoch"], int(h["step"]))).knn_top1 = h["top1"]
    return sorted(rows.values(), key=lambda r: r.step)


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def passes(run_dir: RunDir) -> tuple[list[Row], int | None, Path | None]:
    """``(passes, d, the file they were read from)``: the run's ``monitors.json``; for a run dir
    from before it, ``summary.json`` once the run ended, else the CSV log (d unknown until the
    end). ``([], None, None)`` when the run dir holds none of them."""
    summary = _json(run_dir.summary) or {}
    if (record := _json(run_dir.monitors)) is not None:
        return from_histories(record), record.get("monitor_dim") or summary.get("monitor_dim"), run_dir.monitors
    if "monitor_history" in summary or "knn_history" in summary:
        return from_histories(summary), summary.get("monitor_dim"), run_dir.summary
    if run_dir.csv_metrics.is_file():
        return read_passes(run_dir.csv_metrics), summary.get("monitor_dim"), run_dir.csv_metrics
    return [], None, None


def why_none(run_dir: RunDir, source: Path | None) -> str:
    """The one line that says why a run dir shows no pass."""
    if source is not None:
        return f"no monitor or k-NN pass recorded yet in {source}"
    if run_dir.checkpoints.is_dir():  # training went on without a record: an earlier version's run
        return (
            f"{run_dir} has no record of its passes yet: it predates {run_dir.monitors.name} and has no "
            f"{run_dir.csv_metrics.parent.name}/{run_dir.csv_metrics.name} (logger=csv only); its passes are in "
            f"its W&B run, and in {run_dir.summary.name} once it ends"
        )
    when = f"the run writes {run_dir.monitors.name} when training starts"
    return f"no monitor or k-NN pass recorded yet in {run_dir} ({when})"


def table(rows: list[Row], dim: int | None) -> str:
    """The passes as a fixed-width table; with d known, the std also as std * sqrt(d) (1 for
    isotropic directions, 0 for a collapse) and a collapse flag as the run's warning gives it."""
    head = f"{'epoch':>6} {'RankMe':>9} {'feature std':>12}"
    head += f" {'std*sqrt(d)':>12}" if dim else ""
    head += f" {'k-NN top-1':>11}"
    lines = [head]
    for r in rows:
        text = f"{r.epoch:>6g} {_fmt(r.rankme, '.2f'):>9} {_fmt(r.feature_std, '.5f'):>12}"
        if dim:
            scaled = None if r.feature_std is None else r.feature_std * math.sqrt(dim)
            text += f" {_fmt(scaled, '.3f'):>12}"
        text += f" {_fmt(r.knn_top1, '.2%'):>11}"
        if dim and r.rankme is not None and r.feature_std is not None:
            reason = collapse_reason(r.rankme, r.feature_std, dim)
            text += f"  collapse: {reason}" if reason else ""
        lines.append(text)
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def plot(rows: list[Row], out: Path, title: str) -> None:
    """RankMe, feature std and (where logged) k-NN top-1 over epochs, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [("rankme", "RankMe"), ("feature_std", "feature std (l2-normalised)"), ("knn_top1", "k-NN top-1")]
    panels = [(k, label) for k, label in panels if any(getattr(r, k) is not None for r in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels):
        pts = [(r.epoch, getattr(r, key)) for r in rows if getattr(r, key) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(label)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None, prog: str = "hvp-monitors") -> int:
    """The ``hvp-monitors`` console command; ``prog``: the command name its usage line shows."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a run dir (it holds monitors.json)")
    ap.add_argument("--plot", type=Path, default=None, help="write the curves to this PNG file")
    ap.add_argument(
        "--follow",
        type=float,
        default=None,
        metavar="S",
        help="print each new pass as it is recorded, checking every S seconds, until the run writes summary.json",
    )
    args = ap.parse_args(argv)
    run_dir = RunDir.of(args.run_dir)
    if args.follow is not None and args.follow <= 0:
        print(f"{prog}: --follow={args.follow} is not allowed: expected seconds > 0", file=sys.stderr)
        return 2
    if not run_dir.path.is_dir():
        print(f"{prog}: {args.run_dir} is not a run dir (no such folder)", file=sys.stderr)
        return 2
    started = (run_dir.config, run_dir.hydra, run_dir.monitors, run_dir.csv_metrics, run_dir.checkpoints)
    if not any(p.exists() for p in started):  # e.g. runs/<date>: --follow would wait forever
        print(
            f"{prog}: {args.run_dir} is not a run dir (no config.yaml, .hydra/, monitors.json, csv/ log or "
            "checkpoints/ in it; a run dir is runs/<date>/<time>_<method>, the path train.py's last line names)",
            file=sys.stderr,
        )
        return 2
    if args.plot is not None and args.plot.suffix.lstrip(".").lower() not in plot_formats():
        print(
            f"{prog}: --plot={args.plot} is not allowed: a file name ending in one of "
            f"{', '.join('.' + f for f in sorted(plot_formats()))}",
            file=sys.stderr,
        )
        return 2
    shown, shown_dim, waiting = 0, None, False
    while True:
        # summary.json before the passes: the run writes it last, so a finished run's are read whole
        finished = run_dir.summary.is_file()
        rows, dim, source = passes(run_dir)
        text = table(rows, dim).splitlines()
        if args.follow is None or (finished and not rows):
            if not rows:
                print(f"{prog}: {why_none(run_dir, source)}", file=sys.stderr)
                return 1
            print("\n".join(text))
            break
        if not rows and not waiting:  # a line now, not silence until the first pass
            print(f"{prog}: {why_none(run_dir, source)}; checking every {args.follow:g} s", file=sys.stderr, flush=True)
            waiting = True
        if finished and dim and shown and shown_dim is None:  # the lines so far lacked d: the whole table again
            print(f"run ended (d={dim}):", "\n".join(text), sep="\n", flush=True)
        elif len(rows) > shown:
            print("\n".join(text[0 if shown == 0 else shown + 1 :]), flush=True)
        if len(rows) > shown:
            shown, shown_dim = len(rows), dim
        if finished:
            break
        time.sleep(args.follow)
    if args.plot is not None and rows:
        plot(rows, args.plot, f"{run_dir.name}: label-free monitors")
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m hvp_lightning.analysis.monitors"))
