"""SimCLR: NT-Xent against the official form, the HVP pair table against pair-by-pair losses,
the hard/easy choice against brute force, LARS, DDP key gathering, and a tiny Hydra run."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hvp_lightning.methods.simclr import gather_with_grad, nt_xent_loss, simclr_pair_table
from hvp_lightning.optim import LARS
from hvp_lightning.selection import choose, pair_index

from ._ddp import run_ranks
from .conftest import make_cfg


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
        local = z[:, 3 * rank:3 * (rank + 1)]
        torch.testing.assert_close(simclr_pair_table(local, 0.5, keys=z, offset=3 * rank), full[3 * rank:3 * (rank + 1)])


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


def test_lars_trust_ratio_only_on_matrices() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    model(torch.randn(8, 4)).pow(2).sum().backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    lr, wd, eta = 0.5, 1e-2, 1e-3
    LARS(model.parameters(), lr=lr, momentum=0.9, weight_decay=wd, eta=eta).step()
    for name, p in model.named_parameters():
        w, g = before[name], grads[name]
        assert not torch.equal(p.detach(), w), name
        if p.ndim > 1:  # Linear weight: decayed, scaled by eta * ||w|| / ||g + wd w||
            d = g + wd * w
            expected = w - lr * eta * w.norm() / d.norm() * d
        else:  # bias, BN weight/bias: plain SGD step, no decay, no trust ratio
            expected = w - lr * g
        torch.testing.assert_close(p.detach(), expected)


def _ddp_worker(rank: int, world: int, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    b = z1.shape[0] // world
    a1 = z1[rank * b:(rank + 1) * b].clone().requires_grad_(True)
    a2 = z2[rank * b:(rank + 1) * b].clone().requires_grad_(True)
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


def test_tiny_train_with_hvp(tmp_path: Path) -> None:
    from hvp_lightning.train import run

    summary = run(make_cfg("method=simclr_cifar", "+hvp=on", "data.image_size=16"), tmp_path)
    assert summary["method"] == "simclr"
    assert summary["hvp_enabled"] is True
    assert summary["steps"] == 4
    assert summary["train_loss"] is not None and torch.isfinite(torch.tensor(summary["train_loss"]))
    assert summary["hvp"]["selected_samples"] == 64
    # Hard choice: the selected pair's loss is at least the candidates' mean.
    assert summary["hvp"]["selection_selected_loss_mean"] >= summary["hvp"]["selection_candidate_loss_mean"]
    assert summary["knn_top1"] is not None
    assert (tmp_path / "summary.json").is_file()


@pytest.mark.parametrize("preset", ["simclr", "simclr_cifar"])
def test_presets_build(preset: str) -> None:
    """Both presets compose, validate and build the paper's head (2048 -> 128, BN) and LARS."""
    from hvp_lightning.config import validate
    from hvp_lightning.methods import METHODS

    cfg = make_cfg(f"method={preset}", "logger=csv", "data.num_workers=0", tiny=False)
    validate(cfg)
    model = METHODS[cfg.method.name](cfg)
    linears = [m for m in model.projector if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears] == [2048, 128]
    assert isinstance(model.projector[-1], nn.BatchNorm1d)
    assert cfg.method.optimizer.name == "lars" and model.temperature == cfg.method.temperature
