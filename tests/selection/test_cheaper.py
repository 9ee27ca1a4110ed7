"""The cheaper selections: hvp.selection_scale (downscaled candidates),
hvp.selection_fraction (part of the samples) and hvp.mode=min_iou (no forward), each against a
brute force of its own definition, and the defaults on today's path."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from hvp_lightning.config import ConfigError, check_options
from hvp_lightning.data.batched import finish_views
from hvp_lightning.data.datamodule import view_aug
from hvp_lightning.data.static_colour import share_colour
from hvp_lightning.selection import (
    HVPConfig,
    choose,
    crop_iou,
    fit_mask,
    frozen_state,
    least_overlap,
    least_overlapping_locals,
    pair_index,
    scale_views,
    scored_count,
    scored_samples,
    selection_side,
    stable_seed,
    summarise_totals,
)
from hvp_lightning.selection import mixin as mixin_module
from hvp_lightning.selection import scale as scale_module
from hvp_lightning.training.cost import count_step_flops

from ..conftest import build, typed
from ..methods import test_dino, test_ibot
from .test_static_colour import _batch as static_batch


def _quiet(model):
    logged: dict = {}
    model.log = lambda name, value, *a, **k: logged.__setitem__(name, value)  # type: ignore[method-assign]
    return logged


def _capture_step(model) -> dict:
    """Replace ``model.ssl_step`` by one that keeps the batch it is handed (under "step") and
    returns 0, so a test reads which views the mixin trained; ``self.log`` goes nowhere."""
    seen: dict = {}
    model.ssl_step = lambda b, i: seen.setdefault("step", b) and torch.zeros(())  # type: ignore[method-assign]
    _quiet(model)
    return seen


def _resized(views: list[torch.Tensor], factor: int) -> list[torch.Tensor]:
    """Each view on its own, ``1/factor`` of its side: the reference for the batched resize."""
    return [
        F.interpolate(v, size=(v.shape[-2] // factor, v.shape[-1] // factor), mode="bilinear", antialias=True)
        for v in views
    ]


def _pair_views(batch: dict, choice: torch.Tensor) -> list[torch.Tensor]:
    n = len(batch["views"])
    pairs, rows = pair_index(n)[choice], torch.arange(choice.shape[0])
    stacked = torch.stack(batch["views"])
    return [stacked[pairs[:, 0], rows], stacked[pairs[:, 1], rows]]


# --- hvp.selection_scale -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("side", "scale", "multiple", "minimum", "expected"),
    [
        (224, 0.5, 16, 16, 112),
        (224, 0.3, 16, 16, 64),  # 67.2 px = 4.2 patches -> 4
        (224, 0.33, 16, 16, 80),  # 73.9 px = 4.6 patches -> 5
        (24, 0.5, 8, 8, 16),  # 1.5 patches: half rounds up
        (9, 0.5, 1, 1, 5),
        (96, 0.01, 16, 16, 16),  # at least one patch
        (32, 0.1, 1, 8, 8),  # a CIFAR-stem ResNet's smallest input
        (16, 0.25, 1, 32, 16),  # never above the side itself
        (32, 1.0, 1, 8, 32),
    ],
)
def test_selection_side_rule(side, scale, multiple, minimum, expected):
    assert selection_side(side, scale, multiple, minimum) == expected


def test_scale_views_one_resize_per_size_in_order(monkeypatch):
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(3, 3, s, s, generator=g) for s in (32, 32, 16, 32, 16)]
    calls = []
    real = scale_module.F.interpolate

    def counted(x, *args, **kwargs):
        calls.append(tuple(x.shape))
        return real(x, *args, **kwargs)

    monkeypatch.setattr(scale_module.F, "interpolate", counted)
    out = scale_views(views, 0.5)
    assert calls == [(9, 3, 32, 32), (6, 3, 16, 16)]  # one batched op per view size
    for got, want in zip(out, _resized(views, 2)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    kept = scale_views(views, 0.5, multiple=1, minimum=32)  # 32 px stays, 16 px cannot shrink
    assert all(k is v for k, v in zip(kept, views))


def test_fit_mask_keeps_blocks_on_a_smaller_grid():
    mask = torch.zeros(2, 4, 4, dtype=torch.bool)
    mask[0, :2, :2] = True  # a block in the top-left quarter
    mask[1, 2:, :] = True  # the bottom half
    small = fit_mask(mask, (2, 2))
    assert small.tolist() == [[[True, False], [False, False]], [[False, False], [True, True]]]
    assert fit_mask(mask, (4, 4)) is mask


def test_scaled_selection_scores_resized_copies_and_trains_at_full_size(cfg_factory):
    torch.manual_seed(0)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=3", "hvp.selection_scale=0.5")).train()
    _quiet(model)
    batch = {"views": [torch.randn(6, 3, 16, 16) for _ in range(3)]}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss = model.training_step(batch, 0)
    model.load_state_dict(state)
    with frozen_state(model, torch.device("cpu")):
        table = model.candidate_scores({"views": _resized(batch["views"], 2)})  # 8 px: the definition
    torch.testing.assert_close(model.last_selection["table"], table, rtol=1e-5, atol=1e-6)
    choice = model.last_selection["choice"]
    assert torch.equal(choice, choose(model.last_selection["table"], "hard"))
    chosen = _pair_views(batch, choice)
    assert chosen[0].shape[-1] == 16
    torch.testing.assert_close(loss, model.ssl_step({"views": chosen}, 0))  # the full-size chosen pair


def test_defaults_take_todays_path(cfg_factory, monkeypatch):
    """selection_scale=1 and selection_fraction=1 (the defaults) never resize nor cut a batch."""
    assert (HVPConfig().selection_scale, HVPConfig().selection_fraction) == (1.0, 1.0)

    def boom(*args, **kwargs):
        raise AssertionError("called at the default settings")

    monkeypatch.setattr(mixin_module, "scale_views", boom)
    monkeypatch.setattr(mixin_module, "scored_samples", boom)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=3")).train()
    _quiet(model)
    model.training_step({"views": [torch.randn(4, 3, 16, 16) for _ in range(3)]}, 0)


def test_dino_scales_globals_and_locals_and_forwards_the_teacher_again():
    torch.manual_seed(0)
    cfg = test_dino.make_cfg("+hvp=on", "hvp.selection_scale=0.5")
    model = build(cfg).train()
    _quiet(model)
    batch = test_dino.make_batch(cfg, b=3)
    assert model.selection_size_rule() == (8, 8)  # the ViT's patch
    scores = model.score_candidates(batch)
    assert scores.context.teacher is None  # outputs of small views are not the step's
    full = model.hvp
    model.hvp = full.replace(selection_scale=1.0)
    small = _resized(batch["views"], 2)  # globals 32 -> 16 px, locals 16 -> 8 px: a 2x2 and a 1x1 grid
    reference = model.score_candidates(dict(batch, views=small))
    assert reference.context.teacher is not None  # at full scale the teacher is reused
    torch.testing.assert_close(scores.table, reference.table, rtol=1e-5, atol=1e-6)
    model.hvp = full
    center = model.centering.center.clone()
    loss = model.training_step(batch, 0)
    choice = model.last_selection["choice"]
    chosen = model.select_views(batch, choice, scores.context)
    assert "teacher_out" not in chosen and chosen["views"][0].shape[-1] == 32
    model.centering.center.copy_(center)
    torch.testing.assert_close(loss, model.ssl_step(chosen, 0))


def test_ibot_reads_its_masks_on_the_smaller_grid():
    torch.manual_seed(0)
    cfg = test_ibot.make_cfg("+hvp=on", "hvp.selection_scale=0.5")
    model = build(cfg).train()
    batch = test_ibot.with_masks(model, test_ibot.make_batch(cfg, b=3))
    scores = model.score_candidates(batch)
    assert scores.context is None  # no teacher reuse
    model.hvp = model.hvp.replace(selection_scale=1.0)
    small = dict(batch, views=_resized(batch["views"], 2), masks=[fit_mask(m, (2, 2)) for m in batch["masks"]])
    torch.testing.assert_close(scores.table, model.score_candidates(small).table, rtol=1e-5, atol=1e-6)


# --- hvp.selection_fraction ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "fraction", "k"), [(256, 0.25, 64), (10, 0.3, 3), (10, 0.31, 4), (4, 0.1, 2), (1, 0.5, 1), (5, 1.0, 5)]
)
def test_scored_count(batch, fraction, k):
    assert scored_count(batch, fraction) == k


def _scored(model, b: int, batch_idx: int = 0) -> torch.Tensor:
    seed = stable_seed(model.seed, model.global_step, batch_idx, model.global_rank, 3)
    return scored_samples(b, model.hvp.selection_fraction, torch.Generator().manual_seed(seed), torch.device("cpu"))


def test_fraction_scores_a_seeded_part_and_trains_the_others_on_their_first_pair(cfg_factory):
    torch.manual_seed(0)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=3", "hvp.selection_fraction=0.5")).train()
    logged = _quiet(model)
    batch = {"views": [torch.randn(8, 3, 16, 16) for _ in range(3)]}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    loss = model.training_step(batch, 0)
    assert torch.equal(torch.get_rng_state(), rng)  # drawn from HVP's private generator
    model.load_state_dict(state)
    scored = _scored(model, 8)
    assert scored.tolist() == sorted(scored.tolist()) and len(scored) == 4
    assert not torch.equal(scored, _scored(model, 8, batch_idx=1))  # another micro-batch, another draw
    with frozen_state(model, torch.device("cpu")):  # the definition: the selection of the k samples alone
        table = model.candidate_scores({"views": [v[scored] for v in batch["views"]]})
    sel = model.last_selection
    torch.testing.assert_close(sel["table"][scored], table, rtol=1e-5, atol=1e-6)
    others = torch.ones(8, dtype=torch.bool)
    others[scored] = False
    assert sel["table"][others].isnan().all() and (sel["choice"][others] == 0).all()
    assert torch.equal(sel["choice"][scored], choose(table, "hard"))
    torch.testing.assert_close(loss, model.ssl_step({"views": _pair_views(batch, sel["choice"])}, 0))
    totals = summarise_totals(model.hvp_totals)
    assert (totals["selected_samples"], totals["scored_samples"]) == (8, 4)
    torch.testing.assert_close(logged["hvp/selection_selected_loss"], table.max(1).values.mean())


def test_dino_fraction_unscored_samples_keep_the_first_combination():
    torch.manual_seed(0)
    cfg = test_dino.make_cfg("+hvp=on", "hvp.selection_fraction=0.5")
    model = build(cfg).train()
    seen = _capture_step(model)
    batch = test_dino.make_batch(cfg, b=6)
    model.training_step(batch, 0)
    scored, g, n_loc = _scored(model, 6), model.num_globals, model.num_local
    step = seen["step"]
    assert "teacher_out" not in step  # part of the batch scored: the step runs its teacher
    pos = (step["params"]["crop_x"] - torch.arange(6)[:, None] * 100).long()  # view positions trained
    sub = {"views": [v[scored] for v in batch["views"]], "params": {"crop_x": batch["params"]["crop_x"][scored]}}
    scores = model.score_candidates(sub)
    picked = model.select_views(sub, choose(scores.table, "hard"), scores.context)
    want = (picked["params"]["crop_x"] - scored[:, None] * 100).long()
    first = torch.tensor([0, 1, *range(g, g + n_loc)])
    for b in range(6):
        expected = want[scored.tolist().index(b)] if b in scored else first
        assert pos[b].tolist() == expected.tolist()
        for slot, p in enumerate(pos[b].tolist()):
            assert torch.equal(step["views"][slot][b], batch["views"][p][b])


def test_ibot_fraction_masks_travel_with_their_views():
    torch.manual_seed(0)
    cfg = test_ibot.make_cfg("+hvp=on", "hvp.selection_fraction=0.5")
    model = build(cfg).train()
    seen = _capture_step(model)
    batch = test_ibot.with_masks(model, test_ibot.make_batch(cfg, b=4))
    model.training_step(batch, 0)
    step, choice = seen["step"], model.last_selection["choice"]
    pairs = torch.tensor([[0, 1], [0, 3], [2, 1], [2, 3]])[choice]  # cross pairs of G=4
    for b in range(4):
        for slot in (0, 1):
            k = int(pairs[b, slot])
            assert torch.equal(step["views"][slot][b], batch["views"][k][b])
            assert torch.equal(step["masks"][slot][b], batch["masks"][k][b])


# --- hvp.mode=min_iou ---------------------------------------------------------------------------


def _boxes(b: int, n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randint(0, 20, (b, n), generator=g), torch.randint(0, 20, (b, n), generator=g)
    w, h = torch.randint(4, 20, (b, n), generator=g), torch.randint(4, 20, (b, n), generator=g)
    params = {"crop_x": x, "crop_y": y, "crop_w": w, "crop_h": h}
    params["tag"] = torch.arange(b)[:, None] * 100 + torch.arange(n)  # which view went where
    return params


def _iou(p: dict, s: int, i: int, j: int) -> float:
    """Two boxes' IoU, the long way."""
    x1, y1, w1, h1 = (float(p[k][s, i]) for k in ("crop_x", "crop_y", "crop_w", "crop_h"))
    x2, y2, w2, h2 = (float(p[k][s, j]) for k in ("crop_x", "crop_y", "crop_w", "crop_h"))
    inter = max(0.0, min(x1 + w1, x2 + w2) - max(x1, x2)) * max(0.0, min(y1 + h1, y2 + h2) - max(y1, y2))
    return inter / (w1 * h1 + w2 * h2 - inter)


