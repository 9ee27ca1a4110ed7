"""BYOL (Grill et al., NeurIPS 2020, https://arxiv.org/abs/2006.07733) with Hard View Pretraining.

Online network (backbone, projector, predictor) and an EMA target network (backbone,
projector) with momentum ``tau`` rising from ``method.base_momentum`` (0.996) to 1 on a
cosine over training; loss ``2 - 2 cos(p1, sg z2') + 2 - 2 cos(p2, sg z1')`` averaged over
the batch (:mod:`hvp_lightning.losses.byol`). No negatives: samples are independent, so the
selection's per-sample table is exact, as SimSiam's.
"""

from __future__ import annotations

import torch

from ..losses.byol import byol_loss, byol_pair_table
from ..settings.byol import BYOLSettings
from .momentum import OnlineTargetMethod


class BYOL(OnlineTargetMethod):
    """BYOL as a LightningModule: online network regressing an EMA target's projections
    (see module docstring); with HVP off it is the original method.

    Settings: :class:`~hvp_lightning.settings.byol.BYOLSettings` (the heads, ``base_momentum``,
    ``batch_size``, ``optimizer``); construction: :class:`~hvp_lightning.methods.base.SSLMethod`.

    What HVP scores: ``(B, N(N-1)/2)``, the per-sample BYOL loss of every pair of the N
    candidate views (:func:`byol_pair_table`).
    """

    settings_type = BYOLSettings
    settings: BYOLSettings

    def pair_loss(self, p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        return byol_loss(p1, p2, z1, z2)

    def pair_table(self, p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return byol_pair_table(p, z)
