"""SimSiam (Chen & He, CVPR 2021, https://arxiv.org/abs/2011.10566) with Hard View Pretraining.

The loss and the candidate pair table: :mod:`hvp_lightning.losses.simsiam`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..losses.simsiam import simsiam_loss, simsiam_pair_table
from ..nn.heads import mlp
from ..selection import HardViewMixin
from ..settings.simsiam import SimSiamSettings
from .base import SSLMethod


class SimSiam(HardViewMixin, SSLMethod):
    """SimSiam as a LightningModule: backbone -> projector -> predictor, symmetric negative
    cosine with stop-gradient; with HVP off it is the original method.

    Settings: :class:`~hvp_lightning.settings.simsiam.SimSiamSettings` (the projector's and
    predictor's widths, ``fix_pred_lr``: the predictor at a constant learning rate, as the paper;
    ``batch_size``, ``optimizer``); construction: :class:`~hvp_lightning.methods.base.SSLMethod`.

    What HVP scores: :meth:`candidate_scores` returns ``(B, N(N-1)/2)``, the per-sample SimSiam
    loss of every pair of the N candidate views (:func:`simsiam_pair_table`); the mixin's
    default ``select_views`` gathers the chosen pair.
    """

    settings_type = SimSiamSettings
    settings: SimSiamSettings

    def build(self) -> None:
        s = self.settings
        self.projector = mlp(
            self.backbone.feature_dim, s.proj_hidden_dim, s.proj_dim, s.proj_layers, last_bn=True, last_bn_affine=False
        )
        self.predictor = mlp(s.proj_dim, s.pred_hidden_dim, s.proj_dim, 2, last_bn=False)

    def forward_view(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.projector(self.backbone(x))
        return z, self.predictor(z)

    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        x1, x2 = batch["views"]
        z1, p1 = self.forward_view(x1)
        z2, p2 = self.forward_view(x2)
        loss = simsiam_loss(p1, p2, z1, z2).mean()
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=x1.shape[0])
        # Collapse monitor from the SimSiam paper: std of l2-normalised z, ~1/sqrt(d) if healthy.
        self.log(
            "train/z_std",
            F.normalize(z1.detach().float(), dim=1).std(0).mean(),
            on_step=True,
            on_epoch=False,
            batch_size=x1.shape[0],
        )
        return loss

    def candidate_scores(self, batch: dict[str, Any]) -> torch.Tensor:
        # One forward of B per candidate view, as the training step normalises (BatchNorm
        # statistics over B images of one view set), rather than one of N*B.
        zs, ps = zip(*(self.forward_view(v) for v in batch["views"]))
        return simsiam_pair_table(torch.stack(ps), torch.stack(zs))

    def param_groups(self) -> list[dict[str, Any]]:
        pred = list(self.predictor.parameters())
        rest = [p for n, p in self.named_parameters() if not n.startswith("predictor.")]
        return [{"params": rest}, {"params": pred, "fixed_lr": self.settings.fix_pred_lr}]
