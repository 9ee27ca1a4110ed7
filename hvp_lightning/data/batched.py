"""Colour augmentation of a whole batch of views, on the device the batch is on.

Loader workers only decode, crop and flip (uint8) and record every sampled parameter
(:class:`.augment.MultiViewTransform`). This module applies the rest -- colour jitter in each
sample's own order, grayscale, Gaussian blur, solarize, normalisation -- to all views of a
batch at once from those parameters, with the same code wherever the batch is: on the
accelerator after the transfer, or in the loader workers when training runs on the CPU
(:class:`.datamodule.SSLDataModule` decides).

Pixels follow torchvision's uint8 kernels (:func:`.augment.reference_colour`): images are
float32 holding integer values 0..255, and every op truncates or rounds to an integer exactly
where torchvision converts back to uint8; jitter, grayscale and solarize match bit for bit.
The blur is separable (two 1-D passes, 2k instead of k*k multiplies per pixel; the 2-D
kernel is their outer product), which reorders its float sums: a blurred pixel can land one
level (1/255) from torchvision's at a rounding boundary (~2e-5 of pixels measured).

Written here rather than taken from kornia: kornia's jitter is float-only with its own hue
formula and no per-sample op order, so it would not reproduce torchvision's pixels; these
ops are a few dozen lines of plain tensor code that run wherever torch runs.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as tF

from .augment import ViewAug

Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
JITTER_KEYS = ("brightness", "contrast", "saturation", "hue")  # jitter_order indexes these
CPU_CHUNK = 8  # images per colour() call on CPU


def _luma(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma ``[n, 1, H, W]``, with torchvision's weights and operation order."""
    r, g, b = x.unbind(1)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(1)


def _per_sample(f: torch.Tensor) -> torch.Tensor:
    return f.to(torch.float32).view(-1, 1, 1, 1)


