"""SimSiam's per-sample loss against the official formula."""

from __future__ import annotations

import torch

from hvp_lightning.losses import simsiam_loss


def official_simsiam_loss(p1, p2, z1, z2):
    """The SimSiam repository's main_simsiam.py formulation."""
    criterion = torch.nn.CosineSimilarity(dim=1)
    return -(criterion(p1, z2.detach()).mean() + criterion(p2, z1.detach()).mean()) * 0.5


def test_loss_matches_official_formula():
    g = torch.Generator().manual_seed(0)
    p1, p2, z1, z2 = (torch.randn(6, 32, generator=g) for _ in range(4))
    assert torch.allclose(simsiam_loss(p1, p2, z1, z2).mean(), official_simsiam_loss(p1, p2, z1, z2))
