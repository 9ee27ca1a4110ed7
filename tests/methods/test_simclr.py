"""SimCLR's module: HVP off is the official NT-Xent step, the selection pass changes no state and
scores the pairs' NT-Xent, the presets; a tiny Hydra run with HVP (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hvp_lightning.losses.simclr import simclr_pair_table
from hvp_lightning.methods.simclr import SimCLR

from ..conftest import build, make_cfg, score_and_assert_stateless
from ..losses.test_simclr import reference_nt_xent


def _model_and_batch(*overrides: str, views: int = 2) -> tuple[SimCLR, dict]:
    torch.manual_seed(0)
    model = build(make_cfg("method=simclr_cifar", "data.crop_size=16", *overrides)).train()
    g = torch.Generator().manual_seed(1)
    batch = {"views": [torch.randn(8, 3, 16, 16, generator=g) for _ in range(views)], "label": torch.zeros(8)}
    return model, batch


def test_hvp_off_step_is_the_official_nt_xent() -> None:
    """HVP off: the step's loss is the official NT-Xent (2B x 2B logits, self masked) of the
    projections of its two views, and it trains backbone and projector."""
    model, batch = _model_and_batch()
    loss = model.training_step(batch, 0)
    with torch.no_grad():
        z1, z2 = (model.forward_view(v) for v in batch["views"])  # train mode: the same batch statistics
    torch.testing.assert_close(loss.detach(), reference_nt_xent(z1, z2, model.temperature))
    loss.backward()
    assert all(p.grad is not None for p in model.projector.parameters())
    assert model.backbone.trunk.conv1.weight.grad is not None


def test_selection_leaves_state_untouched_and_scores_each_pairs_nt_xent() -> None:
    """With +hvp=on the selection pass changes no parameter, BatchNorm buffer or RNG stream, and
    its table is the per-sample NT-Xent of every candidate pair (one forward per view set)."""
    model, batch = _model_and_batch("+hvp=on", "hvp.num_views=3", views=3)
    table = score_and_assert_stateless(model, batch).table
    with torch.no_grad():
        z = torch.stack([model.forward_view(v) for v in batch["views"]])
    torch.testing.assert_close(table, simclr_pair_table(z, model.temperature))
    assert table.shape == (8, 3)


@pytest.mark.slow  # a run
def test_tiny_train_with_hvp(tmp_path: Path) -> None:
    from hvp_lightning.training.driver import run

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

    cfg = validate(make_cfg(f"method={preset}", "logger=csv", "data.num_workers=0", "data.train_size=4096", tiny=False))
    with torch.device("meta"):  # the paper's ResNet-50 and heads: shapes, not values
        model = build(cfg)
    linears = [m for m in model.projector if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears] == [2048, 128]
    assert isinstance(model.projector[-1], nn.BatchNorm1d)
    assert cfg.method.optimizer.name == "lars" and model.temperature == cfg.method.temperature
