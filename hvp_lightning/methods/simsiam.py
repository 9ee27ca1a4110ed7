"""SimSiam (Chen & He, CVPR 2021) with Hard View Pretraining.

Loss (official): L = -1/2 [cos(p1, sg(z2)) + cos(p2, sg(z1))], averaged over the batch.
Per-sample candidate loss for views (k, l) is the same expression on those views
(docs/DESIGN.md); every pair of every sample comes from one ``[B, N, N]`` cosine table.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..heads import mlp
from ..selection import HardViewMixin, exact_fp32, pair_index
from .base import SSLMethod


def simsiam_loss(p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Per-sample SimSiam loss ``[B]``; the mean over the batch is the official loss.
    In fp32 under mixed precision (cosines of bf16 vectors carry ~1e-2 error)."""
    p1, p2, z1, z2 = p1.float(), p2.float(), z1.detach().float(), z2.detach().float()
    return -0.5 * (F.cosine_similarity(p1, z2, dim=-1) + F.cosine_similarity(p2, z1, dim=-1))


def simsiam_pair_table(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Per-sample loss of every view pair: ``p``, ``z`` are ``[N, B, D]`` -> ``[B, N(N-1)/2]``.

    Column c is pair ``pair_index(N)[c]``; entry (b, c) equals ``simsiam_loss`` of sample b
    on that pair. In fp32 even under a low-precision selection autocast: the argmax must rank
    the loss the method computes.
    """
    with exact_fp32(p.device.type):
        cos = torch.einsum("kbd,lbd->bkl", F.normalize(p.float(), dim=-1), F.normalize(z.float(), dim=-1))
    k, l = pair_index(p.shape[0], device=p.device).unbind(1)
    return -0.5 * (cos[:, k, l] + cos[:, l, k])


class SimSiam(HardViewMixin, SSLMethod):
    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        m = self.cfg.method
        self.projector = mlp(self.backbone.feature_dim, m.proj_hidden_dim, m.proj_dim, m.proj_layers,
                             last_bn=True, last_bn_affine=False)
        self.predictor = mlp(m.proj_dim, m.pred_hidden_dim, m.proj_dim, 2, last_bn=False)

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
        self.log("train/z_std", F.normalize(z1.detach().float(), dim=1).std(0).mean(), on_step=True, on_epoch=False,
                 batch_size=x1.shape[0])
        return loss

    def candidate_scores(self, batch: dict[str, Any]) -> torch.Tensor:
        # One forward of B per candidate view, as the training step normalises (BatchNorm
        # statistics over B images of one view set), rather than one of N*B.
        zs, ps = zip(*(self.forward_view(v) for v in batch["views"]))
        return simsiam_pair_table(torch.stack(ps), torch.stack(zs))

    def param_groups(self) -> list[dict[str, Any]]:
        pred = list(self.predictor.parameters())
        rest = [p for n, p in self.named_parameters() if not n.startswith("predictor.")]
        return [{"params": rest}, {"params": pred, "fixed_lr": bool(self.cfg.method.fix_pred_lr)}]
