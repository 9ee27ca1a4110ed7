"""The IoU policy (data.iou_policy; paper appendix "Deriving an augmentation policy", official
automl/hvp msatransform.py): accepted pairs against a brute-force search with pixel-mask IoU,
the schedules against the official formulas, fallbacks, determinism on both data paths, and a
tiny training run with the policy on."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from hvp_lightning.config import ConfigError, check_options
from hvp_lightning.data.augment import UNIFORMS, MultiViewTransform, ViewAug, sample_params
from hvp_lightning.data.iou_policy import IoUPolicy, IoUPolicyViews, constrain_keys, policy_pairs
from hvp_lightning.data.resident import ResidentImages
from hvp_lightning.data.seeds import key_uniform, try_key, view_key, view_keys
from hvp_lightning.training.driver import run

H, W = 20, 28  # not square: boxes' x and y must not be swapped
AUG = ViewAug(size=8, scale=(0.1, 1.0))
BOX = ("crop_x", "crop_y", "crop_w", "crop_h")


def mask_iou(p: dict, q: dict) -> float:
    """IoU of two crop boxes counted pixel by pixel on the source image."""
    masks = []
    for r in (p, q):
        m = np.zeros((H, W), bool)
        x, y, w, h = (int(r[k]) for k in BOX)
        m[y : y + h, x : x + w] = True
        masks.append(m)
    return (masks[0] & masks[1]).sum() / (masks[0] | masks[1]).sum()


def brute_force(policy: IoUPolicy, img: torch.Tensor, epoch: int, index: int, slots=(0, 1), seed=0):
    """The official loop: draw both crops, skip coin, reject while IoU > threshold; (try, fallback)."""
    thr = policy.threshold(epoch)
    keys = [view_key(seed, epoch, index, s) for s in slots]
    for t in range(policy.max_tries):
        ka, kb = (try_key(k, t) for k in keys)
        if key_uniform(ka, UNIFORMS) < policy.skip_p:
            return t, False
        if mask_iou(sample_params(img, AUG, ka), sample_params(img, AUG, kb)) <= thr:
            return t, False
    return policy.max_tries - 1, True


def _img(i: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (3, H, W), dtype=torch.uint8, generator=torch.Generator().manual_seed(i))


def test_accepted_pairs_are_the_brute_force_search_and_pass_the_threshold():
    policy = IoUPolicy(start=0.2, end=0.2, epochs=3, max_tries=64)
    views = IoUPolicyViews((AUG,) * 4, policy, seed=0)
    img, retried = _img(), 0
    for i in range(40):
        _, params = views(img, 1, i)
        for a in (0, 2):  # pairs (0, 1) and (2, 3)
            t, fell_back = brute_force(policy, img, 1, i, (a, a + 1))
            want = [sample_params(img, AUG, try_key(view_key(0, 1, i, s), t)) for s in (a, a + 1)]
            for s, w in zip((a, a + 1), want):
                assert all(float(params[k][s]) == float(w[k]) for k in BOX)
            assert params["iou_fallback"][a].item() == float(fell_back)
            if not fell_back:
                assert mask_iou(*({k: params[k][s] for k in BOX} for s in (a, a + 1))) <= 0.2
            retried += t > 0
    assert retried > 10  # the threshold did reject first draws


def test_pairs_with_n_candidates_and_multicrop():
    assert policy_pairs((AUG,) * 2) == ((0, 1),)
    assert policy_pairs((AUG,) * 5) == ((0, 1), (2, 3))  # the odd view out stays free
    local = ViewAug(size=4, scale=(0.05, 0.25))
    dino = (AUG, ViewAug(size=8, scale=(0.1, 1.0), blur_p=0.1), AUG, ViewAug(size=8, scale=(0.1, 1.0), solarize_p=0.2))
    assert policy_pairs(dino + (local,) * 4) == ((0, 1), (2, 3))  # global pairs; locals free


def test_schedules_follow_the_official_code():
    """Official: warm-up epochs at 1, then np.linspace(start, end, n) or cosine_scheduler(start, end, n, 1)."""
    for start, end, warm, epochs in ((0.3, 0.35, 0, 10), (0.3, 0.35, 3, 10), (1.0, 0.1, 2, 7)):
        n = epochs - warm
        lin = np.concatenate([np.ones(warm), np.linspace(start, end, n)])
        it = np.arange(n)
        if start < end:
            cos = start + 0.5 * (end - start) * (1 + np.cos(np.pi * (it / n + 1)))
        else:
            cos = end + 0.5 * (start - end) * (1 + np.cos(np.pi * it / n))
        cos = np.concatenate([np.ones(warm), cos])
        for schedule, want in (("linear", lin), ("cosine", cos)):
            p = IoUPolicy(start=start, end=end, schedule=schedule, warmup_epochs=warm, epochs=epochs)
            np.testing.assert_allclose([p.threshold(e) for e in range(epochs)], want, rtol=0, atol=1e-12)
            assert p.threshold(epochs + 5) == p.threshold(epochs - 1)  # past the schedule: its last value


def test_fallback_after_max_tries_and_skip_and_warmup():
    big = ViewAug(size=8, scale=(0.9, 1.0))  # two such crops always overlap: IoU 0 is out of reach
    img = _img(1)
    views, params = IoUPolicyViews((big,) * 2, IoUPolicy(start=0.0, end=0.0, epochs=1, max_tries=5))(img, 0, 3)
    assert params["iou_fallback"].tolist() == [1.0, 1.0]
    last = sample_params(img, big, try_key(view_key(0, 0, 3, 0), 4))  # the 5th try is kept
    assert all(float(params[k][0]) == float(last[k]) for k in BOX)
    plain = MultiViewTransform((big,) * 2)(img, 0, 3)
    for policy in (  # every first try stands: the plain views exactly
        IoUPolicy(start=0.0, end=0.0, epochs=1, skip_p=1.0),
        IoUPolicy(start=0.0, end=0.0, epochs=2, warmup_epochs=1),
    ):
        got = IoUPolicyViews((big,) * 2, policy)(img, 0, 3)
        assert got[1]["iou_fallback"].tolist() == [0.0, 0.0]
        assert all(torch.equal(a, b) for a, b in zip(got[0], plain[0]))
        assert all(torch.equal(got[1][k], plain[1][k]) for k in plain[1])


def test_worker_and_resident_draw_the_same_views_in_any_batch():
    policy = IoUPolicy(start=0.25, end=0.3, epochs=4, skip_p=0.2, max_tries=16)
    augs = (AUG,) * 4
    imgs = torch.stack([_img(i) for i in range(10)])
    worker = IoUPolicyViews(augs, policy, seed=5)
    resident = ResidentImages(imgs, torch.arange(10), augs, seed=5, iou_policy=policy)
    for epoch in (0, 2):
        for batch in (torch.arange(10), torch.tensor([9, 3, 4])):
            drawn = resident.views(batch, epoch=epoch)
            for pos, i in enumerate(batch.tolist()):
                _, params = worker(imgs[i], epoch, i)
                for name, value in params.items():
                    assert torch.equal(drawn["params"][name][pos].to(value.dtype), value), (epoch, i, name)
    again = constrain_keys(policy, augs, view_keys(5, 2, torch.arange(10), 4), H, W, 2)
    assert torch.equal(again[0], constrain_keys(policy, augs, view_keys(5, 2, torch.arange(10), 4), H, W, 2)[0])
    assert not torch.equal(worker(imgs[0], 0, 0)[1]["crop_x"], worker(imgs[0], 1, 0)[1]["crop_x"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.iou_policy.schedule=step", "data.iou_policy.schedule='step'"),
        ("data.iou_policy.start=1.5", "data.iou_policy.start=1.5"),
        ("data.iou_policy.skip_p=2", "data.iou_policy.skip_p=2"),
        ("data.iou_policy.max_tries=0", "data.iou_policy.max_tries=0"),
        ("data.iou_policy.warmup_epochs=1", "data.iou_policy.warmup_epochs=1"),  # trainer.max_epochs=1
    ],
)
def test_config_errors_name_key_value_and_range(cfg_factory, override, key):
    with pytest.raises(ConfigError, match="^" + re.escape(key) + " is not allowed: "):
        check_options(cfg_factory("+data/iou_policy=on", override))


def test_a_partial_policy_node_is_an_error(cfg_factory):
    with pytest.raises(
        ConfigError, match=r"^data.iou_policy.start=0.3 is not allowed: set only with \+data/iou_policy=on"
    ):
        check_options(cfg_factory("+data.iou_policy.start=0.3"))


@pytest.mark.slow  # a run each
@pytest.mark.parametrize("on_device", [False, True])
def test_tiny_train_run_counts_fallbacks(cfg_factory, tmp_path, on_device):
    """Textures cropped to >= 50% of the image always overlap: threshold 0 makes every pair a
    fallback, counted per epoch and in the summary."""
    cfg = cfg_factory(
        "+data/iou_policy=on",
        "data.iou_policy.start=0.0",
        "data.iou_policy.end=0.0",
        "data.iou_policy.max_tries=3",
        f"data.on_device={str(on_device).lower()}",
    )
    summary = run(cfg, tmp_path)
    batches = cfg.data.train_size // cfg.method.batch_size  # drop_last
    assert summary["iou_policy"]["fallback_pairs"] == cfg.trainer.max_epochs * batches * cfg.method.batch_size
    header, *rows = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()
    col = header.split(",").index("data/iou_fallbacks")
    logged = [float(r.split(",")[col]) for r in rows if r.split(",")[col]]
    assert logged == [batches * cfg.method.batch_size] and math.isfinite(summary["train_loss"])


@pytest.mark.slow  # a run and its resume
def test_resume_continues_the_same_views_and_fallback_count(cfg_factory, tmp_path):
    """A run restarted from its epoch-1 checkpoint ends with the 2-epoch run's weights and counts
    the same fallbacks (the run total travels in the checkpoint)."""
    over = (
        "+data/iou_policy=on",
        "data.iou_policy.start=0.3",
        "data.iou_policy.end=0.6",
        "data.iou_policy.max_tries=2",
        "trainer.max_epochs=2",
        "checkpoint.every_n_epochs=1",
        "+trainer.deterministic=true",
    )
    straight = run(cfg_factory(*over), tmp_path / "straight")
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    (tmp_path / "resumed" / "checkpoints" / "last.ckpt").write_bytes(
        (tmp_path / "straight" / "checkpoints" / "epoch=001.ckpt").read_bytes()
    )
    resumed = run(cfg_factory(*over), tmp_path / "resumed")
    a, b = (
        torch.load(tmp_path / d / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for d in ("straight", "resumed")
    )
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)
    assert 0 < resumed["iou_policy"]["fallback_pairs"] == straight["iou_policy"]["fallback_pairs"]
