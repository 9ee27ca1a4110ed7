"""iBOT's module: its masks, the masked ViT forward, exact hard-view selection over global
pairs against brute force (masks travelling with their views), state hygiene of the selection
pass, teacher reuse, HVP off = baseline, and a tiny Hydra run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from hvp_lightning.config import ConfigError, check_options
from hvp_lightning.losses import ibot_loss
from hvp_lightning.methods import METHODS
from hvp_lightning.methods.dino import DINO
from hvp_lightning.methods.ibot import IBOT
from hvp_lightning.nn.backbones import vit_tokens
from hvp_lightning.nn.heads import IBOTHead
from hvp_lightning.nn.teacher import ema_update
from hvp_lightning.selection import choose

from ..conftest import augs_of, build, counts_of, official_pairs, score_and_assert_stateless, tiny_vit_run
from ..conftest import make_cfg as compose_cfg
from ..losses.test_ibot import reference_ibot_loss

VIT = [
    "backbone=vit_tiny",
    "backbone.patch_size=8",
    "backbone.img_size=32",
    "backbone.depth=1",
    "backbone.drop_path_rate=0.0",
]
TINY = [
    "method=ibot_cifar",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
    "logger=csv",
    "data.num_workers=0",
]
TOL = dict(rtol=1e-4, atol=1e-5)


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


def with_masks(model: IBOT, batch: dict, seed: int = 0) -> dict:
    """Distinct, non-empty masks on every global (the drawn ones may leave some unmasked)."""
    g = model.num_globals
    grid = batch["views"][0].shape[-1] // model.backbone.patch_size
    gen = torch.Generator().manual_seed(seed)
    masks = [torch.rand(batch["views"][0].shape[0], grid, grid, generator=gen) < 0.4 for _ in range(g)]
    for m in masks:
        m[:, 0, 0] = True
    return dict(batch, masks=masks)


# --- the module's masks and the masked forward ----------------------------------------------------------------


def test_module_masks_one_per_global_view_recomputable() -> None:
    # The module's masks: one per global view on the patch grid, recomputable, RNG untouched.
    model = build(make_cfg("+hvp=on"))
    batch = make_batch(make_cfg("+hvp=on"), b=4)
    state = torch.get_rng_state()
    a, b = model.make_masks(batch, 3), model.make_masks(batch, 3)
    assert torch.equal(torch.get_rng_state(), state)
    assert len(a) == 4 and a[0].shape == (4, 4, 4) and all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, model.make_masks(batch, 4)))  # per micro-batch


def test_vit_tokens_mask_token() -> None:
    torch.manual_seed(0)
    model = build(make_cfg())
    x = torch.randn(2, 3, 32, 32)
    cls, patches = vit_tokens(model.backbone, x)
    assert patches.shape == (2, 16, 192)
    torch.testing.assert_close(cls, model.backbone(x))  # unmasked: the ordinary forward
    # Masked patches lose their content: changing their pixels changes nothing.
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    mask[:, 1:3, 0:2] = True
    y = x.clone()
    y[:, :, 8:24, 0:16] = torch.randn(2, 3, 16, 16)
    model.mask_token.data.normal_()
    a = vit_tokens(model.backbone, x, mask, model.mask_token)
    b = vit_tokens(model.backbone, y, mask, model.mask_token)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a[0], cls)
    a[1].sum().backward()
    assert model.mask_token.grad is not None and model.mask_token.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        vit_tokens(model.backbone, x, torch.zeros(2, 3, 3, dtype=torch.bool), model.mask_token)


# --- exact selection vs brute force -----------------------------------------------------------


def _model_loss(model: IBOT, views: list, masks: list, teacher_out=None) -> torch.Tensor:
    """The per-sample iBOT loss of (2 globals + locals) through the model's own forwards."""
    with torch.no_grad():
        if teacher_out is None:
            teacher_out = model._token_forward(model.teacher.backbone, model.teacher.head, views[:2])
        sc, sp = model._token_forward(model.backbone, model.head, views[:2], masks)
        sc += [model.head(model.backbone(v)) for v in views[2:]]
        m = model.settings
        return ibot_loss(
            teacher_out[0],
            sc,
            teacher_out[1],
            sp,
            masks,
            model.centering.center,
            model.patch_centering.center,
            model.teacher_temp(),
            model.teacher_patch_temp(),
            m.student_temp,
            m.lambda1,
            m.lambda2,
        )