def test_least_overlap_equals_brute_force_first_column_on_ties():
    params = _boxes(16, 4)
    params["crop_x"][0] = torch.tensor([0, 50, 100, 150])  # sample 0: no two boxes overlap, every IoU 0
    pairs = pair_index(4)
    iou = crop_iou(params, pairs)
    choice = least_overlap(iou)
    for s in range(16):
        brute = [_iou(params, s, i, j) for i, j in pairs.tolist()]
        assert iou[s].tolist() == pytest.approx(brute)
        assert int(choice[s]) == brute.index(min(brute))  # the first of equal minima
    assert int(choice[0]) == 0


def test_min_iou_runs_no_forward_and_trains_the_least_overlapping_pair(cfg_factory, monkeypatch):
    torch.manual_seed(0)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=4", "hvp.mode=min_iou")).train()
    logged = _quiet(model)

    def no_forward(batch):
        raise AssertionError("min_iou ran a selection forward")

    monkeypatch.setattr(model, "candidate_scores", no_forward)
    params = _boxes(6, 4)
    batch = {"views": [torch.randn(6, 3, 16, 16) for _ in range(4)], "params": params}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    loss = model.training_step(batch, 0)
    model.load_state_dict(state)
    iou = crop_iou(params, pair_index(4))
    choice = least_overlap(iou)
    assert torch.equal(model.last_selection["choice"], choice) and model.last_selection["table"] is None
    torch.testing.assert_close(loss, model.ssl_step({"views": _pair_views(batch, choice)}, 0))
    torch.testing.assert_close(logged["hvp/selected_iou"], iou.min(1).values.mean())
    torch.testing.assert_close(logged["hvp/candidate_iou"], iou.mean())
    assert "hvp/selection_selected_loss" not in logged
    totals = summarise_totals(model.hvp_totals)
    assert (totals["selected_samples"], totals["scored_samples"]) == (6, 0)
    assert totals["selection_selected_loss_mean"] is None
    assert totals["trained_loss_mean"] == pytest.approx(float(loss.detach()))


