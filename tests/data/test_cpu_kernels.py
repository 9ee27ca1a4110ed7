"""The CPU colour path's C kernels (hvp_lightning/data/cpu_kernels.py) against the eager torch code
they replace and the references that code matches (torchvision's hue, PIL's blur, conv2d): bit for
bit; built from an empty cache; without a compiler the eager path gives the same views."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import platform
import shutil
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from hvp_lightning.data import batched, cpu_kernels
from hvp_lightning.data.augment import ViewAug, crop_flip, normalize, pil_gaussian_blur, sample_params
from hvp_lightning.data.batched import colour, hue, pil_blur_view, pil_box, torchvision_blur
from hvp_lightning.data.seeds import view_key

needs_cc = pytest.mark.skipif(shutil.which(cpu_kernels.COMPILER) is None, reason="no C compiler (cc)")
ALL_OPS = ViewAug(size=24, jitter_p=1.0, gray_p=0.3, blur_p=0.5, solarize_p=0.3)
BLURS = {kind: dataclasses.replace(ALL_OPS, blur_kind=kind) for kind in ("pil", "torchvision9", "simclr")}


@pytest.fixture(scope="module")
def native(tmp_path_factory) -> Iterator[cpu_kernels.Kernels]:
    """The kernels built once for this module into an empty cache directory (then the process's
    own lookup again)."""
    if shutil.which(cpu_kernels.COMPILER) is None:
        pytest.skip("no C compiler (cc)")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        cpu_kernels.kernels.cache_clear()
        k = cpu_kernels.kernels()
        assert k is not None and cpu_kernels.library_path().is_file()
        yield k
    cpu_kernels.kernels.cache_clear()


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


@pytest.mark.slow  # the C kernels compiled into an empty cache
def test_built_once_into_an_empty_cache_then_only_loaded(native, monkeypatch) -> None:
    """The first process built the library into the empty cache (the fixture: one file, no
    temporary left); the next loads it without compiling (here: any compiling would fail)."""
    assert [p.name for p in cpu_kernels.cache_dir().iterdir()] == [cpu_kernels.library_path().name]

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiling)
    cpu_kernels.kernels.cache_clear()
    assert cpu_kernels.kernels() is not None
    cpu_kernels.kernels.cache_clear()


def test_hue_is_the_eager_hue_bit_for_bit(native) -> None:
    """Every tie pattern of the levels 0, 1, 2, 127, 128, 254, 255 (greys, black, white, pure and
    two-channel colours), a hue wheel through every sector, and noise, at shifts 0, +-0.5, tiny
    ones and 60 more across the range: the same float32 bits as :func:`.batched.hue`."""
    g = torch.Generator().manual_seed(0)
    levels = torch.tensor([0, 1, 2, 127, 128, 254, 255])
    grid = torch.cartesian_prod(levels, levels, levels).T.reshape(1, 3, 7, 49)
    wheel = torch.linspace(0, 1, 768)[:, None] * 6 - torch.tensor([0.0, 2.0, 4.0])  # r, g, b peaks 2 sectors apart
    wheel = ((wheel - 6 * (wheel > 3)).abs() - 1).clamp(0, 1).mul(255).round().T.reshape(1, 3, 16, 48)
    noise = torch.randint(0, 256, (1, 3, 96, 80), generator=g)
    tiny = [0.0, -0.0, 0.5, -0.5, 1e-7, -1e-7, 1e-30, -1e-30, 2.0**-24, 0.5 - 2.0**-25, -0.5 + 2.0**-25]
    shifts = tiny + torch.linspace(-0.5, 0.5, 41).tolist() + (torch.rand(19, generator=g) - 0.5).tolist()
    for img in (grid, wheel, noise):
        x = img.float().contiguous()  # hue_ works in one contiguous image
        for shift in shifts:
            s = torch.tensor([shift])
            assert torch.equal(_bits(native.hue_(x.clone(), s)), _bits(hue(x, s))), (img.shape, shift)


def test_pil_blur_is_pils_and_the_eager_ones(native) -> None:
    """PIL's ``GaussianBlur(radius=sigma)`` itself and :func:`.batched.pil_blur_view`: the presets'
    sigmas 0.1-2 (box radii 0 and 1) and past them (radii up to 9), crops down to 1x2 px and boxes
    wider than the image (edges repeated): every pixel equal."""
    g = torch.Generator().manual_seed(0)
    for h, w, top in ((224, 224, 2.0), (23, 31, 2.0), (5, 3, 6.0), (1, 2, 6.0), (40, 7, 12.0)):
        sigma = torch.cat([torch.tensor([0.1, 1.0, top]), 0.1 + (top - 0.1) * torch.rand(5, generator=g)])
        x = torch.randint(0, 256, (len(sigma), 3, h, w), generator=g, dtype=torch.uint8)
        for v, s, box in zip(x, sigma.tolist(), zip(*(b.tolist() for b in pil_box(sigma)))):
            got = native.pil_blur(v[None].float(), *box)
            assert torch.equal(got[0], pil_gaussian_blur(v, s).float()), (h, w, s)
            assert torch.equal(got, pil_blur_view(v[None].float(), *box)), (h, w, s)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="oneDNN's x86 sum order")
def test_conv_sums_as_torchs_conv2d_on_x86(native) -> None:
    """On x86 torch's ``conv2d`` (oneDNN's depthwise kernel with FMA) sums the 9 px blur's taps as
    the C kernel does: the unrounded sums equal at DINO's local and global sizes and odd ones, every
    sigma of the range, so the probe lets the C kernel run and the views are torchvision's."""
    g = torch.Generator().manual_seed(0)
    for h, w in ((224, 224), (96, 96), (48, 40), (16, 16), (5, 7)):
        assert batched.native_conv_is_torchs(native, h, w, 9), (h, w)
        x = torch.randint(0, 256, (1, 3, h, w), generator=g).float()
        for s in (0.1, 0.77, 2.0):
            sigma = torch.tensor([s])
            got = native.conv_reflect(x, batched.torchvision_weights(sigma, 9)[0]).round_()
            assert torch.equal(got, torchvision_blur(x, sigma, 9)), (h, w, s)


