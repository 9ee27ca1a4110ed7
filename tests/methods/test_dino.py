"""DINO's module: registry and view layout, model selection against brute force, state
hygiene of the selection pass, teacher reuse, HVP off = baseline, schedules, and a tiny Hydra run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from torch import nn

from hvp_lightning.losses import dino_loss
from hvp_lightning.methods import METHODS
from hvp_lightning.methods.dino import DINO
from hvp_lightning.nn.heads import DINOHead
from hvp_lightning.nn.teacher import (
    Centering,
    clip_gradients_per_parameter,
    cosine_momentum,
    ema_update,
    make_teacher,
    teacher_temperature,
)
from hvp_lightning.selection import choose

from ..conftest import augs_of, build, counts_of, official_pairs, score_and_assert_stateless, tiny_vit_run
from ..conftest import make_cfg as compose_cfg
from ..losses.test_dino import reference_dino_loss
from ..selection.test_multicrop import _brute_force

VIT = [
    "backbone=vit_tiny",
    "backbone.patch_size=8",
    "backbone.img_size=32",
    "backbone.depth=1",
    "backbone.drop_path_rate=0.0",
]
TINY = [
    "method=dino_cifar",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
    "logger=csv",
    "data.num_workers=0",
]


def make_cfg(*overrides: str, backbone: tuple[str, ...] = tuple(VIT)) -> DictConfig:
    return compose_cfg(*TINY, *backbone, *overrides, tiny=False)


def make_batch(cfg: DictConfig, b: int = 3, seed: int = 0) -> dict:
    augs = augs_of(cfg)
    g = torch.Generator().manual_seed(seed)
    views = [torch.randn(b, 3, a.size, a.size, generator=g) for a in augs]
    # crop_x encodes (sample, view position) so tests can check that parameters travel along.
    crop_x = torch.arange(b)[:, None] * 100.0 + torch.arange(len(augs))[None].float()
    return {
        "views": views,
        "params": {"crop_x": crop_x},
        "label": torch.zeros(b, dtype=torch.long),
        "index": torch.arange(b),
    }


# --- the LightningModule ---------------------------------------------------------------------


def test_registered_and_view_layout() -> None:
    assert METHODS["dino"] is DINO
    cfg = make_cfg()
    augs = augs_of(cfg)
    assert [a.size for a in augs] == [32, 32, 16, 16]
    assert [a.blur_p for a in augs] == [1.0, 0.1, 0.5, 0.5]
    assert [a.solarize_p for a in augs] == [0.0, 0.2, 0.0, 0.0]
    assert augs[0].scale == (0.4, 1.0) and augs[2].scale == (0.05, 0.4)
    hvp = make_cfg("+hvp=on")
    assert counts_of(hvp) == (4, 4)
    augs = augs_of(hvp)
    assert [a.blur_p for a in augs] == [1.0, 0.1, 1.0, 0.1, 0.5, 0.5, 0.5, 0.5]
    assert counts_of(make_cfg("+hvp=on", "hvp.num_global_candidates=3", "hvp.num_local_candidates=5")) == (3, 5)


def test_model_selection_equals_brute_force_and_gathers_views() -> None:
    torch.manual_seed(0)
    cfg = make_cfg("+hvp=on")
    model = build(cfg).train()
    batch = make_batch(cfg, b=3)
    G, L = model.num_globals, model.num_local
    scores = model.score_candidates(batch)
    table = scores.table
    assert table.shape == (3, len(official_pairs(G)))  # hvp.global_pairs=cross by default
    choice = choose(table, "hard")
    sel = model.select_views(batch, choice, scores.context)
    assert len(sel["views"]) == 2 + L and "teacher_out" in sel  # ViT teacher: reused
    with torch.no_grad():
        tau_t, tau_s, c = model.teacher_temp(), cfg.method.student_temp, model.centering.center
        T = torch.stack([model.teacher.head(model.teacher.backbone(v)) for v in batch["views"][:G]])
        S = torch.stack([model.head(model.backbone(v)) for v in batch["views"]])
        brute, _ = _brute_force(T, S[:G], S[G:], L, c, tau_t, tau_s, "cross")
        torch.testing.assert_close(table.max(1).values, brute.max(1).values, rtol=1e-4, atol=1e-5)
        # The gathered batch gives, through the training step's own loss, the selected value.
        student = [model.head(model.backbone(v)) for v in sel["views"]]
        loss = dino_loss(sel["teacher_out"], student, c, tau_t, tau_s)
        torch.testing.assert_close(loss, table.gather(1, choice[:, None]).squeeze(1), rtol=1e-4, atol=1e-5)
        fresh = [model.teacher.head(model.teacher.backbone(v)) for v in sel["views"][:2]]
        torch.testing.assert_close(torch.stack(sel["teacher_out"]), torch.stack(fresh), rtol=1e-4, atol=1e-5)
    # Views and their augmentation parameters: each sample's own chosen positions.
    pos = sel["params"]["crop_x"] - torch.arange(3)[:, None] * 100
    for b in range(3):
        for slot, p in enumerate(pos[b].long().tolist()):
            assert torch.equal(sel["views"][slot][b], batch["views"][p][b])
    assert (pos[:, :2] < G).all() and (pos[:, 2:] >= G).all()
    assert (pos[:, 0] % 2 == 0).all() and (pos[:, 1] % 2 == 1).all()  # one crop of each global pipeline


def test_selection_pass_leaves_state_unchanged() -> None:
    torch.manual_seed(0)
    resnet = ("backbone=resnet18_narrow", "backbone.width=4", "backbone.channels_last=false")
    cfg = make_cfg(
        "+hvp=on",
        "hvp.mode=random",
        "method.use_bn_in_head=true",
        "method.local_crop_size=8",
        "data.crop_size=16",
        backbone=resnet,
    )
    model = build(cfg).train()
    assert not model.teacher_reuse  # BatchNorm teacher: the training step forwards again
    batch = make_batch(cfg, b=4)
    model.centering.center.normal_()  # a non-trivial centre
    before = model.state_dict()
    assert any("running_mean" in k for k in before) and any(k.startswith("teacher.") for k in before)
    scores = score_and_assert_stateless(model, batch)
    sel = model.select_views(batch, choose(scores.table, "random", torch.Generator().manual_seed(0)), scores.context)
    assert "teacher_out" not in sel


def test_teacher_reuse_equals_second_teacher_forward() -> None:
    torch.manual_seed(0)
    cfg = make_cfg("+hvp=on", "backbone.drop_path_rate=0.1")
    model = build(cfg).train()
    model.centering.center.normal_()
    assert model.teacher_reuse
    batch = make_batch(cfg, b=3)
    center0 = model.centering.center.clone()
    results = []
    for reuse in (True, False):
        model.teacher_reuse = reuse
        model.centering.center.copy_(center0)
        torch.manual_seed(1)  # same drop-path draws in the student
        loss = model.training_step(batch, 0)
        assert torch.equal(model.centering.center, center0)  # pending until the optimiser step
        model.centering.step()  # what on_train_batch_end does once per optimiser step
        results.append((loss.detach(), model.centering.center.clone()))
    (l1, c1), (l2, c2) = results
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c1, c2, rtol=1e-5, atol=1e-7)
    assert not torch.equal(c1, center0)  # the training step (only) feeds the centre


def test_hvp_off_equals_baseline_step() -> None:
    torch.manual_seed(0)
    cfg = make_cfg()
    base = build(cfg).train()
    batch = make_batch(cfg, b=3)
    c, tau_t, tau_s = base.centering.center.clone(), base.teacher_temp(), cfg.method.student_temp
    loss = base.training_step(batch, 0)
    # The official loss on the same crops, from per-crop forwards.
    with torch.no_grad():
        t = torch.cat([base.teacher.head(base.teacher.backbone(v)) for v in batch["views"][:2]])
        s = torch.cat([base.head(base.backbone(v)) for v in batch["views"]])
    expected = reference_dino_loss(s, t, c, tau_t, tau_s, len(batch["views"]))
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)
    # HVP enabled on an off-step (every_n_steps): the first combination, i.e. the baseline.
    hvp = build(make_cfg("+hvp=on", "hvp.every_n_steps=2"))
    hvp.load_state_dict(base.state_dict())
    hvp.centering.center.copy_(c)
    hvp.hvp_active = lambda: False  # type: ignore[method-assign]
    hvp_batch = make_batch(make_cfg("+hvp=on"), b=3)
    g = hvp.num_globals
    plain = dict(hvp_batch, views=hvp_batch["views"][:2] + hvp_batch["views"][g : g + 2])
    base.centering.center.copy_(c)
    torch.testing.assert_close(hvp.training_step(hvp_batch, 0), base.training_step(plain, 0))


# --- shared pieces -------------------------------------------------------------------------


def test_teacher_pieces_and_head() -> None:
    assert cosine_momentum(0, 100) == pytest.approx(0.996)
    assert cosine_momentum(100, 100) == pytest.approx(1.0)
    assert cosine_momentum(50, 100) == pytest.approx(0.998)
    assert teacher_temperature(0, 0.07, 0.04, 30) == pytest.approx(0.04)
    assert teacher_temperature(29, 0.07, 0.04, 30) == pytest.approx(0.07)
    assert teacher_temperature(40, 0.07, 0.04, 30) == 0.07
    assert teacher_temperature(0, 0.04, 0.04, 0) == 0.04

    head = DINOHead(8, 32, hidden_dim=16, bottleneck_dim=4, norm_last_layer=True)
    assert head(torch.randn(5, 8)).shape == (5, 32)
    assert not head.last_layer.weight_g.requires_grad
    assert DINOHead(8, 32, 16, 4, norm_last_layer=False).last_layer.weight_g.requires_grad
    student = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    teacher = make_teacher(student)
    assert not any(p.requires_grad for p in teacher.parameters()) and teacher[1].p == 0.0
    with torch.no_grad():
        student[0].weight.add_(1.0)
    t0 = teacher[0].weight.clone()
    ema_update(teacher, student, 0.9)
    torch.testing.assert_close(teacher[0].weight, 0.9 * t0 + 0.1 * student[0].weight)

    centering = Centering(3, momentum=0.9)
    centering.center.fill_(1.0)
    x = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    centering.update([x[:1], x[1:]])
    torch.testing.assert_close(centering.center, 0.9 + 0.1 * x.mean(0, keepdim=True))


@pytest.mark.parametrize("kind", ["per_parameter", "global"])
def test_freeze_last_layer_and_clipping(kind: str) -> None:
    """``per_parameter``: each gradient to norm <= clip on its own (upstream DINO, iBOT);
    ``global``: all of them times ``min(1, clip / (total norm + 1e-6))`` (the HVP code's DINO,
    ``clip_grad_norm_(student.parameters(), clip)``), the frozen last layer's gradient counted in
    the norm and then dropped, as there."""
    model = build(make_cfg("method.clip_grad=0.5", f"method.clip_grad_kind={kind}"))
    assert model.settings.clip_grad_kind == kind
    trained = [p for p in model.parameters() if p.requires_grad]
    for i, p in enumerate(trained):
        p.grad = torch.full_like(p, 10.0 + i)
    total = torch.stack([p.grad.norm() for p in trained]).norm()
    want = [p.grad * (0.5 / (total + 1e-6)) for p in trained]
    model.clip_and_freeze_gradients()  # epoch 0 < freeze_last_layer=1
    assert all(p.grad is None for p in model.head.last_layer.parameters())
    norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    assert norms and max(norms) <= 0.5 + 1e-4
    if kind == "global":
        kept = [(p.grad, w) for p, w in zip(trained, want) if p.grad is not None]
        assert len(kept) == len(norms)
        for got, w in kept:
            torch.testing.assert_close(got, w, rtol=1e-5, atol=0)
    else:
        assert min(norms) == pytest.approx(0.5, rel=1e-4)  # each one clipped to the bound on its own
    groups = model.param_groups()
    assert groups[1]["weight_decay"] == 0.0 and all(p.ndim <= 1 for p in groups[1]["params"])
    n_student = sum(1 for n, p in model.named_parameters() if p.requires_grad and not n.startswith("teacher."))
    assert sum(len(g["params"]) for g in groups) == n_student


# --- end to end ----------------------------------------------------------------------------


@pytest.mark.slow  # a run
def test_tiny_hydra_run(tmp_path: Path) -> None:
    summary, state, metrics = tiny_vit_run("dino", tmp_path)
    assert "centering.center" in state and "teacher.head.last_layer.weight_v" in state
    assert not torch.equal(state["centering.center"], torch.zeros_like(state["centering.center"]))
    assert "train/teacher_momentum" in metrics and "hvp/selection_selected_loss_step" in metrics
    assert "hvp/trained_loss_step" in metrics


def test_clip_gradients_per_parameter_is_dinos_clip_gradients() -> None:
    """The official ``utils.clip_gradients``: each gradient times ``min(1, clip / (norm + 1e-6))``
    on its own (large ones shrink to norm ~clip, small ones stay), parameters without a
    gradient skipped."""
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(s)) for s in ((3, 4), (10,), (5, 5, 2), (2,))]
    for p, gain in zip(params[:3], (3.0, 0.01, 5.0)):
        p.grad = torch.randn_like(p) * gain
    want = [p.grad * (0.5 / (p.grad.norm(2) + 1e-6)).clamp(max=1.0) for p in params[:3]]
    clip_gradients_per_parameter(params, 0.5)
    for p, w in zip(params[:3], want):
        torch.testing.assert_close(p.grad, w, rtol=1e-6, atol=0)
    assert params[3].grad is None
    assert params[0].grad.norm() == pytest.approx(0.5, rel=1e-5) and params[1].grad.norm() < 0.5
