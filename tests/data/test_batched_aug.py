"""Batched on-device view colouring vs torchvision (the reference): pixels and parameters."""

from __future__ import annotations

import collections
import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import TypeVar

import pytest
import torch
import torch.nn.functional as tF
from scipy import stats
from torchvision import transforms as T
from torchvision.transforms.v2 import functional as F

from hvp_lightning.data import batched
from hvp_lightning.data.augment import (
    PARAM_NAMES,
    UNIFORMS,
    MultiViewTransform,
    ViewAug,
    augment,
    crop_flip,
    draw_params,
    pil_gaussian_blur,
    reference_colour,
    sample_params,
)
from hvp_lightning.data.batched import (
    JITTER_KEYS,
    colour,
    finish_views,
    gaussian_blur,
    hue,
    pil_blur,
    pil_blur_view,
    pil_box,
    pil_max_radius,
)
from hvp_lightning.data.datamodule import SSLDataModule, finish_batch
from hvp_lightning.data.seeds import key_uniforms, view_key, view_keys

Out = TypeVar("Out")

# Every photometric op is drawn often, and jitter always (its 24 orders all occur).
ALL_OPS = ViewAug(size=24, jitter_p=1.0, gray_p=0.3, blur_p=0.5, solarize_p=0.3)
ALL_OPS_PIL = dataclasses.replace(ALL_OPS, blur_kind="pil")  # PIL's blur (upstream SimSiam, DINO; iBOT)
ALL_OPS_TV9 = dataclasses.replace(ALL_OPS, blur_kind="torchvision9")  # the HVP code's GaussianBlur(9, ...)
BLURS = {"simclr_blur": ALL_OPS, "pil_blur": ALL_OPS_PIL, "torchvision9_blur": ALL_OPS_TV9}


