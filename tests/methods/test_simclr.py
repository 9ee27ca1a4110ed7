"""SimCLR's module: a tiny Hydra run with HVP and the presets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ..conftest import make_cfg


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
    from hvp_lightning.methods import METHODS

    cfg = validate(make_cfg(f"method={preset}", "logger=csv", "data.num_workers=0", "data.train_size=4096", tiny=False))
    model = METHODS[cfg.method.name](cfg)
    linears = [m for m in model.projector if isinstance(m, nn.Linear)]
    assert [m.out_features for m in linears] == [2048, 128]
    assert isinstance(model.projector[-1], nn.BatchNorm1d)
    assert cfg.method.optimizer.name == "lars" and model.temperature == cfg.method.temperature