def test_conv_that_sums_otherwise_is_not_used(native, monkeypatch) -> None:
    """Where the C sums differ from ``conv2d``'s (another CPU or torch build; here one level added
    to each), the probe says so and the 9 px blur runs torch's convolution: the eager path's views."""

    class OtherSums(cpu_kernels.Kernels):
        def conv_reflect(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            return super().conv_reflect(x, weight) + 1

    other = OtherSums(ctypes.CDLL(str(cpu_kernels.library_path())))
    assert not batched.native_conv_is_torchs(other, 24, 24, 9)
    aug = BLURS["torchvision9"]
    crops, params = _views(aug, 32)
    monkeypatch.setattr(cpu_kernels, "kernels", lambda: None)
    eager = colour(crops, params, aug, sync_free=False)
    monkeypatch.setattr(cpu_kernels, "kernels", lambda: other)
    assert torch.equal(colour(crops, params, aug, sync_free=False), eager) and (params["blur_sigma"] > 0).any()


JITTER = {"brightness": batched.brightness, "contrast": batched.contrast, "saturation": batched.saturation}


@pytest.fixture
def fused(native) -> cpu_kernels.Kernels:
    """The kernels where the probe lets them replace torch's jitter ops (x86 with FMA); elsewhere
    the torch ops run and there is nothing to compare."""
    if not batched.native_colour_is_torchs(native):
        pytest.skip("torch's blends are not fused multiply-adds on this CPU: the torch ops run")
    return native


def test_jitter_grayscale_solarize_and_normalisation_are_the_eager_ops(fused) -> None:
    """The in-place C ops against the torch ops they replace, at DINO's global and local sizes,
    odd ones (torch's scalar tails) and one pixel, factors across and past the presets' ranges:
    every float32 bit equal."""
    g = torch.Generator().manual_seed(0)
    factors = torch.cat([torch.tensor([0.0, 1.0, 2.0, 1e-7, 0.6 - 2.0**-24]), torch.rand(24, generator=g) * 2])
    for h, w in ((224, 224), (96, 96), (37, 41), (3, 5), (1, 1)):
        x = torch.randint(0, 256, (1, 3, h, w), generator=g).float()
        for f in factors.view(-1, 1):
            for name, op in JITTER.items():
                got = getattr(fused, f"{name}_")(x.clone(), f)
                assert torch.equal(_bits(got), _bits(op(x, f))), (name, h, w, float(f))
        assert torch.equal(fused.grayscale_(x.clone()), batched.grayscale(x))
        assert torch.equal(fused.solarize_(x.clone()), batched.solarize(x))
        for mean, std in (
            ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
            ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
        ):
            out = torch.empty_like(x)
            fused.normalize(x, mean, std, out)
            assert torch.equal(_bits(out), _bits(normalize(x.clone(), mean, std))), (h, w, mean)


def _every_colour(chunks: int = 16) -> Iterator[torch.Tensor]:
    """All 2^24 colours as ``chunks`` images [1, 3, 1024, 1024 * 16 / chunks]."""
    for part in torch.arange(2**24, dtype=torch.int32).chunk(chunks):
        yield torch.stack([part >> 16, (part >> 8) & 255, part & 255]).float().view(1, 3, 1024, -1)


def test_luma_ops_on_every_colour(fused) -> None:
    """Saturation and grayscale floor the luma, two fused multiply-adds: all 2^24 colours at two
    factors give torch's bits. The contrast's mean is exact only below 2^24 / 255 pixels: past
    that the C contrast refuses and the CPU path keeps torch's."""
    for x in _every_colour():
        assert torch.equal(fused.grayscale_(x.clone()), batched.grayscale(x))
        for f in (0.35, 1.6180339):
            fac = torch.tensor([f])
            assert torch.equal(fused.saturation_(x.clone(), fac), batched.saturation(x, fac)), f
    big = torch.zeros(1, 3, 257, 257)
    with pytest.raises(ValueError, match="at most 65793 pixels"):
        fused.contrast_(big, torch.tensor([1.2]))
    assert batched.native_jitter_ops(fused, 257 * 257)[1] is batched.contrast
    assert batched.native_jitter_ops(fused, 256 * 256)[1] == fused.contrast_


def test_the_luma_telltales_are_every_colour_whose_luma_depends_on_fusing() -> None:
    """:data:`.batched.LUMA_TELLTALES` (in the probe image) are exactly the colours whose floored
    luma changes when either multiply-add of it rounds its product first (float64 stands in for
    the fused operation: a float32 product is exact there)."""
    w = (np.float32(0.2989), np.float32(0.587), np.float32(0.114))

    def fma(a, k, c):
        return (a.astype(np.float64) * np.float64(k) + c).astype(np.float32)

    def mad(a, k, c):
        return a * k + c

    found = []
    for x in _every_colour():
        r, g, b = (c.numpy().ravel() for c in x[0])
        first = {"fused": fma(g, w[1], r * w[0]), "rounded": mad(g, w[1], r * w[0])}
        floors = {
            (i, j): np.floor(step(b, w[2], s))
            for i, s in first.items()
            for j, step in (("fused", fma), ("rounded", mad))
        }
        both = floors["fused", "fused"]
        moved = np.zeros(both.shape, dtype=bool)
        for v in floors.values():
            moved |= v != both
        found += [(int(r[i]), int(g[i]), int(b[i])) for i in np.flatnonzero(moved)]
    assert tuple(found) == batched.LUMA_TELLTALES


def test_the_probe_tells_a_luma_with_one_product_rounded(native, monkeypatch) -> None:
    """A torch whose luma fuses only its second multiply-add (one of the builds the C code does not
    follow) is told from this one by the telltale colours alone, and the torch ops then run."""

    def luma_first_rounded(x: torch.Tensor) -> torch.Tensor:
        r, g, b = x.unbind(1)
        return r.mul(0.2989).add_(g.mul(0.587)).add_(b, alpha=0.114).unsqueeze(1)

    monkeypatch.setattr(batched, "_luma", luma_first_rounded)
    batched.native_colour_is_torchs.cache_clear()
    try:
        assert not batched.native_colour_is_torchs(native)
    finally:
        batched.native_colour_is_torchs.cache_clear()


def test_the_probe_would_tell_a_mean_by_reciprocal() -> None:
    """The probe's planes have sums whose float32 quotient by the count differs from their product
    with its reciprocal at both probed sizes, so a torch whose ``mean`` multiplied would fail it."""
    for npix in (37 * 41, 224 * 224):
        assert batched._mean_divides(npix)
        sums = torch.linspace(0, 255 * npix, 64, dtype=torch.float64).round().to(torch.float32)
        n = torch.tensor(float(npix))
        assert (sums / n != sums * (1 / n)).sum() >= 5, npix


def test_pil_box_on_the_host_is_the_tensor_one(native) -> None:
    """PIL's box for one sigma in C (per view, no tensor ops) equals :func:`.batched.pil_box` for
    20,000 sigmas over the presets' range and past it."""
    g = torch.Generator().manual_seed(0)
    presets = 0.1 + 1.9 * torch.rand(16000, generator=g)
    sigma = torch.cat([torch.tensor([0.1, 2.0, 1e-3, 9.5]), presets, 10 * torch.rand(3996, generator=g) + 1e-3])
    want = list(zip(*(b.tolist() for b in pil_box(sigma))))
    assert [native.pil_box(s) for s in sigma.tolist()] == want


def test_a_torch_that_rounds_its_blend_twice_keeps_the_torch_ops(fused, monkeypatch) -> None:
    """Where torch's blend is not one fused multiply-add (another CPU or torch build; here its
    product rounded first), the probe says so and the per-view path runs the torch ops: the views
    of the eager code, not the C kernels'."""

    def blend_rounded_twice(x: torch.Tensor, other: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        f = f.view(-1, 1, 1, 1)
        return (x * f + other * (1 - f)).clamp_(0, 255).floor_()

    aug = BLURS["pil"]
    crops, params = _views(aug, 48)
    with_c = colour(crops, params, aug, sync_free=False)
    monkeypatch.setattr(batched, "_blend", blend_rounded_twice)
    batched.native_colour_is_torchs.cache_clear()
    try:
        assert not batched.native_colour_is_torchs(fused)
        got = colour(crops, params, aug, sync_free=False)
        monkeypatch.setattr(cpu_kernels, "kernels", lambda: None)
        eager = colour(crops, params, aug, sync_free=False)
    finally:
        batched.native_colour_is_torchs.cache_clear()
    assert torch.equal(got, eager) and not torch.equal(got, with_c)


def _views(aug: ViewAug, n: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    img = torch.nn.functional.interpolate(torch.rand(1, 3, 8, 9, generator=g), size=(60, 52), mode="bilinear")
    img = (img[0].clamp(0, 1) * 255).round().to(torch.uint8)
    plist = [sample_params(img, aug, view_key(0, 0, i, 0)) for i in range(n)]
    crops = torch.stack([crop_flip(img, p, aug.size, aug.interpolation) for p in plist])
    return crops, {k: torch.stack([p[k] for p in plist]) for k in plist[0]}


@pytest.mark.parametrize("aug", BLURS.values(), ids=BLURS.keys())
def test_without_a_compiler_the_views_are_the_same(native, aug: ViewAug, monkeypatch, tmp_path, caplog) -> None:
    """No compiler (its name changed) and an empty cache: one log line says why, and the per-view
    colour step runs its torch code, giving the views it gives with the C kernels."""
    crops, params = _views(aug, 48)
    with_c = colour(crops, params, aug, sync_free=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "COMPILER", "no-such-cc")
    cpu_kernels.kernels.cache_clear()
    with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
        eager = colour(crops, params, aug, sync_free=False)
        colour(crops, params, aug, sync_free=False)
    cpu_kernels.kernels.cache_clear()
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
    assert "'no-such-cc'" in caplog.records[0].getMessage() and "same views" in caplog.records[0].getMessage()
    assert torch.equal(eager, with_c) and (params["blur_sigma"] > 0).any() and (params["hue"] != 0).any()


def test_a_loader_worker_does_not_build(monkeypatch, tmp_path, caplog) -> None:
    """In a loader worker a missing library means the main process could not build it (and said
    why): the worker neither compiles nor logs again, and runs the torch code."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu_kernels, "get_worker_info", lambda: object())
    monkeypatch.setattr(cpu_kernels, "build", lambda path: pytest.fail("built in a worker"))
    cpu_kernels.kernels.cache_clear()
    with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
        assert cpu_kernels.kernels() is None
    cpu_kernels.kernels.cache_clear()
    assert not caplog.records


def test_a_compiler_that_hangs_is_given_up(monkeypatch, tmp_path, caplog) -> None:
    """Nothing waits forever: a compiler that does not finish within ``BUILD_TIMEOUT_S`` is given
    up, named in the one log line, and the torch code runs."""
    fake = tmp_path / "bin" / "slow-cc"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_kernels, "COMPILER", "slow-cc")
    monkeypatch.setattr(cpu_kernels, "BUILD_TIMEOUT_S", 0.5)
    cpu_kernels.kernels.cache_clear()
    with caplog.at_level(logging.WARNING, logger=cpu_kernels.__name__):
        assert cpu_kernels.kernels() is None
    cpu_kernels.kernels.cache_clear()
    assert len(caplog.records) == 1 and "did not finish within 0.5 s" in caplog.records[0].getMessage()
    assert not cpu_kernels.library_path().exists()
