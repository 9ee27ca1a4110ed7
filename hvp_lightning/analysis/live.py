"""What HVP picks, on the W&B dashboard while the run trains.

At every k-NN pass :class:`LiveGallery` logs

* ``hvp/gallery``: for a few images of the latest HVP batch, the selected pair of views next to
  the easiest candidate pair (the lowest loss, the one hard mode rejects most clearly), with
  both losses and crop IoUs in the caption;
* ``hvp/iou_histogram``: the crop-IoU histogram of the selected pairs against all candidate
  pairs of the HVP steps since the last pass (the paper's section 6 finding: hard pairs overlap
  less).

It is throttled so that it costs little: per HVP step it keeps only the ``[B, P]`` IoU table on
the batch's device (no host sync), once per epoch a copy of ``num_images`` images' candidate
views, and it draws and uploads only at the k-NN pass, on global rank zero. Without a W&B logger
or without HVP it is not added (:func:`live_gallery_callbacks`). The offline ``hvp-analysis``
report (:mod:`.report`) remains the place for the full analysis.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import numpy as np
import torch

from ..schema import TrainConfig
from .callback import head_views, pair_table
from .metrics import crop_iou

MAX_IOU_STEPS = 512  # IoU tables kept between two passes (the most recent ones)
MIN_SHOWN_PX = 96  # smaller views (CIFAR's 32 px) are enlarged by whole pixels to be visible on the dashboard


def to_display(view: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """A normalised ``[3, H, W]`` view -> uint8 ``[H, W, 3]`` for display (undoes the loader's
    ``(x / 255 - mean) / std``)."""
    m = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
    x = (view.detach().float().cpu() * s + m).clamp(0, 1).mul(255).round().to(torch.uint8)
    return x.permute(1, 2, 0).numpy()


def pair_strip(views: list[np.ndarray], gap: int = 4) -> np.ndarray:
    """Views side by side with white gaps: ``[a1 | b1 || a2 | b2]`` (a double gap between pairs),
    enlarged by an integer factor (nearest neighbour) to at least ``MIN_SHOWN_PX`` rows."""
    scale = max(1, -(-MIN_SHOWN_PX // views[0].shape[0]))
    views = [v.repeat(scale, axis=0).repeat(scale, axis=1) for v in views]
    h = views[0].shape[0]
    white = np.full((h, gap, 3), 255, np.uint8)
    parts: list[np.ndarray] = []
    for i, v in enumerate(views):
        if i:
            parts += [white, white] if i % 2 == 0 else [white]
        parts.append(v)
    return np.concatenate(parts, axis=1)


def gallery_rows(
    snapshot: Mapping[str, Any], mean: tuple[float, ...], std: tuple[float, ...]
) -> list[tuple[np.ndarray, str]]:
    """(image, caption) per sampled image: its selected pair beside its lowest-loss candidate pair."""
    rows = []
    pairs, table, choice, iou = snapshot["pairs"], snapshot["table"], snapshot["choice"], snapshot["iou"]
    for k in range(table.shape[0]):
        finite = torch.isfinite(table[k])
        rejected = int(torch.where(finite, table[k], torch.inf).argmin())
        chosen = int(choice[k])
        (a, b), (c, d) = pairs[chosen].tolist(), pairs[rejected].tolist()
        views = [to_display(snapshot["views"][k, v], mean, std) for v in (a, b, c, d)]
        caption = (
            f"image {int(snapshot['index'][k])} | selected views {a},{b}: loss {float(table[k, chosen]):.3f}, "
            f"IoU {float(iou[k, chosen]):.2f} | easiest views {c},{d}: loss {float(table[k, rejected]):.3f}, "
            f"IoU {float(iou[k, rejected]):.2f}"
        )
        rows.append((pair_strip(views), caption))
    return rows


def iou_histogram(selected: np.ndarray, candidates: np.ndarray, step: int):
    """A matplotlib figure: density histograms of the selected pairs' IoU and all candidate pairs'."""
    from .plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.8, 3.2))
    bins = np.linspace(0.0, 1.0, 26)
    ax.hist(candidates, bins=bins, density=True, alpha=0.5, label=f"all candidate pairs (n={candidates.size})")
    ax.hist(selected, bins=bins, density=True, alpha=0.6, label=f"selected pairs (n={selected.size})")
    ax.axvline(float(np.mean(candidates)), color="C0", ls="--", lw=1)
    ax.axvline(float(np.mean(selected)), color="C1", ls="--", lw=1)
    ax.set_xlabel("crop IoU of the pair")
    ax.set_ylabel("density")
    ax.set_title(
        f"HVP steps up to step {step}: mean IoU {np.mean(selected):.2f} vs {np.mean(candidates):.2f}", fontsize=9
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


class LiveGallery(L.Callback):
    """See the module docstring. ``seconds`` is the time spent in this callback (the cost check)."""

    def __init__(self, num_images: int = 4) -> None:
        if int(num_images) < 1:
            raise ValueError(f"logger.gallery_images={num_images!r}: expected an integer >= 1 (0 turns it off)")
        self.num_images = int(num_images)
        self.snapshot: dict[str, Any] | None = None
        self.snapshot_epoch = -1
        self.ious: list[tuple[torch.Tensor, torch.Tensor]] = []  # (selected [B], all [B, P]) per HVP step
        self.seconds = 0.0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        pl_module.last_selection = None  # a selection of this batch, if any, replaces it

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        sel = getattr(pl_module, "last_selection", None)
        if not trainer.is_global_zero or sel is None or not isinstance(batch, dict) or "params" not in batch:
            return
        start = time.perf_counter()
        n, pairs, reason = pair_table(pl_module, batch["params"])
        table, choice = sel["table"], sel["choice"]
        if reason is None and (table is None or table.shape[1] == pairs.shape[0]):  # None: min_iou, no losses
            iou = crop_iou(head_views(batch["params"], n), pairs)  # [B, P] on the batch's device
            self.ious = [*self.ious[-(MAX_IOU_STEPS - 1) :], (iou.gather(1, choice[:, None].to(iou.device))[:, 0], iou)]
            if table is not None and self.snapshot_epoch != trainer.current_epoch:  # a few images per epoch
                k = min(self.num_images, table.shape[0])
                self.snapshot = {
                    "views": torch.stack([v[:k] for v in batch["views"][:n]], dim=1).detach().cpu(),
                    "table": table[:k].detach().float().cpu(),
                    "choice": choice[:k].detach().cpu(),
                    "iou": iou[:k].cpu(),
                    "pairs": pairs.cpu(),
                    "step": trainer.global_step,
                    "index": torch.as_tensor(batch.get("index", torch.full((k,), -1)))[:k].cpu(),
                }
                self.snapshot_epoch = trainer.current_epoch
        self.seconds += time.perf_counter() - start

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or self.snapshot is None or trainer.sanity_checking:
            return
        start = time.perf_counter()
        import wandb

        from .plots import pyplot

        aug = trainer.datamodule.views[0]  # type: ignore[attr-defined]
        rows = gallery_rows(self.snapshot, aug.mean, aug.std)
        logged: dict[str, Any] = {
            "hvp/gallery": [wandb.Image(img, caption=cap) for img, cap in rows],
            "hvp/gallery_step": self.snapshot["step"],
        }
        if self.ious:
            selected = torch.cat([s for s, _ in self.ious]).float().cpu().numpy()
            candidates = torch.cat([a.reshape(-1) for _, a in self.ious]).float().cpu().numpy()
            fig = iou_histogram(selected, candidates, trainer.global_step)
            logged["hvp/iou_histogram"] = wandb.Image(fig)
            pyplot().close(fig)
            self.ious = []
        trainer.logger.experiment.log({**logged, "trainer/global_step": trainer.global_step})  # type: ignore[union-attr]
        self.seconds += time.perf_counter() - start


def live_gallery_callbacks(cfg: TrainConfig) -> list[L.Callback]:
    """``[LiveGallery]`` for a W&B run with HVP on and ``logger.gallery_images`` > 0, else ``[]``."""
    if cfg.logger.name != "wandb" or not cfg.hvp_on:
        return []
    n = cfg.logger.gallery_images
    return [LiveGallery(n)] if n > 0 else []
