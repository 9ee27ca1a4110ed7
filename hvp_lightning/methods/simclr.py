"""SimCLR (Chen et al., ICML 2020, https://arxiv.org/abs/2002.05709) with Hard View Pretraining.

Loss (official NT-Xent): every L2-normalised embedding is an anchor whose positive is the
other view of its image and whose negatives are the other 2B-2 embeddings of the batch
(of the global batch in DDP); the loss is the mean cross-entropy over all 2B anchors.
Per sample b that is the mean of its two anchor terms, so the batch mean is the official
loss. For HVP the loss of sample b on candidate pair (k, l) is the same expression with
candidate sets k and l as the two views (paper appendix "SimCLR", docs/DESIGN.md): one
similarity matrix over all N*B candidates, then per-(anchor set, key set) log-sum-exps.
The loss and the table: :mod:`hvp_lightning.losses.simclr`.
"""

from __future__ import annotations

from typing import Any

import torch

from ..losses.simclr import gather_with_grad, nt_xent_loss, simclr_pair_table
from ..nn.heads import mlp
from ..selection import HardViewMixin
from ..settings.simclr import SimCLRSettings
from .base import SSLMethod


class SimCLR(HardViewMixin, SSLMethod):
    """SimCLR as a LightningModule: backbone -> projector, NT-Xent with negatives from the
    global batch (all DDP ranks); with HVP off it is the original method.

    Settings: :class:`~hvp_lightning.settings.simclr.SimCLRSettings` (``temperature``, the
    projector's widths and layers, ``batch_size``, ``optimizer``); construction:
    :class:`~hvp_lightning.methods.base.SSLMethod`.

    What HVP scores: :meth:`candidate_scores` returns ``(B, N(N-1)/2)``, the per-sample NT-Xent
    of every pair of the N candidate views with all ranks' candidates as keys
    (:func:`simclr_pair_table`); the mixin's default ``select_views`` gathers the chosen pair.
    """

    settings_type = SimCLRSettings
    settings: SimCLRSettings

    def build(self) -> None:
        s = self.settings
        self.temperature = s.temperature
        # SimCLR head with BN (paper table: use-bn-in-head): Linear-BN-ReLU-...-Linear-BN.
        self.projector = mlp(self.backbone.feature_dim, s.proj_hidden_dim, s.proj_dim, s.proj_layers, last_bn=True)

    def forward_view(self, x: torch.Tensor) -> torch.Tensor:
        return self.projector(self.backbone(x))

    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        x1, x2 = batch["views"]
        # One forward per view (BatchNorm over B), as the selection pass normalises.
        z1, z2 = self.forward_view(x1), self.forward_view(x2)
        loss = nt_xent_loss(z1, z2, self.temperature, gather=True).mean()
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=x1.shape[0])
        return loss

    def candidate_scores(self, batch: dict[str, Any]) -> torch.Tensor:
        # One forward of B per candidate view, as the training step normalises.
        z = torch.stack([self.forward_view(v) for v in batch["views"]])  # [N, B, D]
        keys, offset = gather_with_grad(z, dim=1)  # DDP: negatives from every rank's candidates
        return simclr_pair_table(z, self.temperature, keys, offset)
