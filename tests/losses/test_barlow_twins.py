"""Barlow Twins' loss (hvp_lightning/losses/barlow_twins.py) against a loop-form reference of the
official formula and the official BatchNorm1d form. Its leave-one-out candidate table is checked
against brute force in test_swap.py."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hvp_lightning.losses.barlow_twins import barlow_twins_loss

LAMBD = 0.3  # lambda in the tests: large enough that both terms matter at D=5


def loop_barlow(x: list[list[float]], y: list[list[float]], lambd: float, eps: float = 1e-5) -> float:
    """Barlow Twins (paper Algorithm 1 with the official code's normalisation: BatchNorm1d,
    biased variance, eps 1e-5), one loop per sum."""
    m, d = len(x), len(x[0])

    def norm(z: list[list[float]]) -> list[list[float]]:
        mean = [sum(z[i][j] for i in range(m)) / m for j in range(d)]
        var = [sum((z[i][j] - mean[j]) ** 2 for i in range(m)) / m for j in range(d)]
        return [[(z[i][j] - mean[j]) / math.sqrt(var[j] + eps) for j in range(d)] for i in range(m)]

    a, b = norm(x), norm(y)
    c = [[sum(a[i][p] * b[i][q] for i in range(m)) / m for q in range(d)] for p in range(d)]
    return sum((1 - c[p][p]) ** 2 for p in range(d)) + lambd * sum(
        c[p][q] ** 2 for p in range(d) for q in range(d) if p != q
    )


def official_barlow(z1: torch.Tensor, z2: torch.Tensor, lambd: float) -> torch.Tensor:
    """The official code's forward on projector outputs: ``BatchNorm1d(affine=False)`` in training mode."""
    bn = nn.BatchNorm1d(z1.shape[1], affine=False).to(z1.dtype)
    c = bn(z1).T @ bn(z2) / z1.shape[0]
    off = c - torch.diag(c.diagonal())
    return (c.diagonal() - 1).pow(2).sum() + lambd * off.pow(2).sum()


def _embeddings(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("scale", [0.3, 2.0])
def test_loss_matches_loop_reference(scale: float) -> None:
    x, y = _embeddings(7, 5, seed=0, scale=scale), _embeddings(7, 5, seed=1, scale=scale)
    expected = loop_barlow(x.tolist(), y.tolist(), LAMBD)
    assert barlow_twins_loss(x, y, LAMBD).item() == pytest.approx(expected, rel=1e-10)
    assert barlow_twins_loss(x.float(), y.float(), LAMBD).item() == pytest.approx(expected, rel=1e-5)


def test_barlow_twins_equals_official_batchnorm_form() -> None:
    x, y = _embeddings(9, 6, seed=2, scale=3.0) + 1.0, _embeddings(9, 6, seed=3)
    torch.testing.assert_close(barlow_twins_loss(x, y, 0.0051), official_barlow(x, y, 0.0051))
