"""MoCo v3's loss against a loop written from the paper's Algorithm 1 (per sample and as the
batch mean), the candidate table against pair-by-pair losses and the hard/easy choice against
brute force, and the keys of every rank (gathered loss and table = the global batch's rows)."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
import torch
import torch.nn.functional as F

from hvp_lightning.losses import mocov3_loss, mocov3_pair_table
from hvp_lightning.selection import choose, pair_index


def mocov3_reference(q1: torch.Tensor, q2: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor, tau: float) -> list[float]:
    """MoCo v3 Algorithm 1 (``ctr(q1, k2) + ctr(q2, k1)``, ``ctr = 2 tau CE(q k^T / tau, own)``)
    per sample, in float64 loops over the keys."""

    def unit(v: torch.Tensor) -> list[float]:
        norm = math.sqrt(sum(float(x) ** 2 for x in v))
        return [float(x) / norm for x in v]

    out = []
    for b in range(q1.shape[0]):
        total = 0.0
        for q, keys in ((q1[b], k2), (q2[b], k1)):
            qn = unit(q)
            logits = [sum(a * c for a, c in zip(qn, unit(k))) / tau for k in keys]
            total += 2 * tau * -(logits[b] - math.log(sum(math.exp(x) for x in logits)))
        out.append(total)
    return out


def _views(n: int, b: int = 5, d: int = 8, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, d, generator=g) for _ in range(n)]


@pytest.mark.parametrize("tau", [0.2, 1.0])
def test_mocov3_loss_matches_the_papers_algorithm_per_sample_and_mean(tau: float) -> None:
    q1, q2, k1, k2 = _views(4, seed=2)
    per_sample = mocov3_loss(q1, q2, k1, k2, tau)
    want = torch.tensor(mocov3_reference(q1, q2, k1, k2, tau))
    torch.testing.assert_close(per_sample, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(per_sample.mean(), want.mean(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mocov3_loss(q1, q2, k1, k2, tau, gather=True), per_sample)  # no process group


def test_mocov3_keys_get_no_gradient() -> None:
    q1, q2, k1, k2 = (v.requires_grad_(True) for v in _views(4, seed=3))
    mocov3_loss(q1, q2, k1, k2, 0.2).sum().backward()
    assert q1.grad is not None and k1.grad is None and k2.grad is None


# --- the candidate table, the choice and the keys of every rank --------------------------------------


def _table_and_pair_loss(n: int = 4, b: int = 5, seed: int = 4):
    p, z = torch.stack(_views(n, b, seed=seed)), torch.stack(_views(n, b, seed=seed + 100))
    return mocov3_pair_table(p, z, 0.2), lambda k, l: mocov3_loss(p[k], p[l], z[k], z[l], 0.2)


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


def test_mocov3_table_with_gathered_keys_equals_global_rows() -> None:
    """The DDP form: a rank's rows scored against all ranks' keys (local ones at the offset)
    are the rows of the global batch's table."""
    q, k = torch.stack(_views(3, 6, seed=6)), torch.stack(_views(3, 6, seed=7))
    full = mocov3_pair_table(q, k, 0.2)
    for rank in range(2):
        rows = slice(3 * rank, 3 * (rank + 1))
        torch.testing.assert_close(mocov3_pair_table(q[:, rows], k, 0.2, offset=3 * rank), full[rows])


def test_mocov3_gathered_loss_matches_global_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2 (collectives faked): its queries meet rank 0's keys too, positives at the offset."""
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_fn

    q1, q2, k1, k2 = _views(4, 6, seed=8)
    other = [F.normalize(k1[:3], dim=1), F.normalize(k2[:3], dim=1)]  # rank 0's normalised keys
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist_fn, "all_gather", lambda x, group=None: (other.pop(0), x))
    local = mocov3_loss(q1[3:], q2[3:], k1[3:], k2[3:], 0.2, gather=True)
    monkeypatch.undo()
    torch.testing.assert_close(local, mocov3_loss(q1, q2, k1, k2, 0.2)[3:])