def _blend(x: torch.Tensor, other: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """``x * f + other * (1 - f)``, truncated to 0..255. torchvision computes the sum as one
    fused multiply-add (``add_(other, alpha=1 - f)``); the float64 sum of the two float32
    terms, rounded once to float32, is that same value, so the pixels match exactly."""
    f = _per_sample(f)
    fused = (x * f).double().add_(other.double() * (1 - f).double()).float()
    return fused.clamp_(0, 255).floor_()


def brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return (x * _per_sample(f)).clamp_(0, 255).floor_()


def contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    mean = _luma(x).floor_().mean(dim=(1, 2, 3), keepdim=True)
    return _blend(x, mean, f)


def saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return _blend(x, _luma(x).floor_(), f)


def hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the hue by ``shift`` turns: torchvision's HSV round trip on [0, 1] values with
    the same float operations. Branches are chosen by exact 0/1 float indicators (``ceil`` of
    a value in [0, 1], ``relu(1 - |i - k|)``) instead of bool masks and ``where``, which run
    5-50x slower on CPU; multiplying by 0 or 1 and adding zeros leaves every value unchanged."""
    y = x.mul(1.0 / 255)
    r, g, b = y.unbind(1)
    maxc = torch.maximum(torch.maximum(r, g), b)
    minc = torch.minimum(torch.minimum(r, g), b)
    rng = maxc - minc
    s = rng / maxc.clamp_min(1e-30)  # maxc = 0 only where rng = 0: s = 0 either way
    div = rng.clamp_min(1e-30)  # rng = 0 only where every (maxc - c) = 0
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    not_r, not_g = rc.ceil(), gc.ceil()  # 1.0 where that channel is not the max, else 0.0
    h = (bc - gc) * (1 - not_r) + (rc + 2.0 - bc) * ((1 - not_g) * not_r) + (gc + 4.0 - rc) * (not_r * not_g)
    h = _frac(h.mul_(1.0 / 6.0).add_(1.0))
    h = _frac(h.add_(_per_sample(shift)[:, 0]))
    h6 = h.mul_(6)
    i = torch.floor(h6)
    f = h6 - i
    sf = s * f
    q = (1.0 - sf).mul_(maxc).clamp_(0.0, 1.0)
    t = (sf + (1.0 - s)).mul_(maxc).clamp_(0.0, 1.0)
    p = (1.0 - s).mul_(maxc).clamp_(0.0, 1.0)
    sector = [(1 - (i - k).abs_()).relu_() for k in range(7)]  # sector 6 (h6 rounded up to 6) is 0
    s0 = sector[0] + sector[6]
    out = torch.stack([
        maxc * (s0 + sector[5]) + q * sector[1] + p * (sector[2] + sector[3]) + t * sector[4],
        t * s0 + maxc * (sector[1] + sector[2]) + q * sector[3] + p * (sector[4] + sector[5]),
        p * (s0 + sector[1]) + t * sector[2] + maxc * (sector[3] + sector[4]) + q * sector[5],
    ], dim=1)
    return out.mul_(255 + 1.0 - 1e-3).floor_()


def _frac(v: torch.Tensor) -> torch.Tensor:
    """``v mod 1`` (torch's ``remainder``/``fmod`` by 1 for these non-negative-or-small values,
    exactly: ``v - floor(v)`` is representable), without their slow CPU kernels."""
    return v.sub_(v.floor())


def grayscale(x: torch.Tensor) -> torch.Tensor:
    return _luma(x).floor_().expand(-1, 3, -1, -1).contiguous()


def solarize(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 128, 255 - x, x)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, kernel: int) -> torch.Tensor:
    """Separable Gaussian blur with a per-sample ``sigma`` ``[n]``: torchvision's kernel
    (``softmax(-(t / sigma)^2)`` on its grid), reflect padding, rounded to integers."""
    n, c, hgt, wid = x.shape
    lim = (kernel - 1) / (2.0 * math.sqrt(2.0))
    grid = torch.linspace(-lim, lim, kernel, dtype=torch.float32, device=x.device)
    k1 = torch.softmax((grid / sigma.to(torch.float32)[:, None]).pow(2).neg(), dim=1)  # [n, k]
    k1 = k1.repeat_interleave(c, dim=0)[:, None]  # [n*c, 1, k]
    pad = kernel // 2
    y = tF.pad(x.reshape(1, n * c, hgt, wid), (pad, pad, pad, pad), mode="reflect")
    y = tF.conv2d(y, k1[:, :, None, :], groups=n * c)  # along width
    y = tF.conv2d(y, k1[:, :, :, None], groups=n * c)  # along height
    return y.reshape(n, c, hgt, wid).round_()


JITTER_OPS: tuple[Op, ...] = (brightness, contrast, saturation, hue)


def _apply_where(x: torch.Tensor, mask: torch.Tensor, op: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """``x[mask] = op(x[mask])`` in place, only on the selected samples (the op's cost scales
    with how many samples draw it, e.g. half the views are blurred)."""
    idx = mask.nonzero().squeeze(1)
    if idx.numel():
        x[idx] = op(x[idx])


def colour(x: torch.Tensor, params: dict[str, torch.Tensor], blur_kernel: int) -> torch.Tensor:
    """Photometric part of ``n`` views at once: ``x`` uint8 ``[n, 3, H, W]``, ``params`` with
    ``[n]`` scalars and ``jitter_order`` ``[n, 4]`` -> float32 ``[n, 3, H, W]`` with integer
    values 0..255, as torchvision's ``reference_colour`` view by view."""
    x = x.to(torch.float32, copy=True)  # filled in place below: never the caller's tensor
    order = params["jitter_order"].to(x.device)
    for pos in range(4):  # each sample's own order: at step pos, op order[:, pos]
        for op_idx, op in enumerate(JITTER_OPS):
            f = params[JITTER_KEYS[op_idx]].to(x.device)
            mask = order[:, pos] == op_idx
            _apply_where(x, mask, lambda v, op=op, f=f, m=mask: op(v, f[m]))
    _apply_where(x, params["grayscale"].to(x.device) > 0, grayscale)
    sigma = params["blur_sigma"].to(x.device)
    blurred = sigma > 0
    _apply_where(x, blurred, lambda v: gaussian_blur(v, sigma[blurred], blur_kernel))
    _apply_where(x, params["solarize"].to(x.device) > 0, solarize)
    return x


def normalise(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """0..255 values -> ``(x / 255 - mean) / std`` (torchvision's ``normalize`` after ``/255``)."""
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return x.div_(255).sub_(m).div_(s)


def finish_views(views: Sequence[torch.Tensor], params: dict[str, torch.Tensor],
                 augs: Sequence[ViewAug]) -> list[torch.Tensor]:
    """Colour + normalise a loader batch: ``views`` are N uint8 ``[B, 3, S_i, S_i]`` (view i
    drawn from ``augs[i]``), ``params`` ``{name: [B, N, ...]}``. Views that share a size,
    blur kernel and normalisation go through :func:`colour` together: on an accelerator all
    N*B images in one launch per op; on CPU in chunks of :data:`CPU_CHUNK` images, whose
    temporaries stay in cache (whole-batch calls were 1.0-1.45x slower in three noisy runs).
    Returns N float ``[B, 3, S_i, S_i]``."""
    if len(views) != len(augs):
        raise ValueError(f"{len(views)} views in the batch but {len(augs)} view augmentations")
    groups: dict[tuple, list[int]] = {}
    for i, (v, a) in enumerate(zip(views, augs)):
        groups.setdefault((tuple(v.shape[1:]), a.blur_kernel, a.mean, a.std), []).append(i)
    out: list[torch.Tensor | None] = [None] * len(views)
    for (_, kernel, mean, std), idx in groups.items():
        x = torch.cat([views[i] for i in idx])
        p = {k: torch.cat([v[:, i] for i in idx]) for k, v in params.items()}
        step = CPU_CHUNK if x.device.type == "cpu" else x.shape[0]
        y = torch.cat([colour(x[j:j + step], {k: v[j:j + step] for k, v in p.items()}, kernel)
                       for j in range(0, x.shape[0], step)])
        y = normalise(y, mean, std)
        for i, part in zip(idx, y.chunk(len(idx))):
            out[i] = part
    return out  # type: ignore[return-value]
