"""DINO: the loss against the official loop, the exact hard-view selection against brute
force, state hygiene of the selection pass, teacher reuse, HVP off = baseline, schedules,
and a tiny Hydra run."""

from __future__ import annotations

import math
from itertools import combinations
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from hvp_lightning.heads import DINOHead
from hvp_lightning.methods import METHODS
from hvp_lightning.methods.dino import DINO, dino_cross_entropy, dino_exact_selection, dino_loss
from hvp_lightning.selection import candidate_counts, choose
from hvp_lightning.teacher import (Centering, clip_gradients_per_parameter, cosine_momentum, ema_update, make_teacher,
                                   teacher_temperature)

from .conftest import make_cfg as compose_cfg, official_pairs, score_and_assert_stateless, tiny_vit_run

VIT = ["backbone=vit_tiny", "backbone.patch_size=8", "backbone.img_size=32", "+backbone.depth=1",
       "backbone.drop_path_rate=0.0"]
TINY = ["method=dino_cifar", "method.out_dim=64", "method.head_hidden_dim=32",
        "method.bottleneck_dim=16", "logger=csv", "data.num_workers=0"]


def make_cfg(*overrides: str, backbone: tuple[str, ...] = tuple(VIT)) -> DictConfig:
    return compose_cfg(*TINY, *backbone, *overrides, tiny=False)


def make_batch(cfg: DictConfig, b: int = 3, seed: int = 0) -> dict:
    augs = DINO.view_augs(cfg)
    g = torch.Generator().manual_seed(seed)
    views = [torch.randn(b, 3, a.size, a.size, generator=g) for a in augs]
    # crop_x encodes (sample, view position) so tests can check that parameters travel along.
    crop_x = torch.arange(b)[:, None] * 100.0 + torch.arange(len(augs))[None].float()
    return {"views": views, "params": {"crop_x": crop_x}, "label": torch.zeros(b, dtype=torch.long),
            "index": torch.arange(b)}


def reference_dino_loss(student_output: torch.Tensor, teacher_output: torch.Tensor, center: torch.Tensor,
                        tau_t: float, tau_s: float, ncrops: int) -> torch.Tensor:
    """The official DINO loss, written in its loop form (concatenated crops, chunked)."""
    student_out = (student_output / tau_s).chunk(ncrops)
    teacher_out = F.softmax((teacher_output - center) / tau_t, dim=-1).chunk(2)
    total, n_terms = 0.0, 0
    for iq, q in enumerate(teacher_out):
        for v in range(len(student_out)):
            if v == iq:
                continue
            loss = torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1)
            total += loss.mean()
            n_terms += 1
    return total / n_terms  # type: ignore[return-value]


def _logits(*shape: int, seed: int) -> torch.Tensor:
    return 3 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- the loss ----------------------------------------------------------------------------


@pytest.mark.parametrize("num_local", [0, 3])
def test_dino_loss_matches_official_loop(num_local: int) -> None:
    b, k = 5, 12
    t = _logits(2, b, k, seed=0)
    s = _logits(2 + num_local, b, k, seed=1)
    center = _logits(1, k, seed=2) * 0.1
    per_sample = dino_loss(list(t), list(s), center, 0.04, 0.1)
    assert per_sample.shape == (b,)
    expected = reference_dino_loss(s.flatten(0, 1), t.flatten(0, 1), center, 0.04, 0.1, 2 + num_local)
    torch.testing.assert_close(per_sample.mean(), expected)
    # dino_cross_entropy is one term of it.
    ce = dino_cross_entropy(t[0], s[1], center, 0.04, 0.1)
    ref = -(F.softmax((t[0] - center) / 0.04, -1) * F.log_softmax(s[1] / 0.1, -1)).sum(-1)
    torch.testing.assert_close(ce, ref)


# --- exact selection vs brute force ----------------------------------------------------------


def _brute_force(T, S_glob, S_loc, L, center, tau_t, tau_s, rule="all"):
    combos = [(p, loc) for p in official_pairs(T.shape[0], rule) for loc in combinations(range(S_loc.shape[0]), L)]
    losses = [dino_loss([T[g1], T[g2]], [S_glob[g1], S_glob[g2], *(S_loc[j] for j in loc)], center, tau_t, tau_s)
              for (g1, g2), loc in combos]
    return torch.stack(losses, 1), combos  # [B, C(G,2) * C(Lc,L)]


def _loss_of_choice(T, S_glob, S_loc, sel, center, tau_t, tau_s):
    b = torch.arange(T.shape[1])
    g1, g2 = sel.pair.unbind(1)
    student = [S_glob[g1, b], S_glob[g2, b], *(S_loc[sel.locals[:, s], b] for s in range(sel.locals.shape[1]))]
    return dino_loss([T[g1, b], T[g2, b]], student, center, tau_t, tau_s)


