"""Shared fixtures: tiny Hydra configs composed from the real conf/ tree, offline W&B."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

REPO = Path(__file__).resolve().parents[1]
SHARED_CIFAR = REPO.parent / "shared" / "datasets" / "cifar10"

# Small enough for a few seconds on 2 CPU cores.
TINY = [
    "logger=csv", "data.train_size=64", "data.test_size=32", "data.crop_size=16", "data.num_workers=0",
    "method.batch_size=16", "method.proj_hidden_dim=64", "method.proj_dim=32", "backbone.width=8",
    "trainer.max_epochs=1", "+trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false",
]


def make_cfg(*overrides: str, tiny: bool = True) -> DictConfig:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=[*(TINY if tiny else []), *overrides])


@pytest.fixture
def cfg_factory():
    return make_cfg