def test_min_iou_needs_crop_boxes(cfg_factory):
    model = build(cfg_factory("+hvp=on", "hvp.num_views=3", "hvp.mode=min_iou"))
    with pytest.raises(KeyError, match="hvp.mode=min_iou: SimSiam's batch has no crop boxes"):
        model.training_step({"views": [torch.randn(2, 3, 16, 16)] * 3}, 0)


@pytest.mark.parametrize("rule", ["cross", "all"])
def test_dino_min_iou_least_overlapping_globals_then_locals(rule):
    cfg = test_dino.make_cfg("+hvp=on", "hvp.mode=min_iou", f"hvp.global_pairs={rule}", "method.num_local_crops=2")
    model = build(cfg).train()
    seen = _capture_step(model)
    g, lc, n_loc, b = model.num_globals, model.num_locals_cand, model.num_local, 12
    assert (g, lc, n_loc) == (4, 4, 2)
    batch = test_dino.make_batch(cfg, b=b)
    batch["params"] = _boxes(b, g + lc, seed=1)
    batch["params"]["crop_x"][0, g:] = torch.tensor([60, 70, 80, 90])  # sample 0: four locals off every global
    model.training_step(batch, 0)
    trained = (seen["step"]["params"]["tag"] - torch.arange(b)[:, None] * 100).tolist()
    pairs = [(i, j) for i, j in itertools.combinations(range(g), 2) if rule == "all" or (i % 2, j % 2) == (0, 1)]
    for s in range(b):
        pair_iou = [_iou(batch["params"], s, i, j) for i, j in pairs]
        g1, g2 = pairs[pair_iou.index(min(pair_iou))]
        to_pair = [_iou(batch["params"], s, g1, g + j) + _iou(batch["params"], s, g2, g + j) for j in range(lc)]
        best = min(itertools.combinations(range(lc), n_loc), key=lambda c: (sum(to_pair[j] for j in c), c))
        assert trained[s][:2] == [g1, g2]
        assert sorted(trained[s][2:]) == [g + j for j in best]  # the locals least overlapping the two
    assert trained[0][2:] == [g, g + 1]  # all four locals tie at 0: the first two