def _photo(h: int = 60, w: int = 52, seed: int = 0) -> torch.Tensor:
    """A smooth colourful uint8 image (noise upsampled): saturated and grey areas, gradients."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1, 3, h // 6, w // 6, generator=g) * 1.2 - 0.1
    return (tF.interpolate(x, size=(h, w), mode="bilinear").clamp(0, 1)[0] * 255).round().to(torch.uint8)


def _draw(img: torch.Tensor, aug: ViewAug, n: int) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[dict]]:
    plist = [sample_params(img, aug, view_key(0, 0, i, 0)) for i in range(n)]
    crops = torch.stack([crop_flip(img, p, aug.size, aug.interpolation) for p in plist])
    return crops, {k: torch.stack([p[k] for p in plist]) for k in plist[0]}, plist


@pytest.mark.parametrize("sync_free", [False, True])
@pytest.mark.parametrize("aug", BLURS.values(), ids=BLURS.keys())
def test_batched_colour_matches_torchvision_pixels(aug: ViewAug, sync_free: bool) -> None:
    """Jitter (any order), grayscale and solarize are bit-exact; PIL's blur is bit-exact too
    (against PIL's ``GaussianBlur`` itself), and so is the 9 px kernel view by view (torchvision's
    own call); SimCLR's separable kernel blur, and the 9 px kernel's batched convolution, may move
    a pixel by one level at a rounding boundary (float sums in another order), never more."""
    torch.manual_seed(0)
    img = _photo()
    crops, params, plist = _draw(img, aug, 160)
    ref = torch.stack([reference_colour(c, p, aug) for c, p in zip(crops, plist)])
    out = colour(crops, params, aug, sync_free=sync_free)
    assert out.dtype == torch.float32 and torch.equal(out, out.round())
    diff = (out - ref.float()).abs()
    blurred = params["blur_sigma"] > 0
    assert torch.equal(out[~blurred], ref[~blurred].float()) and blurred.any()
    if aug.blur_kind == "pil" or (aug.blur_kind == "torchvision9" and not sync_free):
        assert torch.equal(out, ref.float())
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3


def test_pil_blur_is_pils_for_any_sigma_and_size() -> None:
    """The batched PIL blur and the per-view int32 one (the CPU path) against
    ``PIL.ImageFilter.GaussianBlur(radius=sigma)`` of noise (every rounding case) at sigmas over
    and past the views' 0.1-2 range (box radii 0 to 4, odd and even weights), on crops down to
    smaller than the box (edges repeated): every pixel equal; the static tap bound holds."""
    g = torch.Generator().manual_seed(0)
    for h, w, top in ((23, 31, 2.0), (5, 3, 6.0), (96, 96, 2.0), (1, 2, 6.0)):
        sigma = torch.cat([torch.tensor([0.1, top]), 0.1 + (top - 0.1) * torch.rand(14, generator=g)])
        x = torch.randint(0, 256, (16, 3, h, w), generator=g, dtype=torch.uint8)
        want = torch.stack([pil_gaussian_blur(v, s) for v, s in zip(x, sigma.tolist())]).float()
        assert torch.equal(pil_blur(x.float(), sigma, pil_max_radius(top)), want), (h, w)
        assert int(pil_box(sigma)[0].max()) <= pil_max_radius(top)
        boxes = zip(*(b.tolist() for b in pil_box(sigma)))
        per_view = torch.cat([pil_blur_view(v[None].float(), *box) for v, box in zip(x, boxes)])
        assert torch.equal(per_view, want), (h, w)


@pytest.mark.parametrize("sync_free", [False, True])
def test_torchvision9_blur_is_the_hvp_codes_gaussian_blur(sync_free: bool) -> None:
    """``blur_kind="torchvision9"`` against what the HVP code runs (``torchvision.transforms.GaussianBlur(9,
    (0.1, 2.0))`` on PIL images, automl/hvp main:custom_transform.py:28, dino:data/custom_transform.py:30),
    given the same sigma draw (its own ``get_params``), at DINO's local and global-like sizes: bit-exact
    view by view on the CPU; the batched convolution within one level at a rounding boundary
    (bit-exact on the machine it was written on)."""
    torch.manual_seed(0)
    blur = T.GaussianBlur(9, (0.1, 2.0))
    for h, w in ((16, 16), (48, 40)):
        n = 64
        x = (torch.rand(n, 3, h, w) * 256).floor().to(torch.uint8)
        sigma = torch.tensor([blur.get_params(*blur.sigma) for _ in range(n)])
        want = [T.functional.gaussian_blur(T.functional.to_pil_image(v), 9, [s, s]) for v, s in zip(x, sigma.tolist())]
        want = torch.stack([T.functional.pil_to_tensor(v) for v in want]).float()
        params = {k: torch.zeros(n) for k in PARAM_NAMES} | {"jitter_order": torch.full((n, 4), -1)}
        params["blur_sigma"] = sigma
        got = colour(x, params, dataclasses.replace(ALL_OPS_TV9, size=h), sync_free=sync_free)
        diff = (got - want).abs()
        assert diff.max() <= (1 if sync_free else 0) and (diff > 0).float().mean() < 1e-3, (h, w)


def test_hue_matches_torchvision_on_every_kind_of_colour() -> None:
    """The hue computes only the middle channel and places the pixel's own max and min by
    sector: bit-exact against torchvision's HSV round trip on random colours plus the edge
    cases (greys, black, white, pure and two-channel colours, ties between channels), at shifts
    that cross sector borders and wrap (+-0.5). All 2^24 colours: the slow test below."""
    g = torch.Generator().manual_seed(0)
    rand = torch.randint(0, 256, (3, 128, 128), generator=g, dtype=torch.uint8)
    levels = torch.tensor([0, 1, 2, 127, 128, 254, 255], dtype=torch.uint8)
    grid = torch.cartesian_prod(levels, levels, levels).T.reshape(3, 7, 49)  # every tie pattern
    for img in (rand, grid):
        for shift in (-0.5, -0.1, -0.0371, 0.0, 0.0833, 0.1, 0.5):
            want = F.adjust_hue(img, shift).float()
            got = hue(img[None].float(), torch.tensor([shift]))[0]
            assert torch.equal(got, want), shift


@pytest.mark.slow
@pytest.mark.parametrize("shift", [-0.5, -0.0731, 0.1])
def test_hue_matches_torchvision_on_all_colours(shift: float) -> None:
    """Every one of the 2^24 RGB colours, bit-exact (~35 s a shift on 2 cores at load 9)."""
    allc = torch.arange(256**3)
    rgb = torch.stack([allc // 65536, (allc // 256) % 256, allc % 256]).to(torch.uint8)
    for j in range(0, 256**3, 1 << 20):
        img = rgb[:, j : j + (1 << 20)].view(3, 1024, 1024)
        assert torch.equal(hue(img[None].float(), torch.tensor([shift]))[0], F.adjust_hue(img, shift).float()), j


def test_blur_at_a_larger_kernel_stays_within_one_level() -> None:
    """The separable blur, with the negligible outer taps left out (``trim``) as the CPU path
    does, against torchvision's 2-D kernel at 112 px (kernel 11), sigma over its whole range:
    at most one level, at a rounding boundary, on a tiny share of pixels."""
    torch.manual_seed(1)
    img = _photo(112, 112)
    x = torch.stack([img] * 8)
    sigma = torch.linspace(0.1, 2.0, 8)
    want = torch.stack([F.gaussian_blur(img, [11, 11], [s, s]) for s in sigma.tolist()]).float()
    for trim in (False, True):
        got = gaussian_blur(x.float(), sigma, 11, trim=trim)
        diff = (got - want).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3, trim


HOST_READS = ("nonzero", "item", "tolist", "__bool__", "cpu", "numpy")


def record_host_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now until ``monkeypatch.undo()``, every Python-level read of a tensor on the host
    (:data:`HOST_READS`) and every ``torch.tensor`` (host data copied to a device) is recorded by
    name in the list returned, and still runs. On a GPU each would make the host wait for the
    device's queue."""
    seen: list[str] = []

    def recorded(name: str, real: Callable) -> Callable:
        def read(*args, **kwargs):
            seen.append(name)
            return real(*args, **kwargs)

        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, recorded(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch, "tensor", recorded("torch.tensor", torch.tensor))
    return seen


