"""``hvp-analysis RUN_DIR [BASELINE_RUN_DIR] [--compare OTHER_HVP_RUN]`` (= ``python -m hvp_lightning.analysis
...``): hard-view analysis figures and ``analysis.json`` of an HVP run (see :mod:`hvp_lightning.analysis.report`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..run.directory import RunDir
from .report import analyse
from .upload import log_to_wandb


def main(argv: list[str] | None = None, prog: str = "hvp-analysis") -> int:
    """The ``hvp-analysis`` console command; ``prog``: the command name its usage line shows."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__)
    ap.add_argument("run_dir", type=Path, help="the HVP run (trained with +hvp=on)")
    ap.add_argument("baseline_dir", type=Path, nargs="?", help="optional baseline run (HVP off) to compare with")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: RUN_DIR/analysis)")
    ap.add_argument("--gallery", type=int, default=6, help="images in the view gallery (0 = none)")
    ap.add_argument("--trees", type=int, default=100, help="random-forest trees for the importance analysis")
    ap.add_argument("--max-samples", type=int, default=200_000, help="candidate pairs used for the importance")
    ap.add_argument(
        "--compare",
        type=Path,
        action="append",
        default=[],
        help="another HVP run (e.g. hvp.colour=static) whose lowest-IoU share is plotted next to RUN_DIR's; repeatable",
    )
    ap.add_argument("--wandb", action="store_true", help="also log the figures to the run's W&B run (resumed)")
    args = ap.parse_args(argv)
    result = analyse(
        args.run_dir, args.baseline_dir, args.out, args.gallery, args.trees, args.max_samples, tuple(args.compare)
    )
    if args.wandb:
        run_id = log_to_wandb(args.run_dir, result)
        print(f"W&B: {'logged to run ' + run_id if run_id else 'no W&B run found under ' + str(args.run_dir)}")
    keys = ("lowest_iou_share", "lowest_iou_chance", "selected_iou_mean", "candidate_iou_mean", "baseline_iou_mean")
    print(json.dumps({k: result.get(k) for k in keys}, indent=2))
    out = args.out or RunDir(args.run_dir).analysis
    print(f"wrote {out / 'analysis.json'} and {len(result['figures'])} figures: {', '.join(result['figures'])}")
    for note in result["notes"]:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(prog="python -m hvp_lightning.analysis"))
