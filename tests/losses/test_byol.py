"""BYOL's loss against a loop written from the paper's formula (per sample and as the batch
mean) and lightly's, the candidate table against pair-by-pair losses and the hard/easy choice
against brute force."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
import torch

from hvp_lightning.losses import byol_loss, byol_pair_table
from hvp_lightning.selection import choose, pair_index


def byol_reference(p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> list[float]:
    """BYOL eq. 2, per sample, in float64 loops: ``||p/|p| - z'/|z'| ||^2`` for (p1, z2') plus
    the symmetric term (p2, z1') (the paper's L + L~)."""
    out = []
    for b in range(p1.shape[0]):
        total = 0.0
        for p, z in ((p1[b], z2[b]), (p2[b], z1[b])):
            pn = [float(x) / math.sqrt(sum(float(y) ** 2 for y in p)) for x in p]
            zn = [float(x) / math.sqrt(sum(float(y) ** 2 for y in z)) for x in z]
            total += sum((a - c) ** 2 for a, c in zip(pn, zn))
        out.append(total)
    return out


def _views(n: int, b: int = 5, d: int = 8, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, d, generator=g) for _ in range(n)]


def test_byol_loss_matches_the_papers_formula_per_sample_and_mean() -> None:
    p1, p2, z1, z2 = _views(4)
    per_sample = byol_loss(p1, p2, z1, z2)
    want = torch.tensor(byol_reference(p1, p2, z1, z2))
    torch.testing.assert_close(per_sample, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(per_sample.mean(), want.mean(), rtol=1e-5, atol=1e-5)


def test_byol_loss_matches_lightly() -> None:
    """lightly's BYOL recipe: ``0.5 (NegCos(p1, z2) + NegCos(p2, z1))`` = (loss - 4) / 4."""
    lightly_loss = pytest.importorskip("lightly.loss")
    p1, p2, z1, z2 = _views(4, seed=1)
    crit = lightly_loss.NegativeCosineSimilarity()
    torch.testing.assert_close(byol_loss(p1, p2, z1, z2).mean(), 4 + 4 * 0.5 * (crit(p1, z2) + crit(p2, z1)))


# --- the candidate table and the choice --------------------------------------------------------------


def _table_and_pair_loss(n: int = 4, b: int = 5, seed: int = 4):
    p, z = torch.stack(_views(n, b, seed=seed)), torch.stack(_views(n, b, seed=seed + 100))
    return byol_pair_table(p, z), lambda k, l: byol_loss(p[k], p[l], z[k], z[l])


def test_pair_table_equals_pairwise_loss() -> None:
    table, pair_loss = _table_and_pair_loss()
    assert table.shape == (5, 6)
    for c, (k, l) in enumerate(pair_index(4).tolist()):
        torch.testing.assert_close(table[:, c], pair_loss(k, l))


@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_selection_equals_brute_force(mode: str) -> None:
    table, pair_loss = _table_and_pair_loss(seed=5)
    choice = choose(table, mode)
    pairs = list(combinations(range(4), 2))
    for b in range(5):
        losses = [float(pair_loss(k, l)[b]) for k, l in pairs]
        best = max(losses) if mode == "hard" else min(losses)
        assert pairs[int(choice[b])] == pairs[losses.index(best)]
