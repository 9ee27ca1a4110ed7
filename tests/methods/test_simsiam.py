"""SimSiam's module: architecture, HVP off == baseline, HVP step == baseline step on the
chosen views, the collapse monitor."""

from __future__ import annotations

from unittest.mock import PropertyMock, patch

import pytest
import torch
import torch.nn.functional as F

from hvp_lightning.losses import simsiam_loss
from hvp_lightning.methods.base import SSLMethod
from hvp_lightning.methods.simsiam import SimSiam

from ..conftest import build


def test_architecture_follows_official_simsiam(cfg_factory):
    model = build(cfg_factory("method=simsiam", "method.proj_hidden_dim=64", "method.proj_dim=32", "data.crop_size=32"))
    proj, pred = model.projector, model.predictor
    assert sum(isinstance(m, torch.nn.Linear) for m in proj) == 3  # ImageNet preset: 3 layers
    assert isinstance(proj[-1], torch.nn.BatchNorm1d) and not proj[-1].affine
    assert [type(m).__name__ for m in pred] == ["Linear", "BatchNorm1d", "ReLU", "Linear"]
    assert model.settings.optimizer.weight_decay == 1e-4 and model.settings.fix_pred_lr
    groups = model.param_groups()
    assert groups[1]["fixed_lr"] and groups[1]["params"] == list(model.predictor.parameters())


def _loss_and_grads(model, batch):
    model.zero_grad()
    loss = model.training_step(batch, 0)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_hvp_off_is_the_baseline(cfg_factory):
    """Same seed, same batch: identical loss and gradients with the mixin (HVP off) and
    with the bare method step (the base class's training_step)."""
    cfg = cfg_factory()
    torch.manual_seed(0)
    model = build(cfg).train()
    batch = {"views": [torch.randn(8, 3, 16, 16) for _ in range(2)], "label": torch.zeros(8, dtype=torch.long)}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss_mixin, g_mixin = _loss_and_grads(model, batch)
    model.load_state_dict(state)
    model.zero_grad()
    loss_base = SSLMethod.training_step(model, batch, 0)  # the method's own step, no mixin
    loss_base.backward()
    assert torch.equal(loss_mixin, loss_base.detach())
    for n, p in model.named_parameters():
        if p.grad is not None:
            assert torch.equal(g_mixin[n], p.grad), n


def test_selected_loss_equals_own_loss_on_chosen_views(cfg_factory):
    """With BatchNorm in eval mode (no coupling between samples) the selected entry of the
    candidate table equals SimSiam's own per-sample loss on the gathered views."""
    torch.manual_seed(2)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=4")).eval()
    batch = {"views": [torch.randn(8, 3, 16, 16) for _ in range(4)], "label": torch.zeros(8, dtype=torch.long)}
    table = model.score_candidates(batch).table
    for mode in ("hard", "easy"):
        choice = table.argmax(1) if mode == "hard" else table.argmin(1)
        chosen = model.select_views(batch, choice)
        with torch.no_grad():
            (z1, p1), (z2, p2) = (model.forward_view(v) for v in chosen["views"])
        own = simsiam_loss(p1, p2, z1, z2)
        assert torch.allclose(table.gather(1, choice[:, None]).squeeze(1), own, atol=1e-5)


def test_hvp_step_is_the_baseline_step_on_the_selected_pair(cfg_factory):
    torch.manual_seed(1)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=4")).train()
    batch = {"views": [torch.randn(8, 3, 16, 16) for _ in range(4)], "label": torch.zeros(8, dtype=torch.long)}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    choice = model.score_candidates(batch).table.argmax(1)
    chosen = model.select_views(batch, choice)
    hvp_loss = model.training_step(batch, 0)
    model.load_state_dict(state)
    base_loss = SSLMethod.training_step(model, chosen, 0)
    assert torch.allclose(hvp_loss, base_loss)
    assert model.hvp_totals[2].item() == 8


@pytest.mark.parametrize("every", [1, 2, 3])
def test_every_n_steps_selects_only_on_those_steps(cfg_factory, every):
    model = build(cfg_factory("+hvp=on", f"hvp.every_n_steps={every}")).train()
    batch = {"views": [torch.randn(4, 3, 16, 16) for _ in range(4)], "label": torch.zeros(4, dtype=torch.long)}
    calls = []
    original = model.score_candidates
    model.score_candidates = lambda b: calls.append(1) or original(b)  # type: ignore[method-assign]
    selected_steps = []
    for step in range(6):
        with patch.object(SimSiam, "global_step", new_callable=PropertyMock, return_value=step):
            before = len(calls)
            model.training_step(batch, step)
            if len(calls) > before:
                selected_steps.append(step)
    assert selected_steps == [s for s in range(6) if s % every == 0]


def test_z_std_collapse_monitor_is_cosine_scale():
    z = torch.randn(512, 64)
    assert abs(F.normalize(z, dim=1).std(0).mean().item() - 64**-0.5) < 0.02