def test_least_overlapping_locals_without_locals():
    params = _boxes(2, 4)
    assert least_overlapping_locals(params, 4, torch.tensor([[0, 1]]), 0).shape == (2, 1, 0)


def test_ibot_min_iou_chooses_globals_and_keeps_the_locals():
    cfg = test_ibot.make_cfg("+hvp=on", "hvp.mode=min_iou")
    model = build(cfg).train()
    seen = _capture_step(model)
    batch = test_ibot.with_masks(model, test_ibot.make_batch(cfg, b=5))
    g = model.num_globals
    batch["params"] = _boxes(5, len(batch["views"]), seed=2)
    model.training_step(batch, 0)
    step = seen["step"]
    pairs = [(0, 1), (0, 3), (2, 1), (2, 3)]
    for s in range(5):
        k, l = pairs[min(range(4), key=lambda c: (_iou(batch["params"], s, *pairs[c]), c))]
        assert step["params"]["tag"][s].tolist()[:2] == [s * 100 + k, s * 100 + l]
        assert torch.equal(step["masks"][0][s], batch["masks"][k][s])
        assert torch.equal(step["masks"][1][s], batch["masks"][l][s])
    assert all(torch.equal(a, c) for a, c in zip(step["views"][2:], batch["views"][g:]))  # the locals


