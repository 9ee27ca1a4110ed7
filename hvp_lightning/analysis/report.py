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
   framed, next to the augmented views replayed from the logged parameters (Fig. 1b).

**Importance, and why not fANOVA itself.** The paper used fANOVA (Hutter et al., 2014).
Its package (``fanova``, last release 2020) needs ``pyrfr``, a C++ random forest without
wheels for current Pythons, so it is not a maintainable dependency. We compute the same
quantity with scikit-learn: fit a random forest to the data, then take each feature's
*main-effect variance share* -- the variance of its partial-dependence curve (evaluated on
the feature's quantiles, i.e. under its empirical marginal) divided by the variance of the
forest's predictions. That is fANOVA's first-order importance, with the empirical feature
distribution instead of a uniform one, and comparable to the paper's percentages. We also
report scikit-learn's permutation importance (drop in held-out R^2), which needs no
independence assumption. The target is the candidate pair's loss *centred per image and
step* (minus the mean over that image's candidate pairs), because HVP compares pairs of
the same image at the same step: training progress and image content would otherwise
dominate the variance.
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.ticker import MaxNLocator

from .callback import PAIR_FEATURES, STAT_KEYS

FEATURE_LABELS = {
    "iou": "IoU", "rel_dist": "relative distance", "color_dist": "colour distance",
    "brightness_diff": "|Δ brightness|", "contrast_diff": "|Δ contrast|",
    "saturation_diff": "|Δ saturation|", "hue_diff": "|Δ hue|",
}
HVP_COLOR, CAND_COLOR, BASE_COLOR = "tab:blue", "tab:gray", "tab:orange"


# --- loading ------------------------------------------------------------------------------------


def load_steps(run_dir: Path) -> dict[str, np.ndarray] | None:
    """Per-step statistics of all ranks and accumulation micro-batches, merged: a resumed run's
    repeated steps keep their last row; rows of one step are averaged weighted by their sample
    counts. None if never written."""
    files = sorted((Path(run_dir) / "analysis").glob("steps-r*.csv"))
    if not files:
        return None
    rows: dict[tuple[int, int, int], list[float]] = {}
    for rank, f in enumerate(files):
        with f.open() as fh:
            for r in csv.DictReader(fh):
                rows[(rank, int(r["step"]), int(r.get("micro") or 0))] = [float(r["epoch"]), float(r["hvp"]), float(r["samples"]),
                                                *(float(r[k]) for k in STAT_KEYS)]
    if not rows:
        return None
    keys = np.array([k[1] for k in rows])
    vals = np.array(list(rows.values()), dtype=np.float64)
    steps, inv = np.unique(keys, return_inverse=True)
    w = vals[:, 2]
    out: dict[str, np.ndarray] = {"step": steps}
    out["epoch"] = np.bincount(inv, vals[:, 0] * w) / np.bincount(inv, w)
    out["hvp"] = np.bincount(inv, vals[:, 1]) > 0
    out["samples"] = np.bincount(inv, w)
    for i, k in enumerate(STAT_KEYS):
        out[k] = np.bincount(inv, vals[:, 3 + i] * w) / out["samples"]
    return out


def load_table(run_dir: Path, kind: str) -> dict[str, np.ndarray] | None:
    """All ``<kind>-*.parquet`` part files as numpy columns (None if there are none).
    Rows a resumed run wrote twice (same rank, step, micro-batch, sample, view/pair) keep the newest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((Path(run_dir) / "analysis").glob(f"{kind}-*.parquet"), key=lambda p: p.stat().st_mtime)
    if not files:
        return None
    table = pa.concat_tables([pq.read_table(f) for f in files])
    cols: dict[str, np.ndarray] = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type):
            cols[name] = col.values.to_numpy(zero_copy_only=False).reshape(len(col), col.type.list_size)
        else:
            cols[name] = col.to_numpy(zero_copy_only=False)
    sub = "view" if kind == "views" else "pair"
    micro = cols["micro"].astype(np.int64) if "micro" in cols else np.zeros(len(cols["step"]), np.int64)
    key = np.stack([cols["rank"].astype(np.int64), cols["step"], micro, cols["sample"].astype(np.int64),
                    cols[sub].astype(np.int64)], 1)
    _, last = np.unique(key[::-1], axis=0, return_index=True)
    keep = np.sort(len(key) - 1 - last)
    return {k: v[keep] for k, v in cols.items()}


# --- statistics ---------------------------------------------------------------------------------


def _wmean(x: np.ndarray, w: np.ndarray) -> float | None:
    ok = np.isfinite(x)
    return float(np.sum(x[ok] * w[ok]) / np.sum(w[ok])) if ok.any() and np.sum(w[ok]) > 0 else None


def summary_stats(steps: dict[str, np.ndarray], prefix: str = "") -> dict[str, Any]:
    """Sample-weighted means over the steps with a selection (all steps for a baseline)."""
    sel = steps["hvp"] if steps["hvp"].any() else np.ones_like(steps["hvp"])
    w = steps["samples"][sel]
    out: dict[str, Any] = {f"{prefix or 'hvp_'}steps": int(sel.sum())}
    names = {"iou_selected": "selected_iou_mean", "iou_candidates": "candidate_iou_mean",
             "iou_lowest": "lowest_iou_mean", "lowest_iou_share": "lowest_iou_share",
             "lowest_iou_chance": "lowest_iou_chance", "lowest_iou_chance_ties": "lowest_iou_chance_ties",
             "rel_dist_selected": "selected_rel_dist_mean", "rel_dist_candidates": "candidate_rel_dist_mean",
             "color_dist_selected": "selected_color_dist_mean", "color_dist_candidates": "candidate_color_dist_mean",
             "loss_selected": "selection_selected_loss_mean", "loss_candidates": "selection_candidate_loss_mean"}
    for k, name in names.items():
        out[prefix + name] = _wmean(steps[k][sel], w)
    half = np.zeros_like(sel)
    idx = np.flatnonzero(sel)
    half[idx[len(idx) // 2:]] = True
    out[prefix + "lowest_iou_share_second_half"] = _wmean(steps["lowest_iou_share"][half], steps["samples"][half])
    return out


def importance(pairs: dict[str, np.ndarray], features: Sequence[str] = PAIR_FEATURES, trees: int = 100,
               max_samples: int = 200_000, grid: int = 20, seed: int = 0) -> dict[str, Any]:
    """Main-effect variance shares and permutation importances of the pair ``features`` for the
    per-image-centred candidate-pair loss (see the module docstring for the method)."""
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.inspection import permutation_importance
    from sklearn.model_selection import train_test_split

    ok = pairs["hvp"] & np.isfinite(pairs["loss"])
    if ok.sum() < 50:
        return {"skipped": f"only {int(ok.sum())} scored candidate pairs logged (need >= 50)"}
    micro = pairs["micro"][ok].astype(np.int64) if "micro" in pairs else np.zeros(int(ok.sum()), np.int64)
    key = np.stack([pairs["rank"][ok].astype(np.int64), pairs["step"][ok], micro, pairs["sample"][ok].astype(np.int64)], 1)
    _, group = np.unique(key, axis=0, return_inverse=True)
    group = group.reshape(-1)
    loss = pairs["loss"][ok].astype(np.float64)
    y = loss - (np.bincount(group, loss) / np.bincount(group))[group]
    x = np.stack([pairs[f][ok].astype(np.float64) for f in features], 1)
    rng = np.random.default_rng(seed)
    if len(y) > max_samples:
        pick = rng.choice(len(y), max_samples, replace=False)
        x, y = x[pick], y[pick]
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed)
    rf = RandomForestRegressor(n_estimators=trees, min_samples_leaf=max(5, len(y_tr) // 2000), max_features=0.5,
                               max_samples=min(1.0, 50_000 / len(y_tr)), n_jobs=-1, random_state=seed)
    rf.fit(x_tr, y_tr)
    r2 = float(rf.score(x_te, y_te))
    ref = x_te[rng.choice(len(x_te), min(len(x_te), 1000), replace=False)]
    total = float(np.var(rf.predict(x_te)))
    main: dict[str, float] = {}
    qs = (np.arange(grid) + 0.5) / grid
    for j, f in enumerate(features):
        values = np.quantile(x_te[:, j], qs)
        probe = np.repeat(ref[None], grid, 0)
        probe[:, :, j] = values[:, None]
        pd = rf.predict(probe.reshape(-1, x.shape[1])).reshape(grid, -1).mean(1)
        main[f] = float(np.var(pd) / total) if total > 0 else 0.0
    n_perm = min(len(x_te), 20_000)
    perm = permutation_importance(rf, x_te[:n_perm], y_te[:n_perm], n_repeats=5, random_state=seed, n_jobs=1)
    return {
        "method": "random forest (scikit-learn) surrogate; main effect = Var(partial dependence on the feature's "
                  "quantiles) / Var(prediction) (fANOVA-like first-order share); permutation = held-out R^2 drop",
        "target": "candidate-pair loss minus the mean over the same image's candidate pairs (same step)",
        "features": list(features), "n_samples": int(len(y)), "r2_test": r2,
        "main_effect": main, "main_effect_total": float(sum(main.values())),
        "permutation": {f: float(v) for f, v in zip(features, perm.importances_mean)},
        "permutation_std": {f: float(v) for f, v in zip(features, perm.importances_std)},
    }


# --- figures ------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 11, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": 110})
    return plt


def smooth(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average that skips NaNs (same length as ``y``)."""
    if window <= 1 or len(y) == 0:
        return y.astype(np.float64)
    ok = np.isfinite(y)
    c = np.cumsum(np.where(ok, y, 0.0))
    n = np.cumsum(ok)
    c = np.concatenate([[0.0], c])
    n = np.concatenate([[0], n])
    lo = np.maximum(np.arange(1, len(y) + 1) - window, 0)
    hi = np.arange(1, len(y) + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (c[hi] - c[lo]) / (n[hi] - n[lo])


def _window(n: int) -> int:
    return max(1, n // 40)


def _curve(ax, x: np.ndarray, y: np.ndarray, color: str, label: str, style: str = "-") -> None:
    w = _window(len(x))
    if w > 1:
        ax.plot(x, y, color=color, alpha=0.2, lw=0.8)
    ax.plot(x, smooth(y, w), style, color=color, lw=2, label=label + (f" (mean of {w} steps)" if w > 1 else ""))


def plot_iou_over_training(hvp: dict[str, np.ndarray], base: dict[str, np.ndarray] | None, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    s = hvp["hvp"]
    _curve(ax, hvp["step"][s], hvp["iou_selected"][s], HVP_COLOR, "HVP: selected pair")
    _curve(ax, hvp["step"][s], hvp["iou_candidates"][s], CAND_COLOR, "HVP: all candidate pairs", "--")
    if base is not None:
        _curve(ax, base["step"], base["iou_selected"], BASE_COLOR, "baseline: its (random) pair")
    ax.set_xlabel("training step")
    ax.set_ylabel("mean IoU of the view pair")
    ax.set_title("IoU of the trained view pair over training")
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_lowest_share(hvp: dict[str, np.ndarray], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    s = hvp["hvp"]
    x = hvp["step"][s]
    _curve(ax, x, 100 * hvp["lowest_iou_share"][s], HVP_COLOR, "selected pair = lowest-IoU pair")
    chance = float(np.nanmean(hvp["lowest_iou_chance"][s]))
    p = round(1 / chance) if chance > 0 else 0
    ax.axhline(100 * chance, color="k", ls="--", lw=1.5, label=f"chance = 1/{p} = {100 * chance:.1f}%")
    ties = float(np.nanmean(hvp["lowest_iou_chance_ties"][s]))
    if abs(ties - chance) > 0.005:
        ax.axhline(100 * ties, color="k", ls=":", lw=1.2, label=f"chance incl. IoU ties = {100 * ties:.1f}%")
    ax.set_xlabel("training step")
    ax.set_ylabel("share of samples (%)")
    ax.set_ylim(0, 100)
    ax.set_title("How often HVP's pair is also the lowest-IoU pair")
    ax.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_iou_hist(pairs: dict[str, np.ndarray], base_pairs: dict[str, np.ndarray] | None, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    bins = np.linspace(0, 1, 26)
    h = pairs["hvp"]
    sel = pairs["iou"][h & pairs["selected"]]
    ax.hist(pairs["iou"][h], bins=bins, density=True, histtype="step", lw=2, ls="--", color=CAND_COLOR,
            label=f"HVP: all candidate pairs (n={h.sum()})")
    ax.hist(sel, bins=bins, density=True, alpha=0.45, color=HVP_COLOR, label=f"HVP: selected pairs (n={len(sel)})")
    if base_pairs is not None:
        b = base_pairs["iou"][base_pairs["selected"]]
        ax.hist(b, bins=bins, density=True, alpha=0.45, color=BASE_COLOR, label=f"baseline pairs (n={len(b)})")
    ax.set_xlabel("IoU of the two crops")
    ax.set_ylabel("density")
    ax.set_title("IoU distribution of view pairs")
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_importance(imp: dict[str, Any], path: Path) -> None:
    plt = _plt()
    feats = imp["features"]
    labels = [FEATURE_LABELS.get(f, f) for f in feats]
    main = np.array([100 * imp["main_effect"][f] for f in feats])
    perm = np.array([imp["permutation"][f] for f in feats])
    err = np.array([imp["permutation_std"][f] for f in feats])
    order = np.argsort(main)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    y = np.arange(len(feats))
    axes[0].barh(y, main[order], color=HVP_COLOR)
    axes[0].set_yticks(y, [labels[i] for i in order])
    axes[0].set_xlabel("main effect: % of the model's loss variance")
    axes[0].set_title("fANOVA-like main effects")
    axes[1].barh(y, perm[order], xerr=err[order], color=BASE_COLOR)
    axes[1].set_xlabel("permutation importance: drop in held-out $R^2$")
    axes[1].xaxis.set_major_locator(MaxNLocator(nbins=4))  # small values: keep tick labels apart
    axes[1].ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))
    axes[1].set_title(f"permutation importance (forest $R^2$ = {imp['r2_test']:.2f})")
    if imp["r2_test"] <= 0.05:
        axes[0].set_title("fANOVA-like main effects\n(held-out $R^2$ <= 0.05: noise, log more steps)", color="tab:red")
    fig.suptitle(f"What explains the per-image-centred pair loss? (n = {imp['n_samples']} candidate pairs)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --- gallery ------------------------------------------------------------------------------------


def replay_view(img, row: dict[str, Any], size: int, blur_kernel: int | None = None):
    """Re-apply one logged view's augmentation to the uint8 source image ``[3, H, W]``: crop,
    flip, jitter in its logged order, grayscale, blur, solarize (before normalisation), with
    the reference kernels of :func:`hvp_lightning.data.augment.augment`."""
    from ..data.augment import ViewAug, crop_flip, reference_colour

    return reference_colour(crop_flip(img, row, size), row, blur_kernel or ViewAug(size=size).blur_kernel)


def load_train_images(run_dir: Path):
    """The run's training set as the data module built it (``index`` in the logs points into it)."""
    from omegaconf import OmegaConf

    from ..data.datamodule import SSLDataModule

    cfg = OmegaConf.load(Path(run_dir) / "config.yaml")
    dm = SSLDataModule(cfg.data, (), 1, 0, int(cfg.get("seed", 0)))
    dm.setup("fit")
    return cfg, dm.train_set.raw


def plot_gallery(run_dir: Path, views: dict[str, np.ndarray], pairs: dict[str, np.ndarray], path: Path,
                 num_images: int = 6) -> None:
    """Fig. 1b: per image, the source with all candidate crops (selected pair solid and thick)
    and the replayed candidate views, the selected ones framed."""
    from matplotlib.patches import Rectangle

    from ..data.augment import to_uint8_tensor

    plt = _plt()
    cfg, raw = load_train_images(run_dir)
    hv = pairs["hvp"]
    step = int(pairs["step"][hv].max()) if hv.any() else int(pairs["step"].max())
    rank0 = int(pairs["rank"].min())
    at = (pairs["step"] == step) & (pairs["rank"] == rank0) & (pairs.get("micro", 0) == 0)
    samples = np.unique(pairs["sample"][at])[:num_images]
    vat = (views["step"] == step) & (views["rank"] == rank0) & (views.get("micro", 0) == 0)
    n = int(views["view"][vat].max()) + 1
    size = int(cfg.data.crop_size)
    colors = plt.get_cmap("tab10").colors
    fig, axes = plt.subplots(len(samples), n + 1, figsize=(2.1 * (n + 1) + 0.6, 2.3 * len(samples)), squeeze=False)
    for r, s in enumerate(samples):
        vr = {k: v[vat & (views["sample"] == s)] for k, v in views.items()}
        pr = {k: v[at & (pairs["sample"] == s)] for k, v in pairs.items()}
        chosen = np.flatnonzero(pr["selected"])
        ca, cb = (int(pr["view_a"][chosen[0]]), int(pr["view_b"][chosen[0]])) if len(chosen) else (0, 1)
        img = to_uint8_tensor(raw[int(vr["index"][0])][0])
        hgt, wid = img.shape[1:]
        ax = axes[r, 0]
        ax.imshow(img.permute(1, 2, 0).numpy(), extent=(0, wid, hgt, 0), interpolation="nearest")
        for v in range(n):
            row = {k: vr[k][v] for k in vr}
            chosen_v = v in (ca, cb)
            ax.add_patch(Rectangle((row["crop_x"], row["crop_y"]), row["crop_w"], row["crop_h"], fill=False,
                                   ec=colors[v % 10], lw=3.2 if chosen_v else 1.3, ls="-" if chosen_v else "--"))
            view = replay_view(img, row, size)
            vax = axes[r, v + 1]
            vax.imshow(view.permute(1, 2, 0).numpy(), interpolation="nearest")
            vax.set_xticks([])
            vax.set_yticks([])
            for sp in vax.spines.values():
                sp.set_edgecolor(colors[v % 10])
                sp.set_linewidth(5 if chosen_v else 1.5)
            vax.set_title(f"view {v}" + (" (selected)" if chosen_v else ""), fontsize=9,
                          fontweight="bold" if chosen_v else "normal", color=colors[v % 10])
        ax.set_xlim(0, wid)
        ax.set_ylim(hgt, 0)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
        k = chosen[0] if len(chosen) else 0
        low = float(pr["iou"].min())
        ax.set_title(f"image {int(vr['index'][0])}: IoU sel. {pr['iou'][k]:.2f} (min {low:.2f})", fontsize=9)
        ax.set_ylabel(f"loss sel. {pr['loss'][k]:.3f}\nmean {np.nanmean(pr['loss']):.3f}"
                      if np.isfinite(pr["loss"]).any() else "", fontsize=9)
    for a in axes[:, 1:].ravel():
        a.grid(False)
    fig.suptitle(f"Candidate crops (dashed) and the selected pair (solid, framed) at step {step}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# --- the report ---------------------------------------------------------------------------------


def analyse(run_dir: Path | str, baseline_dir: Path | str | None = None, out_dir: Path | str | None = None,
            gallery: int = 6, trees: int = 100, max_samples: int = 200_000) -> dict[str, Any]:
    """Write the figures and ``analysis.json`` (in ``out_dir``, default ``<run_dir>/analysis``)."""
    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    steps = load_steps(run_dir)
    if steps is None:
        raise SystemExit(f"{run_dir}/analysis/steps-r*.csv not found: was the run trained with analysis.online=true?")
    if not steps["hvp"].any():
        raise SystemExit(f"{run_dir} has no HVP selection steps: pass the HVP run first, the baseline second")
    base = load_steps(Path(baseline_dir)) if baseline_dir is not None else None
    if baseline_dir is not None and base is None:
        warnings.warn(f"{baseline_dir} has no analysis/steps-r*.csv; plotting without the baseline", stacklevel=2)
    result: dict[str, Any] = {"run_dir": str(run_dir), "baseline_dir": str(baseline_dir) if baseline_dir else None}
    result.update(summary_stats(steps))
    if base is not None:
        b = summary_stats(base, prefix="baseline_")
        result.update({k: b[k] for k in ("baseline_steps", "baseline_selected_iou_mean",
                                          "baseline_selected_rel_dist_mean", "baseline_selected_color_dist_mean")})
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
    pairs, views = load_table(run_dir, "pairs"), load_table(run_dir, "views")
    if pairs is None or views is None:
        notes.append("no Parquet view log (train with analysis.log_every_n_steps=K): no histogram, importance "
                     "or gallery")
        result["importance"] = {"skipped": "no Parquet view log"}
    else:
        base_pairs = load_table(Path(baseline_dir), "pairs") if baseline_dir is not None else None
        if baseline_dir is not None and base_pairs is None:
            notes.append("baseline has no Parquet view log: its histogram is left out (HVP's candidate pairs are "
                         "i.i.d. views from the same augmentation, i.e. what a baseline trains on)")
        fig("iou_hist", plot_iou_hist, pairs, base_pairs)
        result["logged_steps"] = int(len(np.unique(pairs["step"])))
        result["logged_pairs"] = int(len(pairs["step"]))
        imp = importance(pairs, trees=trees, max_samples=max_samples)
        result["importance"] = imp
        if "skipped" not in imp:
            fig("importance", plot_importance, imp)
            if imp["r2_test"] <= 0.05:
                notes.append(f"importance: the forest explains no held-out variance (R^2 = {imp['r2_test']:.2f}); "
                             "its main effects are noise -- log more steps")
        if gallery > 0:
            try:
                path = out / "gallery.png"
                plot_gallery(run_dir, views, pairs, path, gallery)
                figures["gallery"] = str(path)
            except (FileNotFoundError, OSError, KeyError, ValueError) as err:
                notes.append(f"gallery skipped: cannot rebuild the training images ({type(err).__name__}: {err})")
    result["figures"] = figures
    result["notes"] = notes
    (out / "analysis.json").write_text(json.dumps(_finite(result), indent=2) + "\n")
    return result


def _finite(x: Any) -> Any:
    """JSON has no NaN: map non-finite floats to None, recursively."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def log_to_wandb(run_dir: Path, result: dict[str, Any]) -> str | None:
    """Best effort: add the figures (as images) and scalar results to the run's W&B run,
    resumed by its id from ``<run_dir>/wandb/``. Returns the run id, or None if there is none."""
    import wandb

    runs = sorted((Path(run_dir) / "wandb").glob("*run-*-*"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return None
    run_id = runs[-1].name.rsplit("-", 1)[-1]
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(Path(run_dir) / "config.yaml")
    lc = cfg.get("logger", {})
    run = wandb.init(id=run_id, resume="allow", project=lc.get("project"), entity=lc.get("entity"),
                     dir=str(run_dir))
    run.log({f"analysis/{k}": wandb.Image(v) for k, v in result["figures"].items()})
    run.summary.update({f"analysis/{k}": v for k, v in _finite(result).items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
    run.finish()
    return run_id
