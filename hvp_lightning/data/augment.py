"""View augmentation that also returns the parameters it sampled.

HVP's analysis (paper section 6) needs, for every candidate view, the crop box in
source-image pixels, the flip, the colour-jitter factors and their order, grayscale, blur
sigma and solarize. torchvision's composed transforms hide those, so this module samples
them explicitly: :func:`sample_params` with the algorithms of torchvision's samplers, one view
at a time in Python (loader workers), and :func:`draw_params`, the same values for a whole
batch of views in a few vectorised operations on its device (images held there,
:mod:`.resident`; the tests compare both with torchvision's distributions and with each other).
Both read a view's random numbers from its counter-based key (seed, epoch, image index, view
slot; :mod:`.seeds`), never from a generator's state.

Training splits a view in two: loader workers crop and flip uint8 images
(:class:`MultiViewTransform`), and the colour ops run batched on the batch's device
(:mod:`.batched`). :func:`augment` is the whole view with torchvision's per-image kernels:
the reference the batched ops are tested against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torchvision.transforms.functional import gaussian_blur as classic_gaussian_blur
from torchvision.transforms.v2 import RandomResizedCrop
from torchvision.transforms.v2 import functional as F

from ..schema import INTERPOLATIONS
from .datasets import to_rgb8
from .seeds import key_uniform, key_uniforms, view_key

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_TRIES = 10  # RandomResizedCrop's attempts before its centre-crop fallback
HVP_BLUR_KERNEL = 9  # the HVP code's torchvision GaussianBlur(9, (0.1, 2.0)) (blur_kind "torchvision9")

# Scalar parameters recorded per view (plus ``jitter_order``: the 4 jitter ops' order).
PARAM_NAMES = (
    "crop_x",
    "crop_y",
    "crop_w",
    "crop_h",
    "src_w",
    "src_h",
    "flip",
    "jitter",
    "brightness",
    "contrast",
    "saturation",
    "hue",
    "grayscale",
    "blur_sigma",
    "solarize",
)


@dataclass(frozen=True)
class ViewAug:
    """One view's augmentation distribution (defaults: the SimSiam/BYOL ImageNet distributions,
    with the blur and resize this library had before ``blur_kind``/``interpolation`` existed;
    the ``data.aug`` presets set both as each method's official code: conf/data/aug/)."""

    size: int = 224
    scale: tuple[float, float] = (0.2, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    gray_p: float = 0.2
    blur_p: float = 0.5
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    solarize_p: float = 0.0
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    # "pil": PIL's ImageFilter.GaussianBlur(radius=sigma), untruncated (upstream SimSiam, DINO; iBOT);
    # "simclr": a Gaussian kernel of 10% of the crop (SimCLR's, with torchvision's reflect padding);
    # "torchvision9": torchvision.transforms.GaussianBlur(9, sigma) at every crop size (HVP code)
    blur_kind: str = "simclr"
    interpolation: str = "bilinear"  # the crop's antialiased resize: bilinear (SimSiam) | bicubic (DINO, iBOT, SimCLR)

    @property
    def blur_kernel(self) -> int:
        """The kernel of the Gaussian blur kinds: 9 px for ``"torchvision9"`` (the HVP code's
        ``GaussianBlur(9, (0.1, 2.0))``, whatever the crop), else SimCLR's odd kernel of ~10% of
        the crop (23 px at 224)."""
        if self.blur_kind == "torchvision9":
            return HVP_BLUR_KERNEL
        k = max(3, int(0.1 * self.size))
        return k if k % 2 == 1 else k + 1


def to_uint8_tensor(img) -> torch.Tensor:
    """PIL image (any mode) or tensor -> uint8 ``[3, H, W]`` RGB."""
    if isinstance(img, torch.Tensor):
        if img.dtype != torch.uint8:
            raise TypeError(f"expected a uint8 image tensor, got {img.dtype}")
        return img if img.shape[0] == 3 else img[:1].expand(3, -1, -1)
    return F.pil_to_tensor(to_rgb8(img))  # one mode conversion for every path (datasets.to_rgb8)


# Where each draw of a view sits among its uniforms (:func:`.seeds.key_uniform`): one counter
# per draw, so a view reads only the ones it uses, and both samplers below read the same ones.
U_AREA, U_ASPECT = 0, CROP_TRIES  # the crop's tries: CROP_TRIES areas, then CROP_TRIES log aspects
U_TOP, U_LEFT = 2 * CROP_TRIES, 2 * CROP_TRIES + 1
U_FLIP, U_JITTER, U_ORDER, U_FACTORS = 2 * CROP_TRIES + 2, 2 * CROP_TRIES + 3, 2 * CROP_TRIES + 4, 2 * CROP_TRIES + 8
U_GRAY, U_BLUR, U_SIGMA, U_SOLARIZE = 2 * CROP_TRIES + 12, 2 * CROP_TRIES + 13, 2 * CROP_TRIES + 14, 2 * CROP_TRIES + 15
UNIFORMS = 2 * CROP_TRIES + 16  # per view


def sample_params(img: torch.Tensor, aug: ViewAug, key: int) -> dict[str, torch.Tensor]:
    """Every parameter of one view, with the algorithms of torchvision's samplers
    (``RandomResizedCrop.get_params``: up to 10 tries, the first that fits, else the centre
    crop; ``ColorJitter.get_params``: a uniformly random order of the 4 ops and a uniform
    factor each; the coins), in Python scalars from the view's counter-based uniforms
    (:func:`.seeds.key_uniform` of ``key``, :func:`.seeds.view_key`): no generator state, so the
    view is the same in any worker, process or order. Loader workers call this per view;
    :func:`draw_params` computes the same values from the same uniforms for whole batches on a
    device (tests check both against each other and torchvision's distributions)."""

    def u(j: int) -> float:
        return key_uniform(key, j)

    _, h_src, w_src = img.shape
    left, top, w, h = crop_box(h_src, w_src, aug, key)
    flip = u(U_FLIP) < aug.flip_p
    jitter = u(U_JITTER) < aug.jitter_p
    factors = (1.0, 1.0, 1.0, 0.0)
    order = [-1] * 4
    if jitter:
        order = sorted(range(4), key=lambda k: u(U_ORDER + k))  # a uniformly random permutation, as randperm
        ranges = [(max(0.0, 1 - r), 1 + r) for r in (aug.brightness, aug.contrast, aug.saturation)]
        ranges.append((-aug.hue, aug.hue))
        factors = tuple(a + (b - a) * u(U_FACTORS + k) for k, (a, b) in enumerate(ranges))  # type: ignore[assignment]
    gray = u(U_GRAY) < aug.gray_p
    sigma = 0.0
    if u(U_BLUR) < aug.blur_p:
        sigma = aug.blur_sigma[0] + (aug.blur_sigma[1] - aug.blur_sigma[0]) * u(U_SIGMA)
    solarize = u(U_SOLARIZE) < aug.solarize_p
    values = (left, top, w, h, w_src, h_src, flip, jitter, *factors, gray, sigma, solarize)
    params = dict(zip(PARAM_NAMES, torch.tensor([float(v) for v in values]).unbind()))  # one tensor, not 15
    params["jitter_order"] = torch.tensor(order)
    return params


def crop_box(h_src: int, w_src: int, aug: ViewAug, key: int) -> tuple[int, int, int, int]:
    """``(left, top, w, h)`` of the view with ``key``: ``RandomResizedCrop.get_params`` (up to
    10 tries, the first that fits, else the centre crop), reading only the uniforms it uses
    (what :func:`sample_params` draws; the IoU policy's retries draw crops alone)."""
    area = float(h_src * w_src)
    lo, hi = aug.scale
    log_lo, log_hi = math.log(aug.ratio[0]), math.log(aug.ratio[1])
    for t in range(CROP_TRIES):
        target = area * (lo + (hi - lo) * key_uniform(key, U_AREA + t))
        aspect = math.exp(log_lo + (log_hi - log_lo) * key_uniform(key, U_ASPECT + t))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= w_src and 0 < h <= h_src:
            top = math.floor(key_uniform(key, U_TOP) * (h_src - h + 1))
            return math.floor(key_uniform(key, U_LEFT) * (w_src - w + 1)), top, w, h
    w, h = centre_crop_size(h_src, w_src, aug.ratio)
    return (w_src - w) // 2, (h_src - h) // 2, w, h


def draw_params(uniforms: torch.Tensor, src_h: int, src_w: int, aug: ViewAug) -> dict[str, torch.Tensor]:
    """Every parameter of ``n`` views of one ``src_h`` x ``src_w`` image size at once, from
    their uniforms (float64 ``[n, UNIFORMS]``, :func:`.seeds.key_uniforms`, on the device where
    the views will be cut): the values :func:`sample_params` computes from the same uniforms,
    with a few vectorised operations instead of Python per view. Returns ``[n]`` per scalar and
    ``jitter_order`` ``[n, 4]`` (-1 where jitter is off).

    The crop is ``RandomResizedCrop.get_params``: up to 10 tries of area ~ U(scale) x image and
    log aspect ~ U(log ratio), rounded, the first that fits; else the centre crop with the ratio
    clamped to its range. Jitter draws a uniform random order (the argsort of 4 uniforms, as
    ``randperm``) and each factor uniformly in its range."""
    n, device = uniforms.shape[0], uniforms.device

    def u(j: int, k: int = 0) -> torch.Tensor:
        return uniforms[:, j : j + k] if k else uniforms[:, j]

    area = float(src_h * src_w)
    lo, hi = aug.scale
    log_lo, log_hi = math.log(aug.ratio[0]), math.log(aug.ratio[1])
    target = area * (lo + (hi - lo) * u(U_AREA, CROP_TRIES))
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u(U_ASPECT, CROP_TRIES))
    tries_w, tries_h = (target * aspect).sqrt().round(), (target / aspect).sqrt().round()
    fits = (tries_w > 0) & (tries_w <= src_w) & (tries_h > 0) & (tries_h <= src_h)
    first = fits.to(torch.uint8).argmax(1, keepdim=True)  # the first try that fits (0 if none)
    cw, ch = tries_w.gather(1, first)[:, 0], tries_h.gather(1, first)[:, 0]
    fb_w, fb_h = centre_crop_size(src_h, src_w, aug.ratio)
    any_fit = fits.any(1)
    cw, ch = torch.where(any_fit, cw, float(fb_w)), torch.where(any_fit, ch, float(fb_h))
    top = torch.where(any_fit, (u(U_TOP) * (src_h - ch + 1)).floor(), float((src_h - fb_h) // 2))
    left = torch.where(any_fit, (u(U_LEFT) * (src_w - cw + 1)).floor(), float((src_w - fb_w) // 2))

    def bernoulli(j: int, p: float) -> torch.Tensor:
        return (u(j) < p).to(torch.float32)

    def uniform(j: int, a: float, b: float) -> torch.Tensor:
        return (a + (b - a) * u(j)).to(torch.float32)

    flip = bernoulli(U_FLIP, aug.flip_p)
    jitter = bernoulli(U_JITTER, aug.jitter_p)
    order = u(U_ORDER, 4).argsort(dim=1)
    on = jitter > 0
    factors = [
        torch.where(on, uniform(U_FACTORS + k, max(0.0, 1 - r), 1 + r), 1.0)
        for k, r in enumerate((aug.brightness, aug.contrast, aug.saturation))
    ]
    hue = torch.where(on, uniform(U_FACTORS + 3, -aug.hue, aug.hue), 0.0)
    gray = bernoulli(U_GRAY, aug.gray_p)
    sigma = uniform(U_SIGMA, *aug.blur_sigma) * bernoulli(U_BLUR, aug.blur_p)
    solarize = bernoulli(U_SOLARIZE, aug.solarize_p)
    f32 = torch.float32
    values = (
        left.to(f32),
        top.to(f32),
        cw.to(f32),
        ch.to(f32),
        torch.full((n,), float(src_w), device=device),
        torch.full((n,), float(src_h), device=device),
        flip,
        jitter,
        *factors,
        hue,
        gray,
        sigma,
        solarize,
    )
    params = dict(zip(PARAM_NAMES, values))
    params["jitter_order"] = torch.where(on[:, None], order, -1)
    return params


def centre_crop_size(src_h: int, src_w: int, ratio: tuple[float, float]) -> tuple[int, int]:
    """(w, h) of ``RandomResizedCrop``'s fallback: the whole image, its aspect clamped to ``ratio``."""
    in_ratio = src_w / src_h
    if in_ratio < min(ratio):
        return src_w, int(round(src_w / min(ratio)))
    if in_ratio > max(ratio):
        return int(round(src_h * max(ratio))), src_h
    return src_w, src_h


INTERPOLATION_MODES = {name: F.InterpolationMode[name.upper()] for name in INTERPOLATIONS}  # options.INTERPOLATIONS


def crop_flip(img: torch.Tensor, params: Mapping[str, Any], size: int, interpolation: str = "bilinear") -> torch.Tensor:
    """The geometric part of a view (what loader workers do): uint8 ``[3, size, size]``,
    torchvision's antialiased ``resized_crop`` with ``interpolation`` (``ViewAug.interpolation``)."""
    x = F.resized_crop(
        img,
        int(params["crop_y"]),
        int(params["crop_x"]),
        int(params["crop_h"]),
        int(params["crop_w"]),
        [size, size],
        interpolation=INTERPOLATION_MODES[interpolation],
        antialias=True,
    )
    return F.horizontal_flip(x) if params["flip"] else x


def pil_gaussian_blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """PIL's ``ImageFilter.GaussianBlur(radius=sigma)`` of a uint8 ``[3, H, W]`` image (what
    SimSiam's, DINO's and iBOT's pipelines call): the reference :func:`.batched.pil_blur` matches."""
    from PIL import ImageFilter

    return F.pil_to_tensor(F.to_pil_image(x).filter(ImageFilter.GaussianBlur(radius=sigma)))


def torchvision_gaussian_blur(x: torch.Tensor, sigma: float, kernel: int) -> torch.Tensor:
    """``torchvision.transforms.GaussianBlur(kernel, sigma)`` of a uint8 ``[..., 3, H, W]`` image
    with this sigma: the classic (v1) functional the HVP code calls, whose kernel weights are
    computed another way than v2's (``exp(-x^2 / 2 sigma^2) / sum`` against a softmax), so a
    pixel at a rounding boundary can differ between the two; ``blur_kind="torchvision9"``."""
    return classic_gaussian_blur(x, [kernel, kernel], [sigma, sigma])


def reference_colour(x: torch.Tensor, params: Mapping[str, Any], aug: ViewAug) -> torch.Tensor:
    """The photometric part of one view with torchvision's own uint8 kernels (PIL's blur for
    ``aug.blur_kind="pil"``), from recorded parameters: the reference that :mod:`.batched`
    reproduces for whole batches on device."""
    if params["jitter"]:
        ops = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
        factors = [float(params[k]) for k in ("brightness", "contrast", "saturation", "hue")]
        for op_idx in [int(o) for o in params["jitter_order"]]:
            x = ops[op_idx](x, factors[op_idx])
    if params["grayscale"]:
        x = F.rgb_to_grayscale(x, num_output_channels=3)
    sigma = float(params["blur_sigma"])
    if sigma > 0 and aug.blur_kind == "pil":
        x = pil_gaussian_blur(x, sigma)
    elif sigma > 0 and aug.blur_kind == "torchvision9":
        x = torchvision_gaussian_blur(x, sigma, aug.blur_kernel)
    elif sigma > 0:
        x = F.gaussian_blur(x, [aug.blur_kernel, aug.blur_kernel], [sigma, sigma])
    if params["solarize"]:
        x = F.solarize(x, 128)
    return x


def augment(img: torch.Tensor, aug: ViewAug, key: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sample (the view with ``key``, :func:`.seeds.view_key`) and apply one whole view per
    image with torchvision (the reference pipeline; training runs :class:`MultiViewTransform`
    + :func:`.batched.finish_views` instead)."""
    params = sample_params(img, aug, key)
    x = reference_colour(crop_flip(img, params, aug.size, aug.interpolation), params, aug)
    return normalize(x, aug.mean, aug.std), params


def normalize(
    x: torch.Tensor, mean: Sequence[float], std: Sequence[float], out: torch.Tensor | None = None
) -> torch.Tensor:
    """0..255 values ``[..., 3, H, W]`` (uint8, or float32: then in place, or into ``out``) ->
    float32 ``(x / 255 - mean) / std``, torchvision's ``normalize`` after ``/255`` up to float
    rounding, as one scale and one shift per channel with Python scalars (nothing copied to a
    device). One function for training views (the batched colour step), the reference and
    evaluation; ``out`` (float32, ``x``'s shape) saves a loader worker a copy of the view."""
    x = x.to(torch.float32)
    if out is None:
        out = x
    for c, (m, s) in enumerate(zip(mean, std)):
        torch.mul(x[..., c, :, :], 1 / (255 * s), out=out[..., c, :, :]).sub_(m / s)
    return out


@dataclass(frozen=True)
class MultiViewTransform:
    """The loader-worker part of the candidate views of one image: decode to uint8, draw every
    view's parameters, crop and flip. Colour ops and normalisation run later on the whole batch,
    on its device (:func:`.batched.finish_views`, called by the data module after transfer).

    View ``slot`` of image ``index`` in ``epoch`` draws from ``view_key(seed, epoch, index,
    slot)`` alone (:mod:`.seeds`), so it is the same in any worker and after any resume.
    Returns ``(views, params)``: a list of uint8 ``[3, S, S]`` crops and a dict of parameters
    stacked over views (``[V]`` per scalar, ``[V, 4]`` for ``jitter_order``).
    """

    augs: tuple[ViewAug, ...] = field(default_factory=tuple)
    seed: int = 0

    def __call__(self, img, epoch: int, index: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        img = to_uint8_tensor(img)
        return cut_views(img, self.augs, [view_key(self.seed, epoch, index, slot) for slot in range(len(self.augs))])


def cut_views(
    img: torch.Tensor, augs: Sequence[ViewAug], keys: Sequence[int]
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The views ``augs`` of uint8 ``img`` drawn from ``keys`` (one per view): uint8 crops and
    their parameters stacked over views (what :class:`MultiViewTransform` returns)."""
    plist = [sample_params(img, a, k) for a, k in zip(augs, keys)]
    views = [crop_flip(img, p, a.size, a.interpolation) for p, a in zip(plist, augs)]
    params = {k: torch.stack([p[k] for p in plist]) for k in plist[0]}
    return views, params


def draw_view_params(augs: Sequence[ViewAug], src_h: int, src_w: int, keys: torch.Tensor) -> dict[str, torch.Tensor]:
    """:func:`draw_params` for the views ``augs`` of ``n`` images of one size, from the views'
    keys (int64 ``[n, V]``, :func:`.seeds.view_keys`, on the device to draw on): ``[n, V]`` per
    scalar, ``[n, V, 4]`` for ``jitter_order``; one vectorised draw per distinct augmentation
    (DINO: global 1, global 2, local)."""
    uniforms = key_uniforms(keys, UNIFORMS)  # [n, V, UNIFORMS]
    n = keys.shape[0]
    groups: dict[ViewAug, list[int]] = {}
    for i, a in enumerate(augs):
        groups.setdefault(a, []).append(i)
    parts = {
        a: draw_params(torch.stack([uniforms[:, i] for i in idx], 1).view(-1, UNIFORMS), src_h, src_w, a)
        for a, idx in groups.items()
    }  # image-major: [n * len(idx)]
    slot = {i: (a, k) for a, idx in groups.items() for k, i in enumerate(idx)}  # view -> (its draw, position)
    out: dict[str, torch.Tensor] = {}
    for key in parts[augs[0]]:
        per_group = {a: p[key].view(n, len(groups[a]), *p[key].shape[1:]) for a, p in parts.items()}
        out[key] = torch.stack([per_group[slot[i][0]][:, slot[i][1]] for i in range(len(augs))], dim=1)
    return out


@dataclass(frozen=True)
class EvalTransform:
    """Resize + centre crop + normalise, for k-NN/linear evaluation."""

    size: int
    crop_ratio: float = 1.0  # 0.875 on ImageNet (resize 256, crop 224); 1.0 for small images
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    interpolation: str = "bilinear"  # the resize: bicubic in the DINO/iBOT/SimCLR evaluation code

    def __call__(self, img) -> torch.Tensor:
        x = to_uint8_tensor(img)
        mode = INTERPOLATION_MODES[self.interpolation]
        x = F.resize(x, [round(self.size / self.crop_ratio)], interpolation=mode, antialias=True)
        x = F.center_crop(x, [self.size, self.size])
        return normalize(x, self.mean, self.std)


@dataclass(frozen=True)
class TrainTransform:
    """RandomResizedCrop + horizontal flip + normalise: the linear-probe / fine-tuning views."""

    size: int
    scale: tuple[float, float]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    interpolation: str = "bilinear"  # as EvalTransform's

    def __call__(self, img) -> torch.Tensor:
        x = to_uint8_tensor(img)
        top, left, h, w = RandomResizedCrop.get_params(x, list(self.scale), [3 / 4, 4 / 3])
        mode = INTERPOLATION_MODES[self.interpolation]
        x = F.resized_crop(x, top, left, h, w, [self.size, self.size], interpolation=mode, antialias=True)
        if torch.rand(()) < 0.5:
            x = F.horizontal_flip(x)
        return normalize(x, self.mean, self.std)
