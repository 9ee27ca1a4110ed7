"""BYOL's presets (the paper's heads) and its config checks; the module itself is tested with
MoCo v3's in test_momentum.py (one online/target base)."""

from __future__ import annotations

import pytest
from torch import nn

from hvp_lightning.config import ConfigError, validate

from ..conftest import make_cfg
from .test_momentum import build_preset, out_features


@pytest.mark.parametrize(("preset", "hidden"), [("byol", 4096), ("byol_cifar", 2048)])
def test_presets_build_the_papers_heads(preset: str, hidden: int) -> None:
    """Projector and predictor: Linear-BN-ReLU-Linear to 256, no BatchNorm at the end (BYOL sec. 3.3)."""
    model = build_preset(preset)
    assert out_features(model.projector) == out_features(model.predictor) == [hidden, 256]
    assert isinstance(model.projector[-1], nn.Linear) and isinstance(model.predictor[-1], nn.Linear)


def test_config_errors_name_key_value_and_allowed() -> None:
    with pytest.raises(ConfigError) as err:
        validate(make_cfg("method=byol_cifar", "method.base_momentum=1.5"))
    assert str(err.value).startswith("method.base_momentum=1.5") and "allowed" in str(err.value)
