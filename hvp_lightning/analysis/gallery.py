"""The view gallery (paper Fig. 1b): candidate crops drawn on their source images, the
selected pair framed, next to the views replayed from their logged augmentation parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..run.directory import RunDir
from .plots import pyplot


def replay_view(img, row: dict[str, Any], aug):
    """Re-apply one logged view's augmentation to the uint8 source image ``[3, H, W]``: crop,
    flip, jitter in its logged order, grayscale, blur, solarize (before normalisation), with
    the reference kernels of :func:`hvp_lightning.data.augment.augment` and the size, resize
    and blur of ``aug`` (the run's :class:`~hvp_lightning.data.augment.ViewAug`)."""
    from ..data.augment import crop_flip, reference_colour

    return reference_colour(crop_flip(img, row, aug.size, aug.interpolation), row, aug)


def load_train_images(run_dir: Path):
    """The run's training set as the data module built it (``index`` in the logs points into it)."""
    from omegaconf import OmegaConf

    from ..config import stored_config
    from ..data.datamodule import SSLDataModule

    cfg = stored_config(OmegaConf.load(RunDir.of(run_dir).config))
    data = cfg.data.model_copy(update={"on_device": False})  # the raw images are all it needs: no stacked copy
    dm = SSLDataModule(data, (), 1, 0, cfg.seed)
    dm.setup("fit")
    return cfg, dm.train_raw


def plot_gallery(
    run_dir: Path, views: dict[str, np.ndarray], pairs: dict[str, np.ndarray], path: Path, num_images: int = 6
) -> None:
    """Fig. 1b: per image, the source with all candidate crops (selected pair solid and thick)
    and the replayed candidate views, the selected ones framed."""
    from matplotlib.patches import Rectangle

    from ..data.augment import to_uint8_tensor
    from ..data.datamodule import view_aug

    plt = pyplot()
    cfg, raw = load_train_images(run_dir)
    hv = pairs["hvp"]
    step = int(pairs["step"][hv].max()) if hv.any() else int(pairs["step"].max())
    rank0 = int(pairs["rank"].min())
    at = (pairs["step"] == step) & (pairs["rank"] == rank0) & (pairs.get("micro", 0) == 0)
    samples = np.unique(pairs["sample"][at])[:num_images]
    vat = (views["step"] == step) & (views["rank"] == rank0) & (views.get("micro", 0) == 0)
    n = int(views["view"][vat].max()) + 1
    aug = view_aug(cfg.data)
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
            ax.add_patch(
                Rectangle(
                    (row["crop_x"], row["crop_y"]),
                    row["crop_w"],
                    row["crop_h"],
                    fill=False,
                    ec=colors[v % 10],
                    lw=3.2 if chosen_v else 1.3,
                    ls="-" if chosen_v else "--",
                )
            )
            view = replay_view(img, row, aug)
            vax = axes[r, v + 1]
            vax.imshow(view.permute(1, 2, 0).numpy(), interpolation="nearest")
            vax.set_xticks([])
            vax.set_yticks([])
            for sp in vax.spines.values():
                sp.set_edgecolor(colors[v % 10])
                sp.set_linewidth(5 if chosen_v else 1.5)
            vax.set_title(
                f"view {v}" + (" (selected)" if chosen_v else ""),
                fontsize=9,
                fontweight="bold" if chosen_v else "normal",
                color=colors[v % 10],
            )
        ax.set_xlim(0, wid)
        ax.set_ylim(hgt, 0)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
        k = chosen[0] if len(chosen) else 0
        low = float(pr["iou"].min())
        ax.set_title(f"image {int(vr['index'][0])}: IoU sel. {pr['iou'][k]:.2f} (min {low:.2f})", fontsize=9)
        ax.set_ylabel(
            f"loss sel. {pr['loss'][k]:.3f}\nmean {np.nanmean(pr['loss']):.3f}"
            if np.isfinite(pr["loss"]).any()
            else "",
            fontsize=9,
        )
    for a in axes[:, 1:].ravel():
        a.grid(False)
    fig.suptitle(f"Candidate crops (dashed) and the selected pair (solid, framed) at step {step}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
