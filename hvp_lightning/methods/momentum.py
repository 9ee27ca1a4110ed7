"""The architecture BYOL and MoCo v3 share, written once: an online network (backbone ->
projector -> predictor) trained against a momentum target (EMA copies of backbone and
projector, no gradient), both applied to each view on its own (BatchNorm over the B images
of one view, in the training step and in HVP's selection pass alike).

The methods differ only in their loss (:mod:`hvp_lightning.losses.byol`,
:mod:`hvp_lightning.losses.mocov3`), their heads' sizes and their base momentum. The target
moves once per optimiser step (:class:`~hvp_lightning.nn.teacher.MomentumTargetMixin`); the
selection pass never moves it, and its BatchNorm buffers are frozen by the mixin's
``frozen_state`` like the online network's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..nn.heads import mlp
from ..nn.teacher import MomentumTargetMixin, make_teacher
from ..selection import HardViewMixin
from .base import SSLMethod


class OnlineTargetMethod(MomentumTargetMixin, HardViewMixin, SSLMethod):
    """Online/target pair with HVP. Subclasses provide :meth:`pair_loss` (per sample) and
    :meth:`pair_table` (every candidate pair); the step and the selection pass are here. Settings:
    :class:`~hvp_lightning.settings.method.MomentumPairSettings`."""

    momentum_key = "base_momentum"
    momentum_log = "train/target_momentum"

    def build(self) -> None:
        m = self.settings
        # A last BatchNorm (MoCo v3's projectors, its ViT predictor) has no affine parameters,
        # as in the MoCo v3 code; BYOL's MLPs end in a Linear layer.
        self.projector = mlp(
            self.backbone.feature_dim,
            m.proj_hidden_dim,
            m.proj_dim,
            m.proj_layers,
            last_bn=m.proj_last_bn,
            last_bn_affine=False,
        )
        self.predictor = mlp(
            m.proj_dim, m.pred_hidden_dim, m.proj_dim, m.pred_layers, last_bn=m.pred_last_bn, last_bn_affine=False
        )
        # Target initialised as a copy of the online network (both papers).
        self.target = nn.ModuleDict(
            {"backbone": make_teacher(self.backbone), "projector": make_teacher(self.projector)}
        )

    # --- hooks for the two methods -------------------------------------------------------------
    def pair_loss(
        self, p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor
    ) -> torch.Tensor:  # pragma: no cover
        """Per-sample loss ``[B]`` of online outputs ``p1``, ``p2`` and target outputs ``z1``, ``z2``."""
        raise NotImplementedError

    def pair_table(self, p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """``[B, P]``: :meth:`pair_loss` of every candidate pair, from ``p``, ``z`` ``[N, B, D]``."""
        raise NotImplementedError

    # --- networks -----------------------------------------------------------------------------
    def momentum_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.target["backbone"], self.backbone), (self.target["projector"], self.projector)]

    def online(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictor(self.projector(self.backbone(x)))

    @torch.no_grad()
    def target_out(self, x: torch.Tensor) -> torch.Tensor:
        return self.target["projector"](self.target["backbone"](x))

    # --- training step and HVP hook -----------------------------------------------------------
    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        x1, x2 = batch["views"]
        p1, p2 = self.online(x1), self.online(x2)
        z1, z2 = self.target_out(x1), self.target_out(x2)
        loss = self.pair_loss(p1, p2, z1, z2).mean()
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=x1.shape[0])
        return loss

    def candidate_scores(self, batch: dict[str, Any]) -> torch.Tensor:
        # One forward of B per candidate view, as the training step normalises.
        views = batch["views"]
        p = torch.stack([self.online(v) for v in views])
        z = torch.stack([self.target_out(v) for v in views])
        return self.pair_table(p, z)