# --- how they compose ------------------------------------------------------------------------


@pytest.mark.parametrize("keys", [["hvp.selection_fraction=0.5"], ["hvp.selection_scale=0.5"], ["hvp.mode=min_iou"]])
def test_static_colour_colours_the_chosen_full_size_crops(cfg_factory, keys):
    torch.manual_seed(0)
    cfg = cfg_factory("+hvp=on", "hvp.colour=static", "data.crop_size=16", *keys)
    model = build(cfg).train()
    seen = _capture_step(model)
    batch = static_batch(cfg)
    crops, drawn, aug = list(batch["views"]), dict(batch["params"]), view_aug(typed(cfg).data)
    model.training_step(batch, 0)
    choice = model.last_selection["choice"]
    pairs, rows = pair_index(4)[choice], torch.arange(len(choice))
    chosen = [torch.stack(crops)[pairs[:, j], rows] for j in (0, 1)]
    shared = {k: v[rows[:, None], pairs] for k, v in share_colour(drawn).items()}
    want = finish_views(chosen, shared, (aug,) * 2)
    assert all(torch.equal(g, w) for g, w in zip(seen["step"]["views"], want))


def test_min_iou_off_steps_train_the_first_pair(cfg_factory, monkeypatch):
    model = build(cfg_factory("+hvp=on", "hvp.num_views=3", "hvp.mode=min_iou", "hvp.every_n_steps=2"))
    seen: dict = {}
    model.ssl_step = lambda b, i: seen.setdefault("step", b) and torch.zeros(())  # type: ignore[method-assign]
    monkeypatch.setattr(model, "hvp_active", lambda: False)
    batch = {"views": [torch.randn(3, 3, 16, 16) for _ in range(3)], "params": _boxes(3, 3)}
    model.training_step(batch, 0)
    assert seen["step"]["params"]["tag"].tolist() == [[0, 1], [100, 101], [200, 201]]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["hvp.mode=random", "hvp.selection_scale=0.5"], r"^hvp.selection_scale=0.5 is not allowed: 1 with hvp.mode=r"),
        (["hvp.mode=random", "hvp.selection_fraction=0.5"], r"^hvp.selection_fraction=0.5 is not allowed: 1 with hvp"),
        (["hvp.mode=min_iou", "hvp.selection_scale=0.5"], r"^hvp.selection_scale=0.5 is not allowed: 1 with hvp.mode"),
        (["hvp.mode=min_iou", "hvp.selection_precision=fp32"], r"^hvp.selection_precision='fp32' is not allowed: auto"),
        (["hvp.selection_scale=0"], r"^hvp.selection_scale=0 is not allowed: a number in \(0, 1\]"),
        (["hvp.selection_fraction=1.5"], r"^hvp.selection_fraction=1.5 is not allowed: a number in \(0, 1\]"),
    ],
)  # fmt: skip
def test_meaningless_combinations_are_refused_in_one_line(cfg_factory, keys, message):
    with pytest.raises(ConfigError, match=message):
        check_options(cfg_factory("+hvp=on", *keys))


