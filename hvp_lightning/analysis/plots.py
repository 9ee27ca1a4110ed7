"""The report's figures of per-step statistics and importances (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.ticker import MaxNLocator

FEATURE_LABELS = {
    "iou": "IoU",
    "rel_dist": "relative distance",
    "color_dist": "colour distance",
    "brightness_diff": "|Δ brightness|",
    "contrast_diff": "|Δ contrast|",
    "saturation_diff": "|Δ saturation|",
    "hue_diff": "|Δ hue|",
}
HVP_COLOR, CAND_COLOR, BASE_COLOR = "tab:blue", "tab:gray", "tab:orange"


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, with the report's style."""
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
    plt = pyplot()
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
    plt = pyplot()
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


def plot_lowest_share_compare(runs: list[tuple[str, np.ndarray, np.ndarray]], chance: float, path: Path) -> None:
    """The lowest-IoU share per epoch of several HVP runs (``(label, epochs, shares)`` each), e.g.
    per-view against static colour (paper Fig. 4 right)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for (label, epochs, share), color in zip(runs, (HVP_COLOR, "tab:green", "tab:red", "tab:purple", BASE_COLOR)):
        ax.plot(epochs, 100 * share, "o-", color=color, lw=2, label=label)
    ax.axhline(100 * chance, color="k", ls="--", lw=1.5, label=f"chance = {100 * chance:.1f}%")
    ax.set_xlabel("epoch")
    ax.set_ylabel("selected pair = lowest-IoU pair (% of samples)")
    ax.set_ylim(0, 100)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("How often HVP's pair is also the lowest-IoU pair")
    ax.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_iou_hist(pairs: dict[str, np.ndarray], base_pairs: dict[str, np.ndarray] | None, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    bins = np.linspace(0, 1, 26)
    h = pairs["hvp"]
    sel = pairs["iou"][h & pairs["selected"]]
    ax.hist(
        pairs["iou"][h],
        bins=bins,
        density=True,
        histtype="step",
        lw=2,
        ls="--",
        color=CAND_COLOR,
        label=f"HVP: all candidate pairs (n={h.sum()})",
    )
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
    plt = pyplot()
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