@pytest.mark.parametrize(("rule", "locals_"), [("cross", 2), ("all", 2), ("cross", 0)])
def test_model_selection_equals_brute_force_and_masks_travel(rule: str, locals_: int) -> None:
    """With 2 locals and with none (the paper's iBOT preset: global views only)."""
    torch.manual_seed(0)
    cfg = make_cfg("+hvp=on", "method.lambda2=1.5", f"hvp.global_pairs={rule}", f"method.num_local_crops={locals_}")
    model = build(cfg).train()
    model.centering.center.normal_()
    model.patch_centering.center.normal_()
    batch = with_masks(model, make_batch(cfg, b=3))
    G, L = model.num_globals, model.num_local
    assert (G, L) == (4, locals_)
    scores = model.score_candidates(batch)
    table = scores.table
    assert table.shape == (3, len(official_pairs(G, rule)))
    views, masks = batch["views"], batch["masks"]
    brute = torch.stack(
        [
            _model_loss(model, [views[a], views[b], *views[G:]], [masks[a], masks[b]])
            for a, b in official_pairs(G, rule)
        ],
        1,
    )
    torch.testing.assert_close(table, brute, **TOL)
    choice = choose(table, "hard")
    assert torch.equal(choice, brute.argmax(1))
    sel = model.select_views(batch, choice, scores.context)
    assert len(sel["views"]) == 2 + L and len(sel["masks"]) == 2 and "teacher_out" in sel  # ViT teacher: reused
    # The gathered batch gives, through the training step's loss, the selected value...
    selected = table.gather(1, choice[:, None]).squeeze(1)
    torch.testing.assert_close(_model_loss(model, sel["views"], sel["masks"], sel["teacher_out"]), selected, **TOL)
    torch.testing.assert_close(_model_loss(model, sel["views"], sel["masks"]), selected, **TOL)
    # ... and each sample's views, masks and parameters are its own chosen candidates.
    pairs = torch.tensor(official_pairs(G, rule))[choice]
    pos = sel["params"]["crop_x"] - torch.arange(3)[:, None] * 100
    for b in range(3):
        assert pos[b].long().tolist() == [*pairs[b].tolist(), *range(G, G + L)]
        for slot, p in enumerate(pos[b].long().tolist()):
            assert torch.equal(sel["views"][slot][b], views[p][b])
            if slot < 2:
                assert torch.equal(sel["masks"][slot][b], masks[p][b])


def test_selection_pass_leaves_state_unchanged() -> None:
    torch.manual_seed(0)
    cfg = make_cfg("+hvp=on", "hvp.mode=random", "method.use_bn_in_head=true", "backbone.drop_path_rate=0.1")
    model = build(cfg).train()
    assert not model.teacher_reuse  # BatchNorm teacher head: the training step forwards again
    batch = with_masks(model, make_batch(cfg, b=4))
    model.centering.center.normal_()
    model.patch_centering.center.normal_()
    before = model.state_dict()
    assert any("running_mean" in k for k in before) and any(k.startswith("teacher.") for k in before)
    assert "centering.center" in before and "patch_centering.center" in before
    scores = score_and_assert_stateless(model, batch)
    sel = model.select_views(batch, choose(scores.table, "random", torch.Generator().manual_seed(0)), scores.context)
    assert "teacher_out" not in sel


def test_teacher_reuse_equals_second_teacher_forward() -> None:
    torch.manual_seed(0)
    cfg = make_cfg("+hvp=on", "backbone.depth=2", "backbone.drop_path_rate=0.1")
    model = build(cfg).train()
    assert model.teacher_reuse and len(model.backbone.trunk.blocks) == 2
    model.centering.center.normal_()
    model.patch_centering.center.normal_()
    batch = make_batch(cfg, b=3)
    c0, p0 = model.centering.center.clone(), model.patch_centering.center.clone()
    results = []
    for reuse in (True, False):
        model.teacher_reuse = reuse
        model.centering.center.copy_(c0)
        model.patch_centering.center.copy_(p0)
        torch.manual_seed(1)  # same drop-path draws in the student
        loss = model.training_step(batch, 0)
        model.centering.step()  # what on_train_batch_end does once per optimiser step
        model.patch_centering.step()
        results.append((loss.detach(), model.centering.center.clone(), model.patch_centering.center.clone()))
    (l1, c1, q1), (l2, c2, q2) = results
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c1, c2, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(q1, q2, rtol=1e-5, atol=1e-7)
    assert not torch.equal(c1, c0) and not torch.equal(q1, p0)  # the training step (only) feeds both centres


