"""VICReg (Bardes, Ponce and LeCun, ICLR 2022, https://arxiv.org/abs/2105.04906) with Hard View Pretraining.

The loss (:func:`~hvp_lightning.losses.vicreg.vicreg_loss`) is the official one: MSE invariance,
variance hinge and covariance penalty, the last two over every rank's embeddings. Candidate
pairs are scored by the leave-one-out increase of that batch loss (docs/DESIGN.md, section 3).
"""

from __future__ import annotations

import torch

from ..losses.vicreg import vicreg_loss_terms, vicreg_pair_table
from ..settings.vicreg import VICRegSettings
from .batch_stats import BatchLossMethod


class VICReg(BatchLossMethod):
    """VICReg: backbone + 3-layer expander, trained with :func:`~hvp_lightning.losses.vicreg.vicreg_loss`
    over the global batch. Settings: :class:`~hvp_lightning.settings.vicreg.VICRegSettings`
    (``sim_coeff``, ``std_coeff``, ``cov_coeff``, the projector, ``batch_size``, ``optimizer``).
    HVP scores each candidate pair by the leave-one-out increase of the batch loss
    (:func:`~hvp_lightning.losses.vicreg.vicreg_pair_table`).
    """

    settings_type = VICRegSettings
    settings: VICRegSettings

    def build(self) -> None:
        super().build()
        m = self.settings
        self.coeffs = (m.sim_coeff, m.std_coeff, m.cov_coeff)

    def batch_loss(self, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        terms = vicreg_loss_terms(z1, z2, gather=True)
        loss = sum(c * t for c, t in zip(self.coeffs, terms))
        return loss, dict(zip(("invariance", "variance", "covariance"), terms))  # type: ignore[return-value]

    def pair_table(self, z: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor], offset: int) -> torch.Tensor:
        return vicreg_pair_table(z, *self.coeffs, reference=reference, offset=offset)
