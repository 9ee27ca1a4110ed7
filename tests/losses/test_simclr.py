"""SimCLR's NT-Xent against the official form and lightly, the HVP pair table against
pair-by-pair losses (and its hard/easy choice against brute force), DDP key gathering."""

from __future__ import annotations

from itertools import combinations

import pytest
import torch
import torch.nn.functional as F

from hvp_lightning.losses import gather_with_grad, nt_xent_loss, simclr_pair_table
from hvp_lightning.selection import choose, pair_index

from .._ddp import run_ranks


def reference_nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """Official form, written independently: CE over a 2B x 2B logits matrix, diagonal masked."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    n = z.shape[0]
    logits = z @ z.T / temperature
    logits = logits - torch.eye(n) * 1e9
    b = n // 2
    labels = torch.cat([torch.arange(b, n), torch.arange(0, b)])
    return F.cross_entropy(logits, labels)


@pytest.mark.parametrize("temperature", [0.1, 0.5])
def test_nt_xent_matches_official_form(temperature: float) -> None:
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    per_sample = nt_xent_loss(z1, z2, temperature)
    assert per_sample.shape == (6,)
    torch.testing.assert_close(per_sample.mean(), reference_nt_xent(z1, z2, temperature))
    # Symmetric in the two views, and gather=True is a no-op without a process group.
    torch.testing.assert_close(nt_xent_loss(z2, z1, temperature), per_sample)
    torch.testing.assert_close(nt_xent_loss(z1, z2, temperature, gather=True), per_sample)


def test_nt_xent_matches_lightly() -> None:
    lightly_loss = pytest.importorskip("lightly.loss")
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    expected = lightly_loss.NTXentLoss(temperature=0.5)(z1, z2)
    torch.testing.assert_close(nt_xent_loss(z1, z2, 0.5).mean(), expected)


def _candidates(n: int = 4, b: int = 5, d: int = 8, seed: int = 2) -> torch.Tensor:
    return torch.randn(n, b, d, generator=torch.Generator().manual_seed(seed))


def test_pair_table_equals_pairwise_nt_xent() -> None:
    z = _candidates()
    table = simclr_pair_table(z, 0.2)
    pairs = pair_index(4)
    assert table.shape == (5, 6)
    for c, (k, l) in enumerate(pairs.tolist()):
        torch.testing.assert_close(table[:, c], nt_xent_loss(z[k], z[l], 0.2))


def test_pair_table_with_gathered_keys_equals_global_rows() -> None:
    """The DDP form: a rank's rows with all ranks' candidates as keys = the global table's rows."""
    z = _candidates(n=3, b=6)
    full = simclr_pair_table(z, 0.5)
    for rank in range(2):
        local = z[:, 3 * rank : 3 * (rank + 1)]
        torch.testing.assert_close(
            simclr_pair_table(local, 0.5, keys=z, offset=3 * rank), full[3 * rank : 3 * (rank + 1)]
        )


@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_selection_equals_brute_force(mode: str) -> None:
    z = _candidates(seed=3)
    choice = choose(simclr_pair_table(z, 0.2), mode)
    pairs = list(combinations(range(4), 2))
    for b in range(5):
        losses = [float(nt_xent_loss(z[k], z[l], 0.2)[b]) for k, l in pairs]
        best = max(losses) if mode == "hard" else min(losses)
        assert losses[int(choice[b])] == pytest.approx(best, abs=1e-6)
        assert pairs[int(choice[b])] == pairs[losses.index(best)]


def _ddp_worker(rank: int, world: int, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    b = z1.shape[0] // world
    a1 = z1[rank * b : (rank + 1) * b].clone().requires_grad_(True)
    a2 = z2[rank * b : (rank + 1) * b].clone().requires_grad_(True)
    loss = nt_xent_loss(a1, a2, 0.5, gather=True)
    loss.mean().backward()
    return loss.detach(), a1.grad.detach(), a2.grad.detach()


def test_gathered_loss_matches_global_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2 (collectives faked): local positives/self-masks offset by rank into the keys."""
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_fn

    g = torch.Generator().manual_seed(5)
    z1, z2 = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    other = [F.normalize(z1[:3], dim=1), F.normalize(z2[:3], dim=1)]  # rank 0's normalised keys
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist_fn, "all_gather", lambda x, group=None: (other.pop(0), x))
    local = nt_xent_loss(z1[3:], z2[3:], 0.5, gather=True)
    monkeypatch.undo()
    torch.testing.assert_close(local, nt_xent_loss(z1, z2, 0.5)[3:])


@pytest.mark.slow
def test_gathered_loss_and_gradients_match_global_batch() -> None:
    """2 gloo ranks: per-sample losses are the global batch's, and local gradients (summed
    over ranks by the gather) are world x the global-mean gradient, so DDP's average is exact."""
    g = torch.Generator().manual_seed(4)
    z1, z2 = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    g1, g2 = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
    full = nt_xent_loss(g1, g2, 0.5)
    full.mean().backward()
    for rank, (loss, d1, d2) in enumerate(run_ranks(_ddp_worker, (z1, z2))):
        rows = slice(3 * rank, 3 * (rank + 1))
        torch.testing.assert_close(loss, full.detach()[rows])
        torch.testing.assert_close(d1, 2 * g1.grad[rows])
        torch.testing.assert_close(d2, 2 * g2.grad[rows])


def test_gather_single_process_is_identity() -> None:
    x = torch.randn(3, 4)
    y, offset = gather_with_grad(x, dim=1)
    assert y is x and offset == 0
