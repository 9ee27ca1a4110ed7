"""MoCo v3's presets (the paper's heads: projector ending in a BatchNorm without affine
parameters, the ViT predictor too) and its config checks; the module itself is tested with
BYOL's in test_momentum.py (one online/target base)."""

from __future__ import annotations

import pytest
from torch import nn

from hvp_lightning.config import ConfigError, validate

from ..conftest import make_cfg
from .test_momentum import build_preset, out_features


@pytest.mark.parametrize(
    ("preset", "proj", "pred"),
    [
        ("mocov3", [4096, 256], [4096, 256]),
        ("mocov3_cifar", [2048, 256], [2048, 256]),
        ("mocov3_vit", [4096, 4096, 256], [4096, 256]),
    ],
)
def test_presets_build_the_papers_heads(preset: str, proj: list[int], pred: list[int]) -> None:
    model = build_preset(preset)
    assert out_features(model.projector) == proj and out_features(model.predictor) == pred
    vit = preset.endswith("vit")
    assert isinstance(model.projector[-1], nn.BatchNorm1d) and not model.projector[-1].affine
    assert isinstance(model.predictor[-1], nn.BatchNorm1d if vit else nn.Linear)
    assert not vit or not model.predictor[-1].affine


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("method.temperature=0", "method.temperature=0"),
        ("method.proj_last_bn=maybe", "method.proj_last_bn='maybe'"),
    ],
)
def test_config_errors_name_key_value_and_allowed(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(make_cfg("method=mocov3_cifar", override))
    assert str(err.value).startswith(key) and "allowed" in str(err.value)