def test_hvp_off_equals_baseline_step() -> None:
    torch.manual_seed(0)
    cfg = make_cfg()
    base = build(cfg).train()
    base.mask_token.data.normal_()
    batch = make_batch(cfg, b=3)
    c, c2 = base.centering.center.clone(), base.patch_centering.center.clone()
    masks = base.make_masks(batch, 0)
    loss = base.training_step(batch, 0)  # draws the same masks itself
    # The official loss on the same crops and masks, from concatenated forwards.
    with torch.no_grad():
        tc, tp = vit_tokens(base.teacher.backbone, torch.cat(batch["views"][:2]))
        t_cls, t_patch = base.teacher.head.forward_tokens(tc, tp)
        sc, sp = vit_tokens(base.backbone, torch.cat(batch["views"][:2]), torch.cat(masks), base.mask_token)
        s_cls, s_patch = base.head.forward_tokens(sc, sp)
        s_cls = torch.cat([s_cls, *(base.head(base.backbone(v)) for v in batch["views"][2:])])
    m = cfg.method
    expected = reference_ibot_loss(
        s_cls,
        s_patch,
        t_cls,
        t_patch,
        masks,
        c,
        c2[None],
        base.teacher_temp(),
        base.teacher_patch_temp(),
        m.student_temp,
        2,
        len(batch["views"]),
        m.lambda1,
        m.lambda2,
    )
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)
    # HVP enabled on an off-step (every_n_steps): globals 0, 1 with their masks, i.e. the baseline.
    hvp_cfg = make_cfg("+hvp=on", "hvp.every_n_steps=2")
    hvp = build(hvp_cfg)
    hvp.load_state_dict(base.state_dict())
    hvp.centering.center.copy_(c)
    hvp.patch_centering.center.copy_(c2)
    hvp.hvp_active = lambda: False  # type: ignore[method-assign]
    hvp_batch = make_batch(hvp_cfg, b=3)
    g = hvp.num_globals
    hvp_masks = hvp.make_masks(hvp_batch, 0)
    plain = dict(hvp_batch, views=hvp_batch["views"][:2] + hvp_batch["views"][g:], masks=hvp_masks[:2])
    base.centering.center.copy_(c)
    base.patch_centering.center.copy_(c2)
    torch.testing.assert_close(hvp.training_step(hvp_batch, 0), base.training_step(plain, 0))


# --- config, head, registry --------------------------------------------------------------------


def test_registered_view_layout_and_config_errors() -> None:
    assert METHODS["ibot"] is IBOT and issubclass(IBOT, DINO)
    cfg = make_cfg()
    assert [a.size for a in augs_of(cfg)] == [32, 32, 16, 16]
    hvp = make_cfg("+hvp=on")
    augs = augs_of(hvp)
    assert [a.blur_p for a in augs] == [1.0, 0.1, 1.0, 0.1, 0.5, 0.5]  # G=4 global candidates, L=2 locals
    assert counts_of(make_cfg("+hvp=on", "hvp.num_global_candidates=6")) == (6, 2)
    # iBOT's settings are checked at start-up (hvp_lightning/config.py), not by the method
    with pytest.raises(ConfigError, match="global views only"):
        check_options(make_cfg("+hvp=on", "hvp.num_local_candidates=4"))
    with pytest.raises(ConfigError, match="ViT"):
        check_options(make_cfg(backbone=("backbone=resnet18_narrow",)))
    with pytest.raises(ConfigError, match="mask_ratio"):
        check_options(make_cfg("method.mask_ratio=[0.5,0.1]"))
    with pytest.raises(ConfigError, match="max_combinations"):
        check_options(make_cfg("+hvp=on", "hvp.max_combinations=4"))
    full = compose_cfg(*["method=ibot", "backbone=vit_small", "data/aug=imagenet"], tiny=False)
    assert full.method.out_dim == 8192 and full.method.shared_head and full.method.num_local_crops == 10
    assert counts_of(full) == (2, 10)


def test_separate_patch_head_freeze_and_ema() -> None:
    model = build(make_cfg("method.shared_head=false", "method.patch_out_dim=24"))
    assert isinstance(model.head, IBOTHead) and model.head.last_layer2 is not None
    assert model.patch_centering.center.shape == (1, 24)
    c, p = model.head.forward_tokens(torch.randn(2, 192), torch.randn(2, 5, 192))
    assert c.shape == (2, 64) and p.shape == (2, 5, 24)
    shared = build(make_cfg())
    assert shared.head.last_layer2 is None and shared.patch_centering.center.shape == (1, 64)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.ones_like(p)
    model.clip_and_freeze_gradients()  # epoch 0 < freeze_last_layer=1: both output layers
    assert all(p.grad is None for n, p in model.head.named_parameters() if n.startswith("last_layer"))
    assert model.mask_token.grad is not None and model.head.mlp[0].weight.grad is not None
    ema_update(model.teacher.head, model.head, 0.5)  # same parameter lists (last_layer2 included)
    with pytest.raises(ValueError):
        IBOTHead(8, 16, 12, shared=True)


# --- end to end --------------------------------------------------------------------------------


@pytest.mark.slow  # a run
def test_tiny_hydra_run(tmp_path: Path) -> None:
    summary, state, metrics = tiny_vit_run("ibot", tmp_path)
    for key in ("centering.center", "patch_centering.center"):
        assert not torch.equal(state[key], torch.zeros_like(state[key])), key
    assert "mask_token" in state and not torch.equal(state["mask_token"], torch.zeros_like(state["mask_token"]))
    assert not any(k.startswith("teacher.") and "mask_token" in k for k in state)
    assert "train/loss_patch_step" in metrics and "hvp/selection_selected_loss_step" in metrics
    assert "hvp/trained_loss_step" in metrics