@pytest.mark.parametrize("rule", ["cross", "all"])
@pytest.mark.parametrize("mode,G,Lc,L", [("hard", 4, 6, 3), ("easy", 4, 6, 3), ("hard", 4, 5, 0), ("hard", 5, 3, 1)])
def test_exact_selection_equals_brute_force(mode: str, G: int, Lc: int, L: int, rule: str) -> None:
    B, K = 7, 16
    T, S_glob, S_loc = _logits(G, B, K, seed=3), _logits(G, B, K, seed=4), _logits(Lc, B, K, seed=5)
    center, tau_t, tau_s = _logits(1, K, seed=6) * 0.1, 0.07, 0.1
    sel = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, mode, global_pairs=rule)
    brute, combos = _brute_force(T, S_glob, S_loc, L, center, tau_t, tau_s, rule)
    assert brute.shape == (B, len(official_pairs(G, rule)) * math.comb(Lc, L))
    best = brute.max(1).values if mode == "hard" else brute.min(1).values
    torch.testing.assert_close(sel.loss, best)
    # The reported loss is the official loss of the chosen crops, and the crops are valid.
    torch.testing.assert_close(_loss_of_choice(T, S_glob, S_loc, sel, center, tau_t, tau_s), sel.loss)
    assert {tuple(p) for p in sel.pair.tolist()} <= set(official_pairs(G, rule))
    assert all(len(set(row)) == L for row in sel.locals.tolist())
    # ... and they are the brute-force optimum itself (ties are measure-zero with random logits).
    arg = brute.argmax(1) if mode == "hard" else brute.argmin(1)
    for b in range(B):
        (g1, g2), loc = combos[int(arg[b])]
        assert tuple(sel.pair[b].tolist()) == (g1, g2)
        assert sorted(sel.locals[b].tolist()) == list(loc)


def test_random_and_sampled_selection() -> None:
    G, Lc, L, B, K = 4, 6, 3, 6, 16
    T, S_glob, S_loc = _logits(G, B, K, seed=7), _logits(G, B, K, seed=8), _logits(Lc, B, K, seed=9)
    center, tau_t, tau_s = torch.zeros(1, K), 0.04, 0.1
    brute, _ = _brute_force(T, S_glob, S_loc, L, center, tau_t, tau_s, "cross")
    gen = lambda: torch.Generator().manual_seed(11)  # noqa: E731
    rand = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, "random", generator=gen())
    torch.testing.assert_close(_loss_of_choice(T, S_glob, S_loc, rand, center, tau_t, tau_s), rand.loss)
    again = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, "random", generator=gen())
    assert torch.equal(rand.pair, again.pair) and torch.equal(rand.locals, again.locals)
    # K sampled combinations (the paper's setting): the best of them, never above the exact max.
    sampled = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, "hard", max_combinations=8,
                                   generator=gen())
    torch.testing.assert_close(_loss_of_choice(T, S_glob, S_loc, sampled, center, tau_t, tau_s), sampled.loss)
    assert (sampled.loss <= brute.max(1).values + 1e-6).all()
    # K >= all combinations is the exact search.
    full = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, "hard", max_combinations=10_000)
    torch.testing.assert_close(full.loss, brute.max(1).values)


@pytest.mark.parametrize("rule", ["cross", "all"])
@pytest.mark.parametrize("max_combinations", [None, 8])
def test_random_and_sampled_draws_stay_in_the_pair_set(rule: str, max_combinations: int | None) -> None:
    """Random mode is uniform over the chosen pair set, and the sampled mode draws from it:
    with ``cross`` no same-pipeline pair such as (0, 2) is ever trained on."""
    G, Lc, L, B, K = 6, 4, 2, 3000, 8
    T, S_glob, S_loc = _logits(G, B, K, seed=20), _logits(G, B, K, seed=21), _logits(Lc, B, K, seed=22)
    center, gen = torch.zeros(1, K), torch.Generator().manual_seed(5)
    mode = "random" if max_combinations is None else "hard"
    sel = dino_exact_selection(T, S_glob, S_loc, L, center, 0.04, 0.1, mode, max_combinations, gen, rule)
    allowed = official_pairs(G, rule)
    counts = {p: 0 for p in allowed}
    for p in map(tuple, sel.pair.tolist()):
        counts[p] += 1  # KeyError: a pair outside the set
    assert len(counts) == len(allowed)
    if mode == "random":  # uniform: each pair's count within 5 sigma of B / P
        expected = B / len(allowed)
        sigma = math.sqrt(expected * (1 - 1 / len(allowed)))
        assert all(abs(c - expected) < 5 * sigma for c in counts.values()), counts
    torch.testing.assert_close(_loss_of_choice(T, S_glob, S_loc, sel, center, 0.04, 0.1), sel.loss)