def test_cheaper_selections_compose_with_the_other_keys(cfg_factory):
    for keys in (
        ["hvp.mode=easy", "hvp.selection_scale=0.5", "hvp.selection_fraction=0.25", "hvp.every_n_steps=2"],
        ["hvp.mode=min_iou", "hvp.every_n_steps=3", "hvp.colour=static"],
        ["method=dino", "backbone=vit_tiny", "hvp.mode=min_iou"],  # the preset's max_combinations is not read
        ["method=dino_cifar", "backbone=vit_tiny_cifar", "hvp.selection_scale=0.25", "hvp.max_combinations=8"],
    ):
        hvp = check_options(cfg_factory("+hvp=on", *keys)).hvp
        assert hvp.mode in ("easy", "hard", "min_iou") and math.isfinite(hvp.selection_scale)


@pytest.mark.slow  # a FLOP count per option
def test_counted_selection_flops_follow_each_option(cfg_factory):
    """The run's cost count (training/cost.py): min_iou's selection costs no model FLOP,
    selection_fraction scores ceil(f B) of the run's B samples, selection_scale shrinks the
    backbone's share by about the scale squared (the heads' share does not shrink)."""

    def count(*keys: str):
        return count_step_flops(typed(cfg_factory("+hvp=on", "hvp.num_views=3", "data.crop_size=32", *keys)))

    full, geometric = count(), count("hvp.mode=min_iou")
    assert geometric.selection == 0 and geometric.train == full.train
    assert count("hvp.selection_fraction=0.3").selection == pytest.approx(full.selection * 5 / 16, rel=1e-6)  # B=16
    scaled = count("hvp.selection_scale=0.5")
    assert 0.24 < scaled.selection / full.selection < 0.3 and scaled.train == full.train


def test_live_gallery_keeps_min_iou_overlaps_without_a_loss_table():
    """Under min_iou the mixin leaves no table: the live callback keeps the IoU histogram's data
    and shows no loss gallery."""
    from types import SimpleNamespace

    from hvp_lightning.analysis.live import LiveGallery

    params = _boxes(3, 4)
    choice = least_overlap(crop_iou(params, pair_index(4)))
    module = SimpleNamespace(hvp=HVPConfig(mode="min_iou"), last_selection={"table": None, "choice": choice})
    trainer = SimpleNamespace(is_global_zero=True, current_epoch=0, global_step=0)
    live = LiveGallery(2)
    live.on_train_batch_end(trainer, module, None, {"views": [torch.zeros(3, 3, 8, 8)] * 4, "params": params}, 0)
    ((selected, every),) = live.ious
    assert torch.equal(selected, every.min(1).values) and live.snapshot is None
