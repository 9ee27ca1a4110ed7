"""Hard views for your own LightningModule and your own loader: mix in ``HardViewMixin``,
set ``self.hvp`` and provide two hooks (the whole list a host may provide: docs/methods.md).

A tiny "negative cosine" method (a SimSiam without predictor, for brevity) trained on random,
unlabelled images. With ``HVPConfig(enabled=True)`` every training step first scores all
C(N,2) candidate pairs per image without gradients, keeps the hardest pair and then runs your
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

    # Optional hook, select_views(batch, choice, context): the mixin's default gathers the
    # chosen pair from batch["views"] (a list of N candidate batches); multi-crop methods override it.

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class NoisyViews(torch.utils.data.Dataset):
    """Your own unlabelled data: ``{"views": [N x [3, H, W]]}`` per image, no label needed.

    Random images, each seen through N "augmentations" (a random flip plus noise; put your
    own here), drawn from (seed, image index): the same views in every epoch and worker.
    """

    def __init__(self, num_images: int = 32, num_views: int = 4, size: int = 16, seed: int = 0) -> None:
        self.num_images, self.num_views, self.size, self.seed = num_images, num_views, size, seed

    def __len__(self) -> int:
        return self.num_images

    def __getitem__(self, i: int) -> dict[str, list[torch.Tensor]]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        image = torch.rand(3, self.size, self.size, generator=g)
        views = []
        for _ in range(self.num_views):
            flipped = image.flip(-1) if torch.rand((), generator=g) < 0.5 else image
            views.append(flipped + 0.1 * torch.randn(image.shape, generator=g))
        return {"views": views}


def random_views(
    num_images: int = 32, num_views: int = 4, size: int = 16, seed: int = 0
) -> torch.utils.data.DataLoader:
    """Batches ``{"views": [N x [B, 3, H, W]]}``: all the mixin reads of a batch."""
    return torch.utils.data.DataLoader(NoisyViews(num_images, num_views, size, seed), batch_size=8)


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