@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_nonfinite_local_terms_are_never_chosen(mode: str) -> None:
    """A NaN local candidate (say an fp16 overflow) must not make every pair's column NaN:
    the exact search picks the best combination of finite locals."""
    G, Lc, L, B, K = 4, 5, 2, 6, 16
    T, S_glob, S_loc = _logits(G, B, K, seed=23), _logits(G, B, K, seed=24), _logits(Lc, B, K, seed=25)
    S_loc[1, :2] = float("nan")
    S_loc[3, 0] = float("inf")
    center, tau_t, tau_s = torch.zeros(1, K), 0.04, 0.1
    sel = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, mode)
    assert torch.isfinite(sel.loss).all()
    brute, combos = _brute_force(T, S_glob, S_loc, L, center, tau_t, tau_s, "cross")
    finite = brute.masked_fill(~torch.isfinite(brute), float("-inf") if mode == "hard" else float("inf"))
    torch.testing.assert_close(sel.loss, finite.max(1).values if mode == "hard" else finite.min(1).values)
    assert not (sel.locals[:2] == 1).any() and not (sel.locals[0] == 3).any()


# --- the LightningModule ---------------------------------------------------------------------


def test_registered_and_view_layout() -> None:
    assert METHODS["dino"] is DINO
    cfg = make_cfg()
    augs = DINO.view_augs(cfg)
    assert [a.size for a in augs] == [32, 32, 16, 16]
    assert [a.blur_p for a in augs] == [1.0, 0.1, 0.5, 0.5]
    assert [a.solarize_p for a in augs] == [0.0, 0.2, 0.0, 0.0]
    assert augs[0].scale == (0.4, 1.0) and augs[2].scale == (0.05, 0.4)
    hvp = make_cfg("+hvp=on")
    assert candidate_counts(hvp) == (4, 4)
    augs = DINO.view_augs(hvp)
    assert [a.blur_p for a in augs] == [1.0, 0.1, 1.0, 0.1, 0.5, 0.5, 0.5, 0.5]
    assert candidate_counts(make_cfg("+hvp=on", "hvp.num_global_candidates=3", "hvp.num_local_candidates=5")) == (3, 5)


def test_model_selection_equals_brute_force_and_gathers_views() -> None:
    torch.manual_seed(0)
    cfg = make_cfg("+hvp=on")
    model = DINO(cfg).train()
    batch = make_batch(cfg, b=3)
    G, L = model.num_globals, model.num_local
    table = model.score_candidates(batch)
    assert table.shape == (3, len(official_pairs(G)))  # hvp.global_pairs=cross by default
    choice = choose(table, "hard")
    sel = model.select_views(batch, choice)
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
    cfg = make_cfg("+hvp=on", "hvp.mode=random", "method.use_bn_in_head=true", "method.local_crop_size=8",
                   "data.crop_size=16", backbone=resnet)
    model = DINO(cfg).train()
    assert not model.teacher_reuse  # BatchNorm teacher: the training step forwards again
    batch = make_batch(cfg, b=4)
    model.centering.center.normal_()  # a non-trivial centre
    before = model.state_dict()
    assert any("running_mean" in k for k in before) and any(k.startswith("teacher.") for k in before)
    table = score_and_assert_stateless(model, batch)
    sel = model.select_views(batch, choose(table, "random", torch.Generator().manual_seed(0)))
    assert "teacher_out" not in sel


def test_teacher_reuse_equals_second_teacher_forward() -> None:
    torch.manual_seed(0)
    cfg = make_cfg("+hvp=on", "backbone.drop_path_rate=0.1")
    model = DINO(cfg).train()
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
    base = DINO(cfg).train()
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
    hvp = DINO(make_cfg("+hvp=on", "hvp.every_n_steps=2"))
    hvp.load_state_dict(base.state_dict())
    hvp.centering.center.copy_(c)
    hvp.hvp_active = lambda: False  # type: ignore[method-assign]
    hvp_batch = make_batch(make_cfg("+hvp=on"), b=3)
    g = hvp.num_globals
    plain = dict(hvp_batch, views=hvp_batch["views"][:2] + hvp_batch["views"][g:g + 2])
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


def test_freeze_last_layer_and_per_parameter_clipping() -> None:
    model = DINO(make_cfg("method.clip_grad=0.5"))
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.full_like(p, 10.0)
    model.clip_and_freeze_gradients()  # epoch 0 < freeze_last_layer=1
    assert all(p.grad is None for p in model.head.last_layer.parameters())
    norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    assert norms and max(norms) <= 0.5 + 1e-4
    groups = model.param_groups()
    assert groups[1]["weight_decay"] == 0.0 and all(p.ndim <= 1 for p in groups[1]["params"])
    n_student = sum(1 for n, p in model.named_parameters() if p.requires_grad and not n.startswith("teacher."))
    assert sum(len(g["params"]) for g in groups) == n_student


# --- end to end ----------------------------------------------------------------------------


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
