"""The shared LightningModule of the methods whose loss is a function of the whole batch
(VICReg, Barlow Twins): a bias-free-output projector, one forward per view, and a selection
score that is the leave-one-out increase of the batch loss (docs/DESIGN.md, section 3)."""

from __future__ import annotations

from typing import Any

import torch

from ..losses.simclr import gather_with_grad
from ..nn.heads import mlp
from ..selection import HardViewMixin
from .base import SSLMethod


class BatchLossMethod(HardViewMixin, SSLMethod):
    """Subclasses supply ``batch_loss`` (the official loss and its named terms) and
    ``pair_table`` (its leave-one-out candidate table)."""

    uncounted_selection_work = (
        "the leave-one-out table of the batch loss (0.15-0.81 of a baseline step, measured on the CPU: "
        "docs/DESIGN.md section 5)"
    )

    def build(self) -> None:
        m = self.settings
        # Linear-BN-ReLU x (L-1), then a Linear without bias (both official projectors): the
        # losses centre the embeddings, so an output bias would get no gradient.
        self.projector = mlp(
            self.backbone.feature_dim, m.proj_hidden_dim, m.proj_dim, m.proj_layers, last_bn=False, last_bias=False
        )

    def batch_loss(self, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError  # pragma: no cover

    def pair_table(self, z: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor], offset: int) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover

    def forward_view(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(x))

    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        x1, x2 = batch["views"]
        # One forward per view (BatchNorm over B), as the selection pass normalises.
        loss, terms = self.batch_loss(self.forward_view(x1), self.forward_view(x2))
        b = x1.shape[0]
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=b)
        for name, value in terms.items():  # the terms, to watch for collapse
            self.log(f"train/{name}", value.detach(), on_step=True, on_epoch=False, batch_size=b)
        return loss

    def candidate_scores(self, batch: dict[str, Any]) -> torch.Tensor:
        # One forward of B per candidate view set, as the training step normalises.
        z = torch.stack([self.forward_view(v) for v in batch["views"]])  # [N, B, D]
        # The other samples: every rank's, each on its pair (0, 1) (the baseline batch).
        ref1, offset = gather_with_grad(z[0])
        ref2, _ = gather_with_grad(z[1])
        return self.pair_table(z, (ref1, ref2), offset)