def cuda_syncs(fn: Callable[[], Out]) -> tuple[Out, int]:
    """``fn()`` and the number of times it made the host wait for the GPU: run under
    ``torch.cuda.set_sync_debug_mode("warn")``, which warns at every synchronizing CUDA call."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            out = fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return out, sum("synchronizing CUDA operation" in str(w.message) for w in seen)


def _two_sizes(aug: ViewAug, n: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], tuple[ViewAug, ...]]:
    """A loader batch of ``n`` images with a view of ``aug`` and a smaller one (DINO's globals and locals)."""
    augs = (aug, dataclasses.replace(aug, size=12))
    drawn = [_draw(_photo(seed=s), a, n) for s, a in enumerate(augs)]
    params = {k: torch.stack([p[k] for _, p, _ in drawn], 1) for k in drawn[0][1]}
    return [crops for crops, _, _ in drawn], params, augs


@pytest.mark.parametrize("aug", BLURS.values(), ids=BLURS.keys())
def test_sync_free_path_equals_the_per_view_path_with_one_host_read(monkeypatch, aug: ViewAug) -> None:
    """The accelerator path (each op on the views that drew it, grouped by the op counts) runs
    here on the CPU: same pixels as the per-view CPU path (the blur, untrimmed, within one level),
    and one host read per batch, the op counts (``tolist`` in :func:`.batched.plan_colour`), for a
    batch with views of two sizes too; nothing else reads a tensor on the host or copies host
    data to the device (``nonzero``, ``item``, ``tolist``, ``bool``, ``torch.tensor``), which on
    a GPU would stall the stream."""
    torch.manual_seed(0)
    crops, params, _ = _draw(_photo(), aug, 64)
    views, batch_params, augs = _two_sizes(aug, 32)
    per_view = colour(crops, params, aug, sync_free=False)
    reads = record_host_reads(monkeypatch)
    coloured = colour(crops, params, aug, sync_free=True)
    reads_of_colour = list(reads)
    finished = finish_views(views, batch_params, augs, sync_free=True)
    monkeypatch.undo()
    assert reads_of_colour == ["tolist"] and reads == ["tolist"] * 2
    blurred = params["blur_sigma"] > 0
    assert torch.equal(coloured[~blurred], per_view[~blurred])
    assert (coloured - per_view).abs().max() <= (0 if aug.blur_kind == "pil" else 1)
    want = finish_views(views, batch_params, augs)
    for got, w, a in zip(finished, want, augs):
        torch.testing.assert_close(got, w, rtol=0, atol=1 / 255 / min(a.std) + 1e-5)


def _batch_blur(x: torch.Tensor, sigma: torch.Tensor, aug: ViewAug) -> torch.Tensor:
    if aug.blur_kind == "pil":
        return batched.pil_blur(x, sigma, pil_max_radius(aug.blur_sigma[1]))
    if aug.blur_kind == "torchvision9":
        return batched.torchvision_blur(x, sigma, aug.blur_kernel)
    return batched.gaussian_blur(x, sigma, aug.blur_kernel)


def _masked_colour(x: torch.Tensor, params: dict[str, torch.Tensor], aug: ViewAug) -> torch.Tensor:
    """The sync-free path that ran every op on the whole batch (each jitter op at
    each of the 4 positions of the order), ``torch.where`` keeping its result for the views that
    drew it there."""

    def where(mask: torch.Tensor, y: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return torch.where(mask.view(-1, 1, 1, 1), y, other)

    x = x.to(torch.float32)
    for pos in range(4):
        for op_idx, op in enumerate(batched.JITTER_OPS):
            x = where(params["jitter_order"][:, pos] == op_idx, op(x, params[JITTER_KEYS[op_idx]]), x)
    x = where(params["grayscale"] > 0, batched.grayscale(x), x)
    blurred = params["blur_sigma"] > 0
    x = where(blurred, _batch_blur(x, torch.where(blurred, params["blur_sigma"], 1.0), aug), x)
    return where(params["solarize"] > 0, batched.solarize(x), x)


def count_views_per_op(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """From now until ``monkeypatch.undo()``, the views each colour op of :mod:`.batched` is run on,
    summed per op (``n`` for a pass over a whole batch of ``n``); the blur kinds count as ``blur``."""
    seen: collections.Counter[str] = collections.Counter()

    def counted(name: str, op: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            seen[name] += x.shape[0]
            return op(x, *args, **kwargs)

        return run

    jitter = tuple(counted(k, op) for k, op in zip(JITTER_KEYS, batched.JITTER_OPS))
    monkeypatch.setattr(batched, "JITTER_OPS", jitter)
    for name in ("grayscale", "solarize"):
        monkeypatch.setattr(batched, name, counted(name, getattr(batched, name)))
    for name in ("pil_blur", "torchvision_blur", "gaussian_blur"):
        monkeypatch.setattr(batched, name, counted("blur", getattr(batched, name)))
    return seen


@pytest.mark.parametrize("aug", BLURS.values(), ids=BLURS.keys())
def test_sync_free_path_runs_each_op_once_on_the_views_that_draw_it(monkeypatch, aug: ViewAug) -> None:
    """The full-batch passes of the accelerator colour step per batch, counted: in the path
    that ran every op (:func:`_masked_colour`) each jitter op ran at each of the 4 positions of the order on
    every view (16 full-batch passes of jitter, where a view takes at most 4) and grayscale, blur
    and solarize on every view; now each op runs once on each view that drew it (4 passes over
    the jittered share, the blur over the blurred share). Same views: the recorded parameters
    are left as they were and the pixels equal the old path's bit for bit, so every parameter and
    pixel statistic of the views is the old one."""
    aug = dataclasses.replace(aug, jitter_p=0.8)  # some views without jitter: their own group
    n = 64
    crops, params, _ = _draw(_photo(), aug, n)
    recorded = {k: v.clone() for k, v in params.items()}
    views = count_views_per_op(monkeypatch)
    before = _masked_colour(crops, params, aug)
    views_before = dict(views)
    views.clear()
    after = colour(crops, params, aug, sync_free=True)
    views_after = dict(views)
    monkeypatch.undo()
    drew = {k: int((params[p] > 0).sum()) for k, p in (("grayscale",) * 2, ("blur", "blur_sigma"), ("solarize",) * 2)}
    jittered = int(params["jitter"].sum())
    assert 0 < jittered < n and all(0 < m < n for m in drew.values())
    assert views_before == dict.fromkeys(JITTER_KEYS, 4 * n) | dict.fromkeys(drew, n)
    assert views_after == dict.fromkeys(JITTER_KEYS, jittered) | drew
    assert sum(views_before[k] for k in JITTER_KEYS) / n == 16
    assert sum(views_after[k] for k in JITTER_KEYS) / n == 4 * jittered / n
    assert all(torch.equal(params[k], recorded[k]) for k in recorded)
    assert torch.equal(after, before)


def test_finish_views_equals_the_reference_pipeline_under_one_seed() -> None:
    """Worker part + batched part = torchvision's whole view: same parameters from the same RNG
    stream (so HVP-off training sees the views it always saw), pixels within 1/255 after
    normalisation, views of two sizes (multi-crop) grouped and returned in order, each with its
    blur and resize (SimCLR's kernel and bilinear; PIL's blur and bicubic as DINO's crops)."""
    small = ViewAug(size=12, scale=(0.05, 0.4), jitter_p=1.0, blur_p=1.0, mean=(0.5,) * 3, std=(0.25,) * 3)
    augs = (ALL_OPS, ALL_OPS, dataclasses.replace(small, blur_kind="pil", interpolation="bicubic"))
    imgs = [_photo(seed=s) for s in range(6)]
    ref = [[augment(img, a, view_key(7, 2, b, v)) for v, a in enumerate(augs)] for b, img in enumerate(imgs)]
    items = [MultiViewTransform(augs, seed=7)(img, 2, b) for b, img in enumerate(imgs)]
    views = [torch.stack([it[0][v] for it in items]) for v in range(len(augs))]
    params = {k: torch.stack([it[1][k] for it in items]) for k in items[0][1]}
    assert all(v.dtype == torch.uint8 for v in views)
    out = finish_views(views, params, augs)
    for v, a in enumerate(augs):
        for b in range(len(imgs)):
            want, p = ref[b][v]
            assert all(torch.equal(p[k], params[k][b, v]) for k in p)
            torch.testing.assert_close(out[v][b], want, rtol=0, atol=1 / 255 / min(a.std) + 1e-5)


def _per_view(img: torch.Tensor, aug: ViewAug, n: int) -> dict[str, torch.Tensor]:
    draws = [sample_params(img, aug, view_key(0, 0, i, 0)) for i in range(n)]
    return {k: torch.stack([d[k] for d in draws]) for k in (*PARAM_NAMES, "jitter_order")}


SAMPLERS = {  # torchvision's samplers one view at a time (workers), and the vectorised draw (data.on_device)
    "per_view": _per_view,
    "vectorised": lambda img, aug, n: draw_params(
        key_uniforms(view_keys(1, 0, torch.arange(n), 1)[:, 0], UNIFORMS), img.shape[1], img.shape[2], aug
    ),
}


@pytest.mark.parametrize("shape", [(40, 60), (60, 200)], ids=["fits", "fallbacks"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_parameter_distributions_match_torchvision_samplers(sampler: str, shape: tuple[int, int]) -> None:
    """Each recorded parameter has the distribution of the torchvision transform it stands
    for: crop boxes against ``RandomResizedCrop.get_params`` drawn independently (two-sample
    KS on area, aspect ratio and position), factors uniform on their ranges, sigma uniform,
    jitter orders uniform over the 24 permutations, each coin at its probability."""
    n, aug = 3000, ViewAug(size=24, scale=(0.08, 1.0), solarize_p=0.2)
    img = torch.zeros(3, *shape, dtype=torch.uint8)  # 60 x 200: ~6% of the draws take the centre-crop fallback
    torch.manual_seed(1)
    p = SAMPLERS[sampler](img, aug, n)
    assert set(p) == {*PARAM_NAMES, "jitter_order"} and p["jitter_order"].shape == (n, 4)
    assert (p["crop_x"] + p["crop_w"] <= shape[1]).all() and (p["crop_y"] + p["crop_h"] <= shape[0]).all()
    torch.manual_seed(2)
    boxes = torch.tensor(
        [T.RandomResizedCrop.get_params(img, list(aug.scale), list(aug.ratio)) for _ in range(n)], dtype=torch.float32
    )  # top, left, h, w
    ours = {"area": p["crop_w"] * p["crop_h"], "ratio": p["crop_w"] / p["crop_h"], "x": p["crop_x"], "y": p["crop_y"]}
    theirs = {"area": boxes[:, 3] * boxes[:, 2], "ratio": boxes[:, 3] / boxes[:, 2], "x": boxes[:, 1], "y": boxes[:, 0]}
    for k in ours:
        assert stats.ks_2samp(ours[k].numpy(), theirs[k].numpy()).pvalue > 1e-3, k
    other = SAMPLERS[sampler](img, ViewAug(size=24, scale=(0.12, 1.0)), n)  # the check can tell 0.08 from 0.12
    assert stats.ks_2samp((other["crop_w"] * other["crop_h"]).numpy(), theirs["area"].numpy()).pvalue < 1e-3

    def coin(name: str, prob: float, mask: torch.Tensor | None = None) -> None:
        v = p[name] if mask is None else p[name][mask]
        sd = math.sqrt(prob * (1 - prob) / len(v))
        assert abs(v.float().mean().item() - prob) < 5 * sd + 1e-9, name

    coin("flip", aug.flip_p)
    coin("jitter", aug.jitter_p)
    coin("grayscale", aug.gray_p)
    coin("solarize", aug.solarize_p)
    blurred = p["blur_sigma"] > 0
    assert abs(blurred.float().mean().item() - aug.blur_p) < 5 * math.sqrt(0.25 / n)
    lo, hi = aug.blur_sigma
    assert stats.kstest(p["blur_sigma"][blurred].numpy(), "uniform", args=(lo, hi - lo)).pvalue > 1e-3
    jit = p["jitter"].bool()
    for name, half in (("brightness", aug.brightness), ("contrast", aug.contrast), ("saturation", aug.saturation)):
        assert stats.kstest(p[name][jit].numpy(), "uniform", args=(1 - half, 2 * half)).pvalue > 1e-3, name
    assert stats.kstest(p["hue"][jit].numpy(), "uniform", args=(-aug.hue, 2 * aug.hue)).pvalue > 1e-3
    codes = (p["jitter_order"][jit] * torch.tensor([64, 16, 4, 1])).sum(1)
    counts = torch.unique(codes, return_counts=True)[1]
    assert len(counts) == 24 and stats.chisquare(counts.numpy()).pvalue > 1e-3


def test_datamodule_colours_views_after_transfer_or_in_the_workers(cfg_factory) -> None:
    """For an accelerator the loader yields uint8 crops and the transfer hook turns them into
    the normalised views the methods train on; for CPU training the workers run the same step
    per image before collating (same views for the same RNG stream). Evaluation batches pass
    through."""
    cfg = cfg_factory("+hvp=on", "hvp.num_views=3")
    augs = (ViewAug(size=16, blur_p=0.5),) * 3
    dm = SSLDataModule(cfg.data, augs, batch_size=8, num_workers=0, colour_in_workers=False)
    dm.setup("fit")
    torch.manual_seed(3)
    batch = next(iter(dm.train_dataloader()))
    assert len(batch["views"]) == 3 and batch["views"][0].dtype == torch.uint8
    assert batch["params"]["crop_x"].shape == (8, 3)
    done = dm.on_after_batch_transfer(batch, 0)
    assert [v.shape for v in done["views"]] == [(8, 3, 16, 16)] * 3 and done["views"][0].dtype == torch.float32
    assert done["params"] is batch["params"]
    want = finish_views(batch["views"], batch["params"], augs)
    assert all(torch.equal(a, b) for a, b in zip(done["views"], want))
    evaluation = next(iter(dm.val_dataloader()[0]))
    assert finish_batch(evaluation, augs) is evaluation

    cpu = SSLDataModule(cfg.data, augs, batch_size=8, num_workers=0)  # no trainer: CPU
    cpu.setup("fit")
    torch.manual_seed(3)
    in_workers = next(iter(cpu.train_dataloader()))
    assert all(torch.equal(a, b) for a, b in zip(in_workers["views"], want))
    assert cpu.on_after_batch_transfer(in_workers, 0)["views"] is in_workers["views"]


@pytest.mark.slow  # two loader worker processes started per blur kind
@pytest.mark.parametrize("aug", BLURS.values(), ids=BLURS.keys())
def test_worker_made_batches_equal_the_colour_step_after_transfer(cfg_factory, aug: ViewAug) -> None:
    """CPU training: two loader workers write every image's coloured views straight into the
    batch's shared-memory tensors (no collate copy). The batch must be the one the accelerator
    path makes from the uint8 crops -- the same pixels, parameters, labels and indices -- for
    every blur kind and with views of two sizes (DINO's globals and locals)."""
    cfg = cfg_factory("+hvp=on", "hvp.num_views=3")
    augs = (aug, dataclasses.replace(aug, size=12), aug)
    crops = SSLDataModule(cfg.data, augs, batch_size=8, num_workers=0, colour_in_workers=False)
    in_workers = SSLDataModule(cfg.data, augs, batch_size=8, num_workers=2, wait_s=120)
    crops.setup("fit")
    in_workers.setup("fit")
    uint8 = list(crops.train_dataloader())[:2]
    made = list(in_workers.train_dataloader())[:2]
    for raw, got in zip(uint8, made):
        want = finish_batch(raw, augs)
        assert [v.shape for v in got["views"]] == [(8, 3, 24, 24), (8, 3, 12, 12), (8, 3, 24, 24)]
        assert all(v.is_shared() and v.dtype == torch.float32 for v in got["views"])
        assert all(torch.equal(a, b) for a, b in zip(got["views"], want["views"]))
        assert got.keys() == want.keys() and isinstance(got, dict) and type(got) is dict
        assert all(torch.equal(got["params"][k], want["params"][k]) for k in want["params"])
        assert torch.equal(got["label"], want["label"]) and torch.equal(got["index"], want["index"])
        assert got["bad_file"] == want["bad_file"]
    one = in_workers.train_dataloader().dataset[(0, 3)]  # an item alone (no batch): the same views
    raw = crops.train_set[(0, 3)]
    want_one = finish_views([v[None] for v in raw["views"]], {k: v[None] for k, v in raw["params"].items()}, augs)
    assert all(torch.equal(a, b[0]) for a, b in zip(one["views"], want_one))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("aug", BLURS.values(), ids=BLURS.keys())
def test_finish_views_on_cuda_equals_cpu(aug: ViewAug) -> None:
    """Same views on the GPU (sync-free path) as on the CPU (PIL's blur: the same integers,
    whatever the device's float division), for views of two sizes; the host waits for the GPU
    once per batch (the op counts, :func:`.batched.plan_colour`): the one sync counted under
    sync-debug mode "warn", where "error" would refuse it."""
    torch.manual_seed(0)
    views, params, augs = _two_sizes(aug, 32)
    cpu = finish_views(views, params, augs)
    gviews, gparams = [v.cuda() for v in views], {k: v.cuda() for k, v in params.items()}
    gpu, syncs = cuda_syncs(lambda: finish_views(gviews, gparams, augs))
    assert syncs == 1
    for got, want, a in zip(gpu, cpu, augs):
        assert got.device.type == "cuda"
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1 / 255 / min(a.std) + 1e-5)


def test_normalize_is_torchvisions_up_to_float_rounding() -> None:
    """One normalisation for training views, the reference and evaluation: torchvision's
    ``normalize(x / 255)`` for an image or a batch, uint8 in (a new float tensor) or float in
    (in place), within float32 rounding."""
    from hvp_lightning.data.augment import normalize

    img = _photo()
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    want = F.normalize(img.float().div(255), list(mean), list(std))
    got = normalize(img, mean, std)
    assert got.dtype == torch.float32 and img.dtype == torch.uint8
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    batch = img[None].repeat(2, 1, 1, 1).float()
    out = normalize(batch, mean, std)
    assert out.data_ptr() == batch.data_ptr()
    torch.testing.assert_close(out, want.expand(2, -1, -1, -1), rtol=0, atol=1e-5)
