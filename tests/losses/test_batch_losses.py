"""VICReg and Barlow Twins losses (hvp_lightning/losses/vicreg.py, barlow_twins.py; one file for
both, as the same checks run on each): the losses against loop-form references of the official
formulas, the leave-one-out candidate tables against brute force (the whole batch loss recomputed
for every sample and candidate pair), the choice against brute force."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
import torch
from torch import nn

from hvp_lightning.losses.barlow_twins import barlow_twins_loss, barlow_twins_pair_table
from hvp_lightning.losses.vicreg import vicreg_loss, vicreg_pair_table
from hvp_lightning.selection import choose


LAMBD = 0.3  # Barlow Twins' lambda in the tests: large enough that both terms matter at D=5


# --- references in loop form ------------------------------------------------------------------


def loop_vicreg(x: list[list[float]], y: list[list[float]], lam: float = 25.0, mu: float = 25.0,
                nu: float = 1.0) -> float:
    """The official VICReg loss (main_vicreg.py) with a loop per sum. (The paper's Algorithm 1
    adds the two branches' variance terms; the official code averages them, as here.)"""
    m, d = len(x), len(x[0])
    inv = sum((x[i][j] - y[i][j]) ** 2 for i in range(m) for j in range(d)) / (m * d)
    var = cov = 0.0
    for z in (x, y):
        mean = [sum(z[i][j] for i in range(m)) / m for j in range(d)]
        c = [[sum((z[i][p] - mean[p]) * (z[i][q] - mean[q]) for i in range(m)) / (m - 1) for q in range(d)]
             for p in range(d)]
        var += sum(max(0.0, 1 - math.sqrt(c[j][j] + 1e-4)) for j in range(d)) / d / 2
        cov += sum(c[p][q] ** 2 for p in range(d) for q in range(d) if p != q) / d
    return lam * inv + mu * var + nu * cov


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
        c[p][q] ** 2 for p in range(d) for q in range(d) if p != q)


def official_barlow(z1: torch.Tensor, z2: torch.Tensor, lambd: float) -> torch.Tensor:
    """The official code's forward on projector outputs: ``BatchNorm1d(affine=False)`` in training mode."""
    bn = nn.BatchNorm1d(z1.shape[1], affine=False).to(z1.dtype)
    c = bn(z1).T @ bn(z2) / z1.shape[0]
    off = c - torch.diag(c.diagonal())
    return (c.diagonal() - 1).pow(2).sum() + lambd * off.pow(2).sum()


LOSSES = {
    "vicreg": (lambda x, y: vicreg_loss(x, y), loop_vicreg, lambda z, **kw: vicreg_pair_table(z, **kw)),
    "barlow_twins": (lambda x, y: barlow_twins_loss(x, y, LAMBD), lambda x, y: loop_barlow(x, y, LAMBD),
                     lambda z, **kw: barlow_twins_pair_table(z, LAMBD, **kw)),
}


def _embeddings(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("method", list(LOSSES))
@pytest.mark.parametrize("scale", [0.3, 2.0])  # VICReg: std below 1 (hinge active) and above (inactive)
def test_loss_matches_loop_reference(method: str, scale: float) -> None:
    loss, loop, _ = LOSSES[method]
    x, y = _embeddings(7, 5, seed=0, scale=scale), _embeddings(7, 5, seed=1, scale=scale)
    expected = loop(x.tolist(), y.tolist())
    assert loss(x, y).item() == pytest.approx(expected, rel=1e-10)
    assert loss(x.float(), y.float()).item() == pytest.approx(expected, rel=1e-5)  # the training dtype


def test_barlow_twins_equals_official_batchnorm_form() -> None:
    x, y = _embeddings(9, 6, seed=2, scale=3.0) + 1.0, _embeddings(9, 6, seed=3)
    torch.testing.assert_close(barlow_twins_loss(x, y, 0.0051), official_barlow(x, y, 0.0051))


def brute_force_table(method: str, z: torch.Tensor) -> torch.Tensor:
    """``[B, P]``: M x (batch loss with sample b on pair (k, l), every other on (0, 1) - all on (0, 1))."""
    loss = LOSSES[method][0]
    n, b, _ = z.shape
    base = loss(z[0], z[1])
    table = torch.zeros(b, n * (n - 1) // 2, dtype=z.dtype)
    for s in range(b):
        for c, (k, l) in enumerate(combinations(range(n), 2)):
            x, y = z[0].clone(), z[1].clone()
            x[s], y[s] = z[k, s], z[l, s]
            table[s, c] = b * (loss(x, y) - base)
    return table


@pytest.mark.parametrize("method", list(LOSSES))
@pytest.mark.parametrize(("n", "scale"), [(2, 1.0), (3, 0.4), (4, 1.0), (5, 2.5)])
def test_pair_table_equals_brute_force(method: str, n: int, scale: float) -> None:
    """Every entry, against the full batch loss recomputed per sample and candidate pair."""
    z = _embeddings(n, 6, 5, seed=n, scale=scale) + _embeddings(1, 6, 5, seed=10 + n)  # samples differ in mean too
    table = LOSSES[method][2](z)
    assert table.shape == (6, n * (n - 1) // 2) and table.dtype == torch.float64
    torch.testing.assert_close(table, brute_force_table(method, z), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(table[:, 0], torch.zeros(6, dtype=torch.float64), rtol=0, atol=1e-12)  # the reference pair


@pytest.mark.parametrize("method", list(LOSSES))
def test_pair_table_with_gathered_reference_equals_global_rows(method: str) -> None:
    """The DDP form: a rank's rows, with all ranks' (0, 1) embeddings as the reference, are the
    rows of the global batch's table."""
    z = _embeddings(3, 8, 4, seed=20)
    full = LOSSES[method][2](z)
    for rank in range(2):
        rows = slice(4 * rank, 4 * (rank + 1))
        local = LOSSES[method][2](z[:, rows], reference=(z[0], z[1]), offset=4 * rank)
        torch.testing.assert_close(local, full[rows], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", list(LOSSES))
@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_choice_equals_brute_force(method: str, mode: str) -> None:
    z = _embeddings(4, 7, 5, seed=30)
    choice = choose(LOSSES[method][2](z), mode)
    brute = brute_force_table(method, z)
    assert torch.equal(choice, brute.argmax(1) if mode == "hard" else brute.argmin(1))


@pytest.mark.parametrize("method", list(LOSSES))
def test_fp32_table_ranks_like_fp64(method: str) -> None:
    """The training dtype: fp32 tables (a larger batch and width) agree with fp64 to a small
    fraction of the candidates' spread."""
    z = _embeddings(4, 64, 96, seed=40, scale=0.7)
    exact = LOSSES[method][2](z)
    fp32 = LOSSES[method][2](z.float())
    assert fp32.dtype == torch.float32
    spread = (exact.amax(1) - exact.amin(1)).mean()
    assert (fp32.double() - exact).abs().max() < 1e-4 * spread


