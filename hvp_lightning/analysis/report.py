"""Offline hard-view analysis of a run (paper section 6): figures and ``analysis.json``.

Reads what :class:`~hvp_lightning.analysis.callback.HardViewAnalysis` wrote under
``<run_dir>/analysis/`` (``steps-r*.csv`` every step; ``views-*``/``pairs-*.parquet`` every
K-th step when ``analysis.log_every_n_steps=K``) and writes next to them:

1. ``iou_over_training.png`` -- mean IoU of the selected pairs over training, against the
   mean over all candidate pairs and the baseline run's pairs (paper Fig. 3 left);
2. ``lowest_iou_share.png`` -- share of samples whose selected pair is also the lowest-IoU
   pair, with the chance level ``1/C(N,2)`` (paper Fig. 2 left);
3. ``iou_hist.png`` -- IoU histograms: HVP's selected pairs vs all candidates (the i.i.d.
   views a baseline trains on) and, when logged, the baseline run's pairs (Fig. 2 right);
4. ``importance.png`` -- how much of the candidate-pair loss each pair metric explains;
5. ``gallery.png`` -- source images with every candidate crop drawn, the selected pair
   framed, next to the augmented views replayed from the logged parameters (Fig. 1b);
6. with ``--compare OTHER_HVP_RUN``: ``lowest_iou_share_compare.png`` -- the lowest-IoU share
   per epoch of both runs, labelled by their ``hvp.colour`` (per-view vs static colour, Fig. 4
   right), and each run's share in ``analysis.json`` (``compare``).

By concern: :mod:`.logs` reads the files, :mod:`.importance` fits the metric importances,
:mod:`.plots` and :mod:`.gallery` draw, :mod:`.upload` sends the results to W&B.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..run.atomic import atomic_write_text
from ..run.directory import RunDir
from .callback import TIE_EPS
from .gallery import plot_gallery
from .importance import importance
from .logs import load_steps, load_table
from .plots import plot_importance, plot_iou_hist, plot_iou_over_training, plot_lowest_share, plot_lowest_share_compare

# --- statistics ---------------------------------------------------------------------------------


def _wmean(x: np.ndarray, w: np.ndarray) -> float | None:
    ok = np.isfinite(x)
    return float(np.sum(x[ok] * w[ok]) / np.sum(w[ok])) if ok.any() and np.sum(w[ok]) > 0 else None


def summary_stats(steps: dict[str, np.ndarray], prefix: str = "") -> dict[str, Any]:
    """Sample-weighted means over the steps with a selection (all steps for a baseline)."""
    sel = steps["hvp"] if steps["hvp"].any() else np.ones_like(steps["hvp"])
    w = steps["samples"][sel]
    out: dict[str, Any] = {f"{prefix or 'hvp_'}steps": int(sel.sum())}
    names = {
        "iou_selected": "selected_iou_mean",
        "iou_candidates": "candidate_iou_mean",
        "iou_lowest": "lowest_iou_mean",
        "lowest_iou_share": "lowest_iou_share",
        "lowest_iou_chance": "lowest_iou_chance",
        "lowest_iou_chance_ties": "lowest_iou_chance_ties",
        "rel_dist_selected": "selected_rel_dist_mean",
        "rel_dist_candidates": "candidate_rel_dist_mean",
        "color_dist_selected": "selected_color_dist_mean",
        "color_dist_candidates": "candidate_color_dist_mean",
        "loss_selected": "selection_selected_loss_mean",
        "loss_candidates": "selection_candidate_loss_mean",
    }
    for k, name in names.items():
        out[prefix + name] = _wmean(steps[k][sel], w)
    half = np.zeros_like(sel)
    idx = np.flatnonzero(sel)
    half[idx[len(idx) // 2 :]] = True
    out[prefix + "lowest_iou_share_second_half"] = _wmean(steps["lowest_iou_share"][half], steps["samples"][half])
    return out


def share_by_epoch(steps: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(epochs, sample-weighted lowest-IoU share of each epoch's selection steps)."""
    sel = steps["hvp"] & np.isfinite(steps["lowest_iou_share"])
    epoch = np.floor(steps["epoch"][sel] + 1e-9).astype(np.int64)
    w, share = steps["samples"][sel], steps["lowest_iou_share"][sel]
    epochs, inv = np.unique(epoch, return_inverse=True)
    return epochs, np.bincount(inv, share * w) / np.bincount(inv, w)


def view_log_lowest_share(pairs: dict[str, np.ndarray]) -> float | None:
    """The lowest-IoU share from the view log's candidate pairs: of the samples of all logged
    selection steps, those whose selected pair's IoU is the minimum of their pairs (ties count,
    as the online statistic)."""
    h = pairs["hvp"]
    if not h.any():
        return None
    micro = pairs["micro"] if "micro" in pairs else np.zeros_like(pairs["step"])
    key = np.stack([pairs[k][h].astype(np.int64) for k in ("rank", "step", "sample")] + [micro[h].astype(np.int64)], 1)
    _, sample = np.unique(key, axis=0, return_inverse=True)
    sample = sample.reshape(-1)
    iou = pairs["iou"][h].astype(np.float64)
    low = np.full(sample.max() + 1, np.inf)
    np.minimum.at(low, sample, iou)
    chosen = pairs["selected"][h]
    hits = iou[chosen] <= low[sample[chosen]] + TIE_EPS
    return float(hits.mean())


