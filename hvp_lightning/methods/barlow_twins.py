"""Barlow Twins (Zbontar et al., ICML 2021, https://arxiv.org/abs/2103.03230) with Hard View Pretraining.

The loss (:func:`~hvp_lightning.losses.barlow_twins.barlow_twins_loss`) is the official one:
cross-correlation of per-feature standardised embeddings over the global batch. The
standardisation is part of the loss function rather than a ``BatchNorm1d(affine=False)`` module:
the same values in training (batch statistics, synchronised over the ranks), and the selection
score must recompute it for every candidate anyway (docs/DESIGN.md, section 3); the module's
running statistics were never read by anything. Weights and biases/BN parameters get separate
learning rates (``method.optimizer.base_lr`` and ``base_lr_biases``), as in the paper.
"""

from __future__ import annotations

from typing import Any

import torch

from ..losses.barlow_twins import barlow_twins_loss_terms, barlow_twins_pair_table
from ..settings.barlow_twins import BarlowTwinsSettings
from .batch_stats import BatchLossMethod


class BarlowTwins(BatchLossMethod):
    """Barlow Twins: backbone + 3-layer projector, trained with
    :func:`~hvp_lightning.losses.barlow_twins.barlow_twins_loss` over the global batch. Settings:
    :class:`~hvp_lightning.settings.barlow_twins.BarlowTwinsSettings` (``lambd``, the projector,
    ``optimizer.base_lr_biases``, ...). HVP scores each candidate pair by the leave-one-out increase
    of the batch loss (:func:`~hvp_lightning.losses.barlow_twins.barlow_twins_pair_table`).
    """

    settings_type = BarlowTwinsSettings
    settings: BarlowTwinsSettings

    def build(self) -> None:
        super().build()
        self.lambd = self.settings.lambd

    def batch_loss(self, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        on_diag, off_diag = barlow_twins_loss_terms(z1, z2)
        return on_diag + self.lambd * off_diag, {"on_diagonal": on_diag, "off_diagonal": off_diag}

    def pair_table(self, z: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor], offset: int) -> torch.Tensor:
        return barlow_twins_pair_table(z, self.lambd, reference=reference, offset=offset)

    def param_groups(self) -> list[dict[str, Any]]:
        """Weights at ``base_lr``, biases and BN parameters (1-D) at ``base_lr_biases`` (both
        scaled by the global batch / 256 and the schedule), as the official code's two groups."""
        o = self.settings.optimizer
        params = [p for p in self.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.ndim > 1]},
            {"params": [p for p in params if p.ndim <= 1], "lr_scale": o.base_lr_biases / o.base_lr},
        ]
