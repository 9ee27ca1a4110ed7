"""The leave-one-out candidate tables of the batch-statistics losses (VICReg, Barlow Twins), both
built on the row-swap updates of hvp_lightning/losses/swap.py: every entry against brute force
(the whole batch loss recomputed for every sample and candidate pair), the DDP form with a
gathered reference, the choice against brute force, and fp32 against fp64."""

from __future__ import annotations

from itertools import combinations

import pytest
import torch

from hvp_lightning.losses.barlow_twins import barlow_twins_loss, barlow_twins_pair_table
from hvp_lightning.losses.vicreg import vicreg_loss, vicreg_pair_table
from hvp_lightning.selection import choose

from .test_barlow_twins import LAMBD

LOSSES = {  # the batch loss and its table
    "vicreg": (lambda x, y: vicreg_loss(x, y), lambda z, **kw: vicreg_pair_table(z, **kw)),
    "barlow_twins": (
        lambda x, y: barlow_twins_loss(x, y, LAMBD),
        lambda z, **kw: barlow_twins_pair_table(z, LAMBD, **kw),
    ),
}


def _embeddings(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


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
    table = LOSSES[method][1](z)
    assert table.shape == (6, n * (n - 1) // 2) and table.dtype == torch.float64
    torch.testing.assert_close(table, brute_force_table(method, z), rtol=1e-9, atol=1e-9)
    zeros = torch.zeros(6, dtype=torch.float64)
    torch.testing.assert_close(table[:, 0], zeros, rtol=0, atol=1e-12)  # the reference pair


@pytest.mark.parametrize("method", list(LOSSES))
def test_pair_table_with_gathered_reference_equals_global_rows(method: str) -> None:
    """The DDP form: a rank's rows, with all ranks' (0, 1) embeddings as the reference, are the
    rows of the global batch's table."""
    z = _embeddings(3, 8, 4, seed=20)
    full = LOSSES[method][1](z)
    for rank in range(2):
        rows = slice(4 * rank, 4 * (rank + 1))
        local = LOSSES[method][1](z[:, rows], reference=(z[0], z[1]), offset=4 * rank)
        torch.testing.assert_close(local, full[rows], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", list(LOSSES))
@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_choice_equals_brute_force(method: str, mode: str) -> None:
    z = _embeddings(4, 7, 5, seed=30)
    choice = choose(LOSSES[method][1](z), mode)
    brute = brute_force_table(method, z)
    assert torch.equal(choice, brute.argmax(1) if mode == "hard" else brute.argmin(1))


@pytest.mark.parametrize("method", list(LOSSES))
def test_fp32_table_ranks_like_fp64(method: str) -> None:
    """The training dtype: fp32 tables (a larger batch and width) agree with fp64 to a small
    fraction of the candidates' spread."""
    z = _embeddings(4, 64, 96, seed=40, scale=0.7)
    exact = LOSSES[method][1](z)
    fp32 = LOSSES[method][1](z.float())
    assert fp32.dtype == torch.float32
    spread = (exact.amax(1) - exact.amin(1)).mean()
    assert (fp32.double() - exact).abs().max() < 1e-4 * spread