def run_label(run_dir: Path) -> str:
    """``<dir name>: <hvp.colour> colour`` from the run's saved config (``HVP off`` without HVP)."""
    from omegaconf import OmegaConf

    from ..config import stored_config

    rd = RunDir(run_dir)
    for path in (rd.config, rd.hydra_config):
        if path.is_file():
            try:
                cfg = stored_config(OmegaConf.load(path))
            except ConfigError:  # a composed config that never ran: no label to read from it
                return run_dir.name
            what = f"{cfg.hvp.colour} colour" if cfg.hvp_on else "HVP off"  # type: ignore[union-attr]
            return f"{run_dir.name}: {what.replace('_', '-')}"
    return run_dir.name


# --- the report ---------------------------------------------------------------------------------


def analyse(
    run_dir: Path | str,
    baseline_dir: Path | str | None = None,
    out_dir: Path | str | None = None,
    gallery: int = 6,
    trees: int = 100,
    max_samples: int = 200_000,
    compare: tuple[Path | str, ...] = (),
) -> dict[str, Any]:
    """Write the figures and ``analysis.json`` (in ``out_dir``, default ``<run_dir>/analysis``);
    ``compare``: other HVP runs whose lowest-IoU share goes next to this run's."""
    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir is not None else RunDir(run_dir).analysis
    for path in (run_dir, baseline_dir, *compare):  # a typo'd path: say so, and make no folder anywhere
        if path is not None and not Path(path).is_dir():
            raise SystemExit(f"{path}: no such run dir")
    steps = load_steps(run_dir)
    if steps is None:
        raise SystemExit(f"{run_dir}/analysis/steps-r*.csv not found: was the run trained with analysis.online=true?")
    if not steps["hvp"].any():
        raise SystemExit(f"{run_dir} has no HVP selection steps: pass the HVP run first, the baseline second")
    out.mkdir(parents=True, exist_ok=True)  # only for a run that can be analysed
    base = load_steps(Path(baseline_dir)) if baseline_dir is not None else None
    if baseline_dir is not None and base is None:
        warnings.warn(f"{baseline_dir} has no analysis/steps-r*.csv; plotting without the baseline", stacklevel=2)
    result: dict[str, Any] = {"run_dir": str(run_dir), "baseline_dir": str(baseline_dir) if baseline_dir else None}
    result.update(summary_stats(steps))
    if base is not None:
        b = summary_stats(base, prefix="baseline_")
        result.update(
            {
                k: b[k]
                for k in (
                    "baseline_steps",
                    "baseline_selected_iou_mean",
                    "baseline_selected_rel_dist_mean",
                    "baseline_selected_color_dist_mean",
                )
            }
        )
        result["baseline_iou_mean"] = result.pop("baseline_selected_iou_mean")
    chance = result.get("lowest_iou_chance")
    result["num_candidate_pairs"] = round(1 / chance) if chance else None
    figures: dict[str, str] = {}
    notes: list[str] = []

    def fig(name: str, fn, *args) -> None:
        path = out / f"{name}.png"
        fn(*args, path)
        figures[name] = str(path)

    fig("iou_over_training", plot_iou_over_training, steps, base)
    fig("lowest_iou_share", plot_lowest_share, steps)
    if compare:
        runs, result["compare"] = [(run_label(run_dir), *share_by_epoch(steps))], []
        for other in map(Path, compare):
            other_steps = load_steps(other)
            if other_steps is None or not other_steps["hvp"].any():
                raise SystemExit(f"{other}: no HVP selection steps in analysis/steps-r*.csv to compare with")
            runs.append((run_label(other), *share_by_epoch(other_steps)))
            other_pairs = load_table(other, "pairs")
            result["compare"].append(
                {
                    "run_dir": str(other),
                    "label": runs[-1][0],
                    "lowest_iou_share": summary_stats(other_steps)["lowest_iou_share"],
                    "view_log_lowest_iou_share": None if other_pairs is None else view_log_lowest_share(other_pairs),
                }
            )
        result["label"] = runs[0][0]
        fig("lowest_iou_share_compare", plot_lowest_share_compare, runs, result["lowest_iou_chance"])
    pairs, views = load_table(run_dir, "pairs"), load_table(run_dir, "views")
    if pairs is None or views is None:
        notes.append(
            "no Parquet view log (train with analysis.log_every_n_steps=K): no histogram, importance or gallery"
        )
        result["importance"] = {"skipped": "no Parquet view log"}
    else:
        base_pairs = load_table(Path(baseline_dir), "pairs") if baseline_dir is not None else None
        if baseline_dir is not None and base_pairs is None:
            notes.append(
                "baseline has no Parquet view log: its histogram is left out (HVP's candidate pairs are "
                "i.i.d. views from the same augmentation, i.e. what a baseline trains on)"
            )
        fig("iou_hist", plot_iou_hist, pairs, base_pairs)
        result["view_log_lowest_iou_share"] = view_log_lowest_share(pairs)
        result["logged_steps"] = int(len(np.unique(pairs["step"])))
        result["logged_pairs"] = int(len(pairs["step"]))
        imp = importance(pairs, trees=trees, max_samples=max_samples)
        result["importance"] = imp
        if "skipped" not in imp:
            fig("importance", plot_importance, imp)
            if imp["r2_test"] <= 0.05:
                notes.append(
                    f"importance: the forest explains no held-out variance (R^2 = {imp['r2_test']:.2f}); "
                    "its main effects are noise -- log more steps"
                )
        if gallery > 0:
            try:
                path = out / "gallery.png"
                plot_gallery(run_dir, views, pairs, path, gallery)
                figures["gallery"] = str(path)
            except (FileNotFoundError, OSError, KeyError, ValueError) as err:
                notes.append(f"gallery skipped: cannot rebuild the training images ({type(err).__name__}: {err})")
    result["figures"] = figures
    result["notes"] = notes
    atomic_write_text(out / "analysis.json", json.dumps(json_safe(result), indent=2) + "\n")
    return result


def json_safe(x: Any) -> Any:
    """JSON has no NaN: map non-finite floats to None, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
