"""View augmentation that also returns the parameters it sampled.

HVP's analysis (paper section 6) needs, for every candidate view, the crop box in
source-image pixels, the flip, the colour-jitter factors and their order, grayscale, blur
sigma and solarize. torchvision's composed transforms hide those, so this module samples
them explicitly (with torchvision's own samplers, so the distributions are identical).

Training splits a view in two: loader workers crop and flip uint8 images
(:class:`MultiViewTransform`), and the colour ops run batched on the batch's device
(:mod:`.batched`). :func:`augment` is the whole view with torchvision's per-image kernels:
the reference the batched ops are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from torchvision import transforms as T
from torchvision.transforms.v2 import functional as F

from .datasets import to_rgb8

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Scalar parameters recorded per view (plus ``jitter_order``: the 4 jitter ops' order).
PARAM_NAMES = (
    "crop_x", "crop_y", "crop_w", "crop_h", "src_w", "src_h", "flip", "jitter",
    "brightness", "contrast", "saturation", "hue", "grayscale", "blur_sigma", "solarize",
)


@dataclass(frozen=True)
class ViewAug:
    """One view's augmentation distribution (defaults: SimSiam/BYOL ImageNet pipeline)."""

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

    @property
    def blur_kernel(self) -> int:
        """Odd kernel of ~10% of the crop (23 px at 224, as in SimCLR/BYOL/DINO)."""
        k = max(3, int(0.1 * self.size))
        return k if k % 2 == 1 else k + 1


def to_uint8_tensor(img) -> torch.Tensor:
    """PIL image (any mode) or tensor -> uint8 ``[3, H, W]`` RGB."""
    if isinstance(img, torch.Tensor):
        if img.dtype != torch.uint8:
            raise TypeError(f"expected a uint8 image tensor, got {img.dtype}")
        return img if img.shape[0] == 3 else img[:1].expand(3, -1, -1)
    return F.pil_to_tensor(to_rgb8(img))  # one mode conversion for every path (datasets.to_rgb8)


def _rand() -> float:
    return torch.rand(()).item()


def sample_params(img: torch.Tensor, aug: ViewAug) -> dict[str, torch.Tensor]:
    """Draw every parameter of one view, in the order (and with the samplers) of the composed
    torchvision pipeline: crop box, flip, jitter (order and factors), grayscale, blur sigma,
    solarize. Uses the global torch RNG (seeded per DataLoader worker)."""
    _, h_src, w_src = img.shape
    top, left, h, w = T.RandomResizedCrop.get_params(img, list(aug.scale), list(aug.ratio))
    flip = _rand() < aug.flip_p
    jitter = _rand() < aug.jitter_p
    factors = (1.0, 1.0, 1.0, 0.0)
    order = torch.full((4,), -1)
    if jitter:
        order, b, c, s, hue = T.ColorJitter.get_params(
            [max(0.0, 1 - aug.brightness), 1 + aug.brightness], [max(0.0, 1 - aug.contrast), 1 + aug.contrast],
            [max(0.0, 1 - aug.saturation), 1 + aug.saturation], [-aug.hue, aug.hue])
        factors = (float(b), float(c), float(s), float(hue))  # type: ignore[arg-type]
    gray = _rand() < aug.gray_p
    sigma = 0.0
    if aug.blur_p > 0 and _rand() < aug.blur_p:
        sigma = aug.blur_sigma[0] + _rand() * (aug.blur_sigma[1] - aug.blur_sigma[0])
    solarize = aug.solarize_p > 0 and _rand() < aug.solarize_p
    values = (left, top, w, h, w_src, h_src, flip, jitter, *factors, gray, sigma, solarize)
    params = dict(zip(PARAM_NAMES, torch.tensor([float(v) for v in values]).unbind()))  # one tensor, not 15
    params["jitter_order"] = order.clone()
    return params


def crop_flip(img: torch.Tensor, params: Mapping[str, Any], size: int) -> torch.Tensor:
    """The geometric part of a view (what loader workers do): uint8 ``[3, size, size]``."""
    x = F.resized_crop(img, int(params["crop_y"]), int(params["crop_x"]), int(params["crop_h"]),
                       int(params["crop_w"]), [size, size], antialias=True)
    return F.horizontal_flip(x) if params["flip"] else x


def reference_colour(x: torch.Tensor, params: Mapping[str, Any], blur_kernel: int) -> torch.Tensor:
    """The photometric part of one view with torchvision's own uint8 kernels, from recorded
    parameters: the reference that :mod:`.batched` reproduces for whole batches on device."""
    if params["jitter"]:
        ops = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
        factors = [float(params[k]) for k in ("brightness", "contrast", "saturation", "hue")]
        for op_idx in [int(o) for o in params["jitter_order"]]:
            x = ops[op_idx](x, factors[op_idx])
    if params["grayscale"]:
        x = F.rgb_to_grayscale(x, num_output_channels=3)
    sigma = float(params["blur_sigma"])
    if sigma > 0:
        x = F.gaussian_blur(x, [blur_kernel, blur_kernel], [sigma, sigma])
    if params["solarize"]:
        x = F.solarize(x, 128)
    return x


def augment(img: torch.Tensor, aug: ViewAug) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sample and apply one whole view per image with torchvision (the reference pipeline;
    training runs :class:`MultiViewTransform` + :func:`.batched.finish_views` instead)."""
    params = sample_params(img, aug)
    x = reference_colour(crop_flip(img, params, aug.size), params, aug.blur_kernel)
    return normalize(x, aug.mean, aug.std), params


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    return F.normalize(x.float().div_(255), list(mean), list(std))


@dataclass(frozen=True)
class MultiViewTransform:
    """The loader-worker part of the candidate views of one image: decode to uint8, draw every
    view's parameters, crop and flip. Colour ops and normalisation run later on the whole batch,
    on its device (:func:`.batched.finish_views`, called by the data module after transfer).

    Returns ``(views, params)``: a list of uint8 ``[3, S, S]`` crops and a dict of parameters
    stacked over views (``[V]`` per scalar, ``[V, 4]`` for ``jitter_order``).
    """

    augs: tuple[ViewAug, ...] = field(default_factory=tuple)

    def __call__(self, img) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        img = to_uint8_tensor(img)
        plist = [sample_params(img, a) for a in self.augs]
        views = [crop_flip(img, p, a.size) for p, a in zip(plist, self.augs)]
        params = {k: torch.stack([p[k] for p in plist]) for k in plist[0]}
        return list(views), params


@dataclass(frozen=True)
class EvalTransform:
    """Resize + centre crop + normalise, for k-NN/linear evaluation."""

    size: int
    crop_ratio: float = 1.0  # 0.875 on ImageNet (resize 256, crop 224); 1.0 for small images
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __call__(self, img) -> torch.Tensor:
        x = to_uint8_tensor(img)
        x = F.resize(x, [round(self.size / self.crop_ratio)], antialias=True)
        x = F.center_crop(x, [self.size, self.size])
        return normalize(x, self.mean, self.std)
