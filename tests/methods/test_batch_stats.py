"""VICReg and Barlow Twins LightningModules (hvp_lightning/methods/batch_stats.py and its two
subclasses): HVP off = the official loss, the selection pass leaves state untouched, presets,
config errors. The tiny ``+hvp=on`` runs are in test_tiny_runs.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hvp_lightning.losses.barlow_twins import barlow_twins_pair_table
from hvp_lightning.losses.vicreg import vicreg_pair_table

from ..conftest import build, make_cfg, score_and_assert_stateless
from ..losses.test_barlow_twins import official_barlow
from ..losses.test_vicreg import loop_vicreg

# --- the LightningModules ---------------------------------------------------------------------

TINY = {"vicreg": ["method=vicreg_cifar"], "barlow_twins": ["method=barlow_twins_cifar"]}


def _model_and_batch(method: str, *extra: str, b: int = 8):

    cfg = make_cfg(*TINY[method], *extra)
    torch.manual_seed(0)
    model = build(cfg)
    model.train()
    g = torch.Generator().manual_seed(1)
    n = model.hvp.views_per_image
    batch = {
        "views": [torch.randn(b, 3, 16, 16, generator=g) for _ in range(n)],
        "label": torch.zeros(b, dtype=torch.long),
        "index": torch.arange(b),
    }
    return model, batch


@pytest.mark.parametrize("method", list(TINY))
def test_hvp_off_step_is_the_official_loss(method: str) -> None:
    """With HVP off the step's loss is the official formula on the projector outputs."""
    model, batch = _model_and_batch(method)
    loss = model.training_step(batch, 0)
    torch.manual_seed(0)  # the same BatchNorm batch statistics: train mode, same inputs
    z1, z2 = (model.forward_view(v).double() for v in batch["views"])
    expected = loop_vicreg(z1.tolist(), z2.tolist()) if method == "vicreg" else official_barlow(z1, z2, 0.0051).item()
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert all(p.grad is not None for p in model.projector.parameters())


@pytest.mark.parametrize("method", list(TINY))
def test_selection_leaves_state_untouched_and_equals_table(method: str) -> None:
    """The selection pass changes no parameter, BatchNorm buffer or RNG stream; its table is the
    leave-one-out table of the candidates' projector outputs (one forward per view set)."""
    model, batch = _model_and_batch(method, "+hvp=on", "hvp.num_views=3")
    table = score_and_assert_stateless(model, batch).table
    with torch.no_grad():
        z = torch.stack([model.forward_view(v) for v in batch["views"]])
    expected = vicreg_pair_table(z) if method == "vicreg" else barlow_twins_pair_table(z, 0.0051)
    torch.testing.assert_close(table, expected)
    assert table.shape == (8, 3)


PRESETS = {"vicreg": 8192, "vicreg_cifar": 2048, "barlow_twins": 8192, "barlow_twins_cifar": 2048}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_presets_build(preset: str) -> None:
    """Every preset composes, validates and builds the official projector (Linear-BN-ReLU x 2,
    bias-free Linear) and LARS; Barlow Twins' biases and BN parameters get their own lr."""
    from types import SimpleNamespace

    from hvp_lightning.config import validate

    cfg = make_cfg(
        f"method={preset}",
        "backbone=resnet18_narrow",
        "backbone.width=4",
        "logger=csv",
        "data.num_workers=0",
        tiny=False,
    )
    validate(cfg)
    with torch.device("meta"):  # the paper's 8192-wide heads: shapes, not values
        model = build(cfg)
    linears = [m for m in model.projector if isinstance(m, nn.Linear)]
    dim = PRESETS[preset]
    assert [m.out_features for m in linears] == [dim] * 3 and linears[-1].bias is None
    assert sum(isinstance(m, nn.BatchNorm1d) for m in model.projector) == 2
    model.trainer = SimpleNamespace(
        world_size=1, accumulate_grad_batches=1, estimated_stepping_batches=100, max_epochs=10
    )  # type: ignore[assignment]
    opt = model.configure_optimizers()["optimizer"]
    o = cfg.method.optimizer
    peak = o.base_lr * cfg.method.batch_size / 256
    assert type(opt).__name__ == "LARS"
    if cfg.method.name == "barlow_twins":
        weights, biases = opt.param_groups
        assert all(p.ndim > 1 for p in weights["params"]) and all(p.ndim <= 1 for p in biases["params"])
        assert weights["initial_lr"] == pytest.approx(peak)
        assert biases["initial_lr"] == pytest.approx(peak * o.base_lr_biases / o.base_lr)
    else:
        assert [g["initial_lr"] for g in opt.param_groups] == [pytest.approx(peak)]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("method=vicreg_cifar method.std_coeff=-1", "method.std_coeff=-1"),
        ("method=barlow_twins_cifar method.lambd=abc", "method.lambd='abc'"),
        ("method=barlow_twins_cifar method.optimizer.base_lr_biases=0", "method.optimizer.base_lr_biases=0"),
    ],
)
def test_config_errors_name_key_value_and_allowed(override: str, key: str) -> None:
    from hvp_lightning.config import ConfigError, validate

    with pytest.raises(ConfigError) as err:
        validate(make_cfg(*override.split()))
    assert str(err.value).startswith(key) and "allowed" in str(err.value)
