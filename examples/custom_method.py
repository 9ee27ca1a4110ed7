"""Hard views for your own LightningModule: mix in ``HardViewMixin`` and provide three hooks.

A tiny "negative cosine" method (a SimSiam without predictor, for brevity) trained on random
images. With ``HVPConfig(enabled=True)`` every training step first scores all C(N,2)
candidate pairs per image without gradients, keeps the hardest pair and then runs your
ordinary step on it; with HVP off the step is your step, untouched.

    python examples/custom_method.py          # a few steps on random data, CPU
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from hvp_lightning import HardViewMixin, HVPConfig, pair_index


def pair_loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Per-sample loss of a pair of views: negative cosine similarity, ``[B]``."""
    return -F.cosine_similarity(z1, z2, dim=-1)


class CosineSSL(HardViewMixin, L.LightningModule):  # the mixin goes first: it owns training_step
    def __init__(self, hvp: HVPConfig, dim: int = 16) -> None:
        super().__init__()
        self.hvp = hvp  # the mixin reads the HVP settings from here
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, dim)
        )

    # Hook 1: the per-sample loss of every candidate pair, [B, C] with C = N(N-1)/2 columns in
    # pair_index(N) order (the mixin calls it without gradients, with BatchNorm buffers frozen).
    def candidate_scores(self, batch: dict[str, Any]) -> torch.Tensor:
        z = torch.stack([self.encoder(v) for v in batch["views"]])  # [N, B, D]
        pairs = pair_index(z.shape[0], device=z.device)
        return torch.stack([pair_loss(z[k], z[l]) for k, l in pairs.tolist()], dim=1)

    # Hook 2: your ordinary training step on a 2-view batch.
    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        v1, v2 = batch["views"]
        return pair_loss(self.encoder(v1), self.encoder(v2)).mean()

    # Hook 3, select_views(batch, choice): the mixin's default gathers the chosen pair from
    # batch["views"] (a list of N candidate batches); multi-crop methods override it.

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def random_views(num_images: int = 32, num_views: int = 4, size: int = 16, seed: int = 0):
    """A loader of ``{"views": [N x [B, 3, H, W]], "label": [B]}`` batches (your augmentations here)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(num_images, 3, size, size, generator=g)
    views = [images + 0.1 * torch.randn(images.shape, generator=g) for _ in range(num_views)]
    data = [{"views": [v[i] for v in views], "label": torch.tensor(0)} for i in range(num_images)]
    return torch.utils.data.DataLoader(data, batch_size=8)


def main(max_steps: int = 4) -> CosineSSL:
    model = CosineSSL(HVPConfig(enabled=True, num_views=4, mode="hard"))
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, random_views())
    print(f"trained {trainer.global_step} HVP steps; last selection: {model.last_selection['choice'].tolist()}")
    return model


if __name__ == "__main__":
    main()
