"""VICReg's loss (hvp_lightning/losses/vicreg.py) against a loop-form reference of the official
formula. Its leave-one-out candidate table is checked against brute force in test_swap.py."""

from __future__ import annotations

import math

import pytest
import torch

from hvp_lightning.losses.vicreg import vicreg_loss


def loop_vicreg(
    x: list[list[float]], y: list[list[float]], lam: float = 25.0, mu: float = 25.0, nu: float = 1.0
) -> float:
    """The official VICReg loss (main_vicreg.py) with a loop per sum. (The paper's Algorithm 1
    adds the two branches' variance terms; the official code averages them, as here.)"""
    m, d = len(x), len(x[0])
    inv = sum((x[i][j] - y[i][j]) ** 2 for i in range(m) for j in range(d)) / (m * d)
    var = cov = 0.0
    for z in (x, y):
        mean = [sum(z[i][j] for i in range(m)) / m for j in range(d)]
        c = [
            [sum((z[i][p] - mean[p]) * (z[i][q] - mean[q]) for i in range(m)) / (m - 1) for q in range(d)]
            for p in range(d)
        ]
        var += sum(max(0.0, 1 - math.sqrt(c[j][j] + 1e-4)) for j in range(d)) / d / 2
        cov += sum(c[p][q] ** 2 for p in range(d) for q in range(d) if p != q) / d
    return lam * inv + mu * var + nu * cov


def _embeddings(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("scale", [0.3, 2.0])  # std below 1 (hinge active) and above (inactive)
def test_loss_matches_loop_reference(scale: float) -> None:
    x, y = _embeddings(7, 5, seed=0, scale=scale), _embeddings(7, 5, seed=1, scale=scale)
    expected = loop_vicreg(x.tolist(), y.tolist())
    assert vicreg_loss(x, y).item() == pytest.approx(expected, rel=1e-10)
    assert vicreg_loss(x.float(), y.float()).item() == pytest.approx(expected, rel=1e-5)  # the training dtype
