"""MoCo v3 (Chen, Xie & He, ICCV 2021, https://arxiv.org/abs/2104.02057) with Hard View Pretraining.

Base encoder (backbone, projector) with a predictor on the query side and a momentum
encoder (backbone, projector) moved once per optimiser step with momentum rising from
``method.base_momentum`` (0.99) to 1 on a cosine (``--moco-m-cos``), applied, as in the
official code, before the next step's keys are computed. Loss
``ctr(q1, k2) + ctr(q2, k1)``, ``ctr`` the InfoNCE of a query against every key of the
global batch (all ranks' keys, gathered) scaled by ``2 tau`` (:mod:`hvp_lightning.losses.mocov3`).
The selection scores each candidate pair against the keys of the two candidate sets of every
sample on every rank, as SimCLR's selection takes its negatives.
"""

from __future__ import annotations

import torch

from ..losses.mocov3 import mocov3_loss, mocov3_pair_table
from ..losses.simclr import gather_with_grad
from ..settings.mocov3 import MoCoV3Settings
from .momentum import OnlineTargetMethod


class MoCoV3(OnlineTargetMethod):
    """MoCo v3 as a LightningModule: queries against a momentum encoder's keys of the whole
    batch (see module docstring); with HVP off it is the original method.

    Settings: :class:`~hvp_lightning.settings.mocov3.MoCoV3Settings` (the heads, ``base_momentum``,
    ``temperature``, ``batch_size``, ``optimizer``); construction: :class:`~hvp_lightning.methods.base.SSLMethod`.

    What HVP scores: ``(B, N(N-1)/2)``, the per-sample MoCo v3 loss of every pair of the N
    candidate views with all ranks' candidate keys (:func:`mocov3_pair_table`).
    """

    settings_type = MoCoV3Settings
    settings: MoCoV3Settings
    momentum_lag = 0  # the official update happens at the start of the step, with that step's momentum

    def build(self) -> None:
        super().build()
        self.temperature = self.settings.temperature

    def pair_loss(self, p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        return mocov3_loss(p1, p2, z1, z2, self.temperature, gather=True)

    def pair_table(self, p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        keys, offset = gather_with_grad(z, dim=1)  # DDP: keys from every rank's candidates
        return mocov3_pair_table(p, keys, self.temperature, offset)
