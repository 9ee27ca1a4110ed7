"""Colour augmentation of a whole batch of views, on the device the batch is on.

Loader workers only decode, crop and flip (uint8) and record every sampled parameter
(:class:`.augment.MultiViewTransform`). This module applies the rest -- colour jitter in each
sample's own order, grayscale, Gaussian blur, solarize, normalisation -- from those
parameters, with the same op functions wherever the batch is: on the accelerator after the
transfer, or in the loader workers when training runs on the CPU
(:class:`.datamodule.SSLDataModule` decides).

Pixels follow torchvision's uint8 kernels (:func:`.augment.reference_colour`): images are
float32 holding integer values 0..255, and every op truncates or rounds to an integer exactly
where torchvision converts back to uint8; jitter, grayscale and solarize match bit for bit
(the hue on every one of the 2^24 colours: 8 shifts checked by hand, 3 in a slow test). The blur
is one of two, as the method's official pipeline (``ViewAug.blur_kind``):

* ``pil`` (upstream SimSiam and DINO, iBOT: PIL's ``ImageFilter.GaussianBlur(radius=sigma)``, not cut to a
  kernel): PIL's own algorithm, three extended box blurs along rows then three along columns
  (Pillow's BoxBlur.c, Gwosdek et al. 2011), in its integer arithmetic, rounding to uint8 after
  each pass as PIL does, with the box radius computed in PIL's float32/float64 steps: bit for
  bit PIL's output (the tests compare with PIL itself). One view on the CPU reads its box on the
  host and runs only its taps, in integers (the C kernel of :mod:`.cpu_kernels`, else
  :func:`pil_blur_view` in int32 torch ops).
* ``simclr`` (SimCLR's kernel of 10% of the crop): separable (two 1-D passes of shifted
  multiply-adds, 2k instead of k*k multiplies per pixel), which reorders its float sums: a
  blurred pixel can land one level (1/255) from torchvision's ``gaussian_blur`` at a rounding
  boundary (~3e-5 of pixels measured).
* ``torchvision9`` (the HVP code's ``torchvision.transforms.GaussianBlur(9, (0.1, 2.0))`` at
  every crop size): :func:`torchvision_blur`, torchvision's kernel and convolution on the float
  image (without its uint8 round trips), one view at a time on the CPU (the very call torchvision
  makes, or a C kernel summing in its order where it gives its sums on a probe,
  :func:`native_conv_is_torchs`: bit for bit, tested against it), a whole batch in one grouped
  convolution on an accelerator.

Which samples an op touches is chosen two ways, with the same op functions:

* on the CPU (:func:`colour` with ``sync_free=False``), one view at a time with plain Python
  control flow: each view runs only the ops it drew, on a 224 px image whose temporaries stay
  in cache. Per-view small elementwise passes cost ~5-20 us each there, while bool masks,
  ``where``, ``gather`` and dimension reductions such as ``aminmax`` cost 3-100x a plain
  arithmetic pass; so the ops below are written with arithmetic only. There every op runs as
  a C kernel with the same bits where a C compiler built them (:mod:`.cpu_kernels`; the hue and
  the blur are dozens of such passes, the rest a few each), in place in the view's buffer.
* on an accelerator (``sync_free=True``), each op runs once on all the views that take it at
  a step, gathered into one contiguous batch and written back (``index_select``/``index_copy_``):
  each jitter op once at each of the 4 positions of the order on the views whose order puts it
  there, grayscale, blur and solarize on the views that drew them. Which views those are is
  sorted on the device; how many, the one value read on the host per batch (:func:`plan_colour`,
  one host sync for all the batch's view sizes), so the ops need no ``nonzero``/``item``.

Written here rather than taken from a library: torchvision.transforms.v2 draws one parameter
per call (one factor for a whole batch), and kornia's per-sample jitter is float-only with its
own hue formula and no per-sample op order, so neither reproduces the views the paper used
from per-view recorded parameters (docs/DESIGN.md, "View pipeline").
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as tF

from . import cpu_kernels
from .augment import ViewAug, normalize
from .cpu_kernels import Kernels

Op = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
JITTER_KEYS = ("brightness", "contrast", "saturation", "hue")  # jitter_order indexes these
HUE = JITTER_KEYS.index("hue")
TINY = 1e-30  # stands in for a zero divisor whose numerator is zero as well
NEGLIGIBLE_TAP = 1e-8  # blur weights below this are left out on the CPU (gaussian_blur)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma ``[n, 1, H, W]``, with torchvision's weights and operation order."""
    r, g, b = x.unbind(1)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(1)


def _per_sample(f: torch.Tensor) -> torch.Tensor:
    return f.to(torch.float32).view(-1, 1, 1, 1)


def _blend(x: torch.Tensor, other: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """``x * f + other * (1 - f)``, truncated to 0..255. torchvision computes the sum as one
    fused multiply-add (``add_(other, alpha=1 - f)``); ``addcmul`` with per-sample factors
    gives that same value bit for bit on the CPU (the pixel tests check it), where a separate
    multiply and add round twice and move ~1/6 of the pixels."""
    f = _per_sample(f)
    return torch.addcmul(x * f, other, 1 - f).clamp_(0, 255).floor_()


def brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return (x * _per_sample(f)).clamp_(0, 255).floor_()


def contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    mean = _luma(x).floor_().mean(dim=(1, 2, 3), keepdim=True)
    return _blend(x, mean, f)


def saturation(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return _blend(x, _luma(x).floor_(), f)


# Channel c (0, 1, 2) of an HSV sector i takes the role w = clamp(2.5 - ||i - 2c - ROLE_SHIFT| - 3|,
# 0, 2): 2 = the pixel's max, 1 = the middle value, 0 = its min (torchvision's vpqt table: red
# is the max in sectors 0 and 5, the middle in 1 and 4, the min in 2 and 3; green and blue 2 and
# 4 sectors later; sector 6, h rounded up to 1, is sector 0).
ROLE_SHIFT = 2.5


def hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the hue by ``shift`` turns, as torchvision's HSV round trip on [0, 1] values.

    Of the three output channels two are the pixel's own max and min (torchvision's ``v`` and
    ``p``, which convert back to exactly those integers), so only the middle one (``q`` or
    ``t``) is computed, with torchvision's float operations in its order; the sector then
    places max, middle and min. Branches are exact 0/1 float factors (integer differences
    clamped to 1, sector arithmetic), never bool masks."""
    r, g, b = x.unbind(1)
    mx = torch.maximum(torch.maximum(r, g), b)
    mn = torch.minimum(torch.minimum(r, g), b)
    maxc = mx * (1.0 / 255)
    rng = maxc - mn * (1.0 / 255)
    s = rng / maxc.clamp_min(TINY)  # maxc = 0 only where rng = 0: s = 0 as torchvision's
    div = rng.clamp_min(TINY)
    rc, gc, bc = ((maxc - c.mul(1.0 / 255)).div_(div) for c in (r, g, b))  # per plane: no broadcasting
    not_r = (mx - r).clamp_max_(1)  # 0.0 where red is the max, else 1.0 (integer values)
    not_g = (mx - g).clamp_max_(1)
    h = (bc - gc).mul_(1 - not_r)
    h.add_((rc + 2.0).sub_(bc).mul_((1 - not_g).mul_(not_r)))
    h.add_((gc + 4.0).sub_(rc).mul_(not_g.mul_(not_r)))
    h = _frac(h.mul_(1.0 / 6.0).add_(1.0))
    h6 = _frac(h.add_(shift.to(torch.float32).view(-1, 1, 1))).mul_(6)
    sector = h6.floor()
    f = h6.sub_(sector)
    sxf = s * f
    q = (1.0 - sxf).mul_(maxc)  # torchvision clamps q, t to [0, 1]: no-ops after the floor below
    t = sxf.add_(1.0 - s).mul_(maxc)
    odd = sector - (sector * 0.5).floor_().mul_(2)
    mid = q.mul_(odd).add_(t.mul_(1 - odd)).mul_(255 + 1.0 - 1e-3).floor_()
    above_min = mid - mn
    spread = (mx - mn).sub_(above_min * 2)
    out = torch.empty_like(x)
    for c in (0, 1):  # red, green: min + role * (mid - min), plus (max - 2 mid + min) where role = 2
        role = (sector - (2 * c + ROLE_SHIFT)).abs_().sub_(3).abs_().neg_().add_(2.5).clamp_(0, 2)
        top = (role - 1).relu_()  # 1.0 where the channel takes the max
        torch.add(role.mul_(above_min).add_(mn), top.mul_(spread), out=out[:, c])
    out[:, 2] = (mx + mid + mn).sub_(out[:, 0]).sub_(out[:, 1])  # blue: the role left; integers, exact
    return out


def _frac(v: torch.Tensor) -> torch.Tensor:
    """``v mod 1`` (torch's ``remainder``/``fmod`` by 1 for these non-negative-or-small values,
    exactly: ``v - floor(v)`` is representable), without their slow CPU kernels."""
    return v.sub_(v.floor())


def grayscale(x: torch.Tensor) -> torch.Tensor:
    return _luma(x).floor_().expand(-1, 3, -1, -1).contiguous()


def solarize(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 128, 255 - x, x)


def gaussian_weights(sigma: torch.Tensor, kernel: int) -> torch.Tensor:
    """torchvision's 1-D Gaussian kernel per sample: ``softmax(-(t / sigma)^2)`` on its grid
    (``[n]`` sigmas -> ``[n, kernel]``)."""
    lim = (kernel - 1) / (2.0 * math.sqrt(2.0))
    grid = torch.linspace(-lim, lim, kernel, dtype=torch.float32, device=sigma.device)
    return torch.softmax((grid / sigma.to(torch.float32)[:, None]).pow(2).neg(), dim=1)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, kernel: int, trim: bool = False) -> torch.Tensor:
    """Separable Gaussian blur with a per-sample ``sigma`` ``[n]`` (> 0): torchvision's kernel,
    reflect padding, rounded to integers. Each 1-D pass is a few shifted multiply-adds
    (1.5-2x faster on CPU than a depthwise convolution at one image, in noisy runs). ``trim``
    leaves out the outer taps whose weight is below :data:`NEGLIGIBLE_TAP` for every sample (a
    small sigma needs a fraction of the kernel; together such taps move a sum by about
    255 * 3e-8 at most, under float32's own rounding of it); finding them reads the weights
    on the host."""
    _, _, hgt, wid = x.shape
    w = gaussian_weights(sigma, kernel)
    if trim:
        half = int((w > NEGLIGIBLE_TAP).any(0).nonzero().max()) - kernel // 2
        w = w[:, kernel // 2 - half : kernel // 2 + half + 1]
    pad = w.shape[1] // 2
    w = w.view(*w.shape, 1, 1, 1)
    y = _taps(tF.pad(x, (pad, pad, pad, pad), mode="reflect"), w, dim=2, length=hgt)  # along height
    return _taps(y, w, dim=3, length=wid).round_()  # along width


def torchvision_blur(x: torch.Tensor, sigma: torch.Tensor, kernel: int) -> torch.Tensor:
    """``torchvision.transforms.GaussianBlur(kernel, sigma)`` (:func:`.augment.torchvision_gaussian_blur`)
    with a per-sample ``sigma`` ``[n]`` (> 0) of float images ``[n, C, H, W]`` holding integers,
    in one depthwise convolution: torchvision's weights (``exp(-0.5 (x / sigma)^2) / sum``, their
    outer product), reflect padding, rounding. One image on the CPU is torchvision's own
    computation on its float conversion (pixels equal, tested); a batch, or another device,
    gives the same pixels where its ``exp`` and convolution sums round as that call's, else a
    pixel at a rounding boundary may move one level (the tests bound it)."""
    return _torchvision_sums(x, sigma, kernel).round_()


def torchvision_weights(sigma: torch.Tensor, kernel: int) -> torch.Tensor:
    """torchvision's 2-D Gaussian kernel per sample (``[n]`` sigmas -> ``[n, kernel, kernel]``)."""
    half = (kernel - 1) * 0.5
    grid = torch.linspace(-half, half, kernel, dtype=torch.float32, device=sigma.device)
    pdf = torch.exp(-0.5 * (grid / sigma.to(torch.float32)[:, None]).pow(2))  # tensor / tensor: no reciprocal
    w1 = pdf / pdf.sum(1, keepdim=True)
    return w1[:, :, None] * w1[:, None, :]


def _torchvision_sums(x: torch.Tensor, sigma: torch.Tensor, kernel: int) -> torch.Tensor:
    """:func:`torchvision_blur` before its rounding."""
    n, c, hgt, wid = x.shape
    w2 = torchvision_weights(sigma.to(x.device), kernel).repeat_interleave(c, 0)[:, None]  # [n * C, 1, k, k]
    pad = kernel // 2
    y = tF.pad(x.reshape(1, n * c, hgt, wid), (pad, pad, pad, pad), mode="reflect")
    return tF.conv2d(y, w2, groups=n * c).reshape(n, c, hgt, wid)


@functools.cache
def native_conv_is_torchs(native: Kernels, hgt: int, wid: int, kernel: int) -> bool:
    """Whether the C convolution (:meth:`.cpu_kernels.Kernels.conv_reflect`) gives this process's
    ``conv2d`` sums bit for bit at this image size: compared unrounded on a noise image at two
    sigmas, where a different order of the float sums changes a large share of them (20-80%
    measured). Once per size and process; where it does not, :func:`torchvision_blur` runs (and
    raises on images too small for the padding)."""
    if kernel // 2 >= min(hgt, wid):
        return False
    x = torch.randint(0, 256, (1, 3, hgt, wid), generator=torch.Generator().manual_seed(0)).to(torch.float32)
    for s in (0.3, 1.7):
        sigma = torch.tensor([s])
        if not torch.equal(
            native.conv_reflect(x, torchvision_weights(sigma, kernel)[0]), _torchvision_sums(x, sigma, kernel)
        ):
            return False
    return True


PIL_PASSES = 3  # ImageFilter.GaussianBlur's box blurs per direction


def pil_box(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PIL's extended box for ``GaussianBlur(radius=sigma)`` per sample (``[n]``): integer
    radius ``r``, the weight ``ww`` of the ``2r + 1`` inner taps and ``fw`` of the two outer ones
    (fixed point, sum 2^24), with the float32 (and float64, where C computes in double) steps
    of Pillow's ``_gaussian_blur_radius`` and ``ImagingHorizontalBoxBlur``. Divisions are
    tensor by tensor: a division by a Python scalar may run as a multiplication by its
    reciprocal on CUDA, one bit off."""
    s = sigma.to(torch.float32)
    three = torch.full_like(s, float(PIL_PASSES))
    sigma2 = s * s / three
    big_l = (sigma2.double() * 12.0 + 1.0).sqrt().float()
    small_l = ((big_l.double() - 1.0) * 0.5).floor().float()
    a = (small_l * 2 + 1) * (small_l * (small_l + 1) - sigma2 * 3)
    a = a / ((sigma2 - (small_l + 1) * (small_l + 1)) * 6)
    radius = small_l + a
    r = radius.to(torch.int64)  # C's (int): truncation, radius >= 0
    ww = (torch.full_like(radius, float(2**24)) / (radius * 2 + 1)).to(torch.int64)
    fw = (2**24 - (2 * r + 1) * ww) // 2
    return r, ww, fw


def pil_blur(x: torch.Tensor, sigma: torch.Tensor, max_radius: int) -> torch.Tensor:
    """PIL's ``GaussianBlur(radius=sigma)`` with a per-sample ``sigma`` ``[n]`` (> 0) of float
    images ``[n, C, H, W]`` holding integers 0..255, for a whole batch on its device: three box
    passes along the width, then three along the height, each ``(ww * inner sum + fw * outer
    pair + 2^23) >> 24`` with the edge pixels repeated. The sums of pixels are exact in float32,
    the fixed-point products in float64 (< 2^33). ``max_radius`` (>= every sample's integer
    radius, :func:`pil_max_radius`) sets the taps; a sample's taps past its own radius count 0,
    so nothing is read on the host."""
    r, ww, fw = pil_box(sigma)
    offsets = torch.arange(-max_radius - 1, max_radius + 2, device=x.device).abs()  # [T]
    inner = (offsets <= r[:, None]).to(torch.float32).view(-1, offsets.numel(), 1, 1, 1)  # [n, T, 1, 1, 1]
    outer = (offsets == r[:, None] + 1).to(torch.float32).view_as(inner)
    ww, fw = ww.to(torch.float64).view(-1, 1, 1, 1), fw.to(torch.float64).view(-1, 1, 1, 1)
    for dim in (3, 3, 3, 2, 2, 2):
        length = x.shape[dim]
        index = torch.arange(-max_radius - 1, length + max_radius + 1, device=x.device).clamp_(0, length - 1)
        padded = x.index_select(dim, index)  # edges repeated
        box, far = _taps(padded, inner, dim, length), _taps(padded, outer, dim, length)
        x = box.double().mul_(ww).add_(far.double().mul_(fw)).add_(2**23).mul_(2.0**-24).floor_().float()
    return x


def pil_blur_view(x: torch.Tensor, r: int, ww: int, fw: int) -> torch.Tensor:
    """PIL's ``GaussianBlur`` of one image on the CPU, its box ``r, ww, fw`` (:func:`pil_box`)
    known on the host: :func:`pil_blur`'s six passes in int32, each ``(ww * S + fw * F + 2^23) >> 24``
    computed as ``(T + (L >> 1)) >> 23`` with ``T = (ww >> 1) S + (fw >> 1) F + 2^22`` and ``L =
    (ww & 1) S + (fw & 1) F``: exact (``V = 2 T + L``, ``T`` an integer), and below 2^31 as
    ``V < 2^32``. Only the taps of this radius, 4-byte integers, no product past 31 bits. Each
    pass writes into the middle of the next pass's edge-padded buffer and sums its taps into two
    buffers made once, so a pass is a few arithmetic sweeps and no copy of the image: at 224 px on
    one core ~1.0-1.3 ms where PIL itself with the tensor conversions takes ~2.1-2.2 ms
    (``benchmarks/view_cost.py blur``). ``x``: float ``[1, C, H, W]`` holding integers 0..255; returns the same."""
    w = r + 1  # edge width: the 2r + 1 inner taps and one outer tap on either side of a pixel
    inner, outer = torch.empty_like(x, dtype=torch.int32), torch.empty_like(x, dtype=torch.int32)
    dims = (3, 3, 3, 2, 2, 2)  # along the width, then the height, as PIL
    src = _edge_padded(x, dims[0], w)
    src.narrow(dims[0], w, x.shape[dims[0]]).copy_(x)
    for k, dim in enumerate(dims):
        n = x.shape[dim]
        lo, hi = src.narrow(dim, 0, w), src.narrow(dim, n + w, w)  # PIL's edges: the end pixels repeated
        lo.copy_(src.narrow(dim, w, 1).expand_as(lo))
        hi.copy_(src.narrow(dim, n + w - 1, 1).expand_as(hi))
        last = k + 1 == len(dims)
        dst = torch.empty_like(x, dtype=torch.int32) if last else _edge_padded(x, dims[k + 1], w)
        y = dst if last else dst.narrow(dims[k + 1], w, x.shape[dims[k + 1]])
        torch.add(src.narrow(dim, 0, n), src.narrow(dim, 2 * r + 2, n), out=outer)
        s = src.narrow(dim, 1, n)  # the source's own buffer: free to change once y has read it
        if r > 0:
            s = torch.add(s, src.narrow(dim, 2, n), out=inner)
            for t in range(3, 2 * r + 2):
                s += src.narrow(dim, t, n)
        torch.mul(s, ww >> 1, out=y)
        y.add_(outer, alpha=fw >> 1)
        if ww & 1 or fw & 1:  # + (L >> 1)
            odd = s.add_(outer) if ww & 1 and fw & 1 else s if ww & 1 else outer
            y.add_(odd.bitwise_right_shift_(1))
        y.add_(2**22).bitwise_right_shift_(23)
        src = dst
    return src.to(torch.float32)


def _edge_padded(x: torch.Tensor, dim: int, width: int) -> torch.Tensor:
    """An int32 buffer (uninitialised) of ``x``'s shape with ``width`` more slices on either side along ``dim``."""
    shape = list(x.shape)
    shape[dim] += 2 * width
    return x.new_empty(shape, dtype=torch.int32)


def pil_max_radius(max_sigma: float) -> int:
    """A bound on the integer box radius of PIL's blur for sigmas up to ``max_sigma``: PIL's is
    ``floor((L - 1) / 2)`` with ``L = sqrt(4 sigma^2 + 1)`` (three passes), growing with sigma;
    ``floor(L / 2)`` is at least that whatever the float rounding. Plain Python: the static tap
    count of :func:`pil_blur` on accelerators, known without reading a tensor."""
    return math.floor(math.sqrt(12 * max_sigma**2 / PIL_PASSES + 1) / 2)


def _taps(y: torch.Tensor, w: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """``sum_t w[:, t] * y[t : t + length]`` along ``dim``."""
    out = y.narrow(dim, 0, length) * w[:, 0]
    for t in range(1, w.shape[1]):
        out.addcmul_(y.narrow(dim, t, length), w[:, t])
    return out


JITTER_OPS: tuple[Op, ...] = (brightness, contrast, saturation, hue)


def colour(
    x: torch.Tensor, params: dict[str, torch.Tensor], aug: ViewAug, sync_free: bool | None = None
) -> torch.Tensor:
    """Photometric part of ``n`` views drawn from ``aug`` (its blur kind, kernel and sigma
    range): ``x`` uint8 ``[n, 3, H, W]``, ``params`` with ``[n]`` scalars and ``jitter_order``
    ``[n, 4]`` -> float32 ``[n, 3, H, W]`` with integer values 0..255, as
    :func:`.augment.reference_colour` view by view. ``sync_free`` picks how ops find their
    samples (module docstring); ``None``: grouped by op off the CPU, per view on it."""
    if not _sync_free(x, sync_free):
        return _colour_per_view(x, params, aug)
    return _colour_planned(x, params, aug, plan_colour([params], x.device)[0])


def _sync_free(x: torch.Tensor, sync_free: bool | None) -> bool:
    return x.device.type != "cpu" if sync_free is None else sync_free


def _blur(
    x: torch.Tensor, sigma: torch.Tensor, aug: ViewAug, sync_free: bool, native: Kernels | None = None
) -> torch.Tensor:
    """``aug``'s blur of a batch (``sync_free``) or of one view on the CPU: there PIL's box
    read on the host and its passes in integers, and the 9 px kernel's convolution, each by the
    ``native`` C kernels where given (the 9 px one where it sums as ``conv2d``), else in torch --
    the same pixels. The C kernels blur ``x`` in place: it must be the caller's own buffer."""
    if aug.blur_kind == "pil" and sync_free:
        return pil_blur(x, sigma, pil_max_radius(aug.blur_sigma[1]))
    if aug.blur_kind == "pil" and native is not None:
        return native.pil_blur(x, *native.pil_box(float(sigma)), out=x)
    if aug.blur_kind == "pil":
        r, ww, fw = (int(b[0]) for b in pil_box(sigma))
        return pil_blur_view(x, r, ww, fw)
    if aug.blur_kind == "torchvision9":  # one view: torchvision's call on float, without its uint8 round trips
        if native is not None and native_conv_is_torchs(native, x.shape[2], x.shape[3], aug.blur_kernel):
            return native.conv_reflect(x, torchvision_weights(sigma, aug.blur_kernel)[0], out=x).round_()
        return torchvision_blur(x, sigma, aug.blur_kernel)
    return gaussian_blur(x, sigma, aug.blur_kernel, trim=not sync_free)


def _colour_per_view(x: torch.Tensor, params: dict[str, torch.Tensor], aug: ViewAug) -> torch.Tensor:
    """One view at a time; on the CPU by the C kernels (:mod:`.cpu_kernels`) where they could be
    built: one pass over the view for each op instead of several to dozens, the same pixels."""
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    native = cpu_kernels.kernels() if x.device.type == "cpu" else None
    for i in range(x.shape[0]):
        out[i : i + 1] = _colour_view(x[i : i + 1], {k: v[i : i + 1] for k, v in params.items()}, aug, native)
    return out


def _colour_view(
    x: torch.Tensor, params: dict[str, torch.Tensor], aug: ViewAug, native: Kernels | None
) -> torch.Tensor:
    """The ops one view ``x`` (``[1, 3, H, W]``, uint8) drew, in its order, with plain Python control
    flow: float32 ``[1, 3, H, W]`` with integer values 0..255. With ``native``, the hue and the blur
    by its C kernels, and the other ops too, in place, where they give this process's torch bits
    (:func:`native_colour_is_torchs`)."""
    order, gray, sigma, sol = (params[k][0].tolist() for k in ("jitter_order", "grayscale", "blur_sigma", "solarize"))
    v = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)  # its own buffer, for the C kernels
    in_place = native is not None and native_colour_is_torchs(native)
    if native is None:
        ops = JITTER_OPS
    elif in_place:
        ops = native_jitter_ops(native, v.shape[2] * v.shape[3])
    else:
        ops = (*JITTER_OPS[:HUE], native.hue_)
    for op_idx in order:
        if op_idx >= 0:
            v = ops[op_idx](v, params[JITTER_KEYS[op_idx]])
    if gray:
        v = native.grayscale_(v) if in_place else grayscale(v)  # type: ignore[union-attr]
    if sigma > 0:
        v = _blur(v, params["blur_sigma"], aug, sync_free=False, native=native)
    if sol:
        v = native.solarize_(v) if in_place else solarize(v)  # type: ignore[union-attr]
    return v


def native_jitter_ops(native: Kernels, npix: int) -> tuple[Op, ...]:
    """:data:`JITTER_OPS` as the C kernels in place (the contrast where its mean is exact)."""
    return (
        native.brightness_,
        native.contrast_ if npix <= cpu_kernels.CONTRAST_MAX_PIXELS else contrast,
        native.saturation_,
        native.hue_,
    )


# The colours whose floored luma depends on which of its two multiply-adds are fused (35 of the
# 2^24; tests/data/test_cpu_kernels.py finds them again): a random probe image would miss them.
LUMA_TELLTALES = (
    (10, 61, 186), (10, 93, 30), (20, 114, 36), (20, 152, 7), (20, 186, 60), (30, 63, 18), (40, 228, 72),
    (40, 244, 244), (40, 252, 80), (60, 126, 36), (70, 129, 161), (110, 111, 26), (120, 76, 180), (120, 114, 151),
    (120, 252, 72), (130, 255, 197), (140, 160, 81), (140, 236, 23), (140, 252, 195), (170, 61, 170), (190, 59, 84),
    (190, 137, 235), (190, 175, 206), (220, 222, 52), (230, 225, 177), (240, 222, 175), (250, 9, 228), (250, 17, 64),
    (250, 47, 199), (250, 55, 35), (250, 95, 215), (250, 117, 14), (250, 133, 186), (250, 171, 157), (250, 247, 99),
)  # fmt: skip


@functools.cache
def native_colour_is_torchs(native: Kernels) -> bool:
    """Whether the C brightness, contrast, saturation, grayscale, solarize and normalisation give
    this process's torch ops bit for bit. They assume what torch's vectorised CPU kernels do on
    x86 with FMA: a blend (``addcmul``) and each step of the luma (``add`` with ``alpha``) is one
    fused multiply-add, and ``mean`` divides the sum by the count. Checked once per process:
    the ops on a noise image of 37 x 41 pixels (its odd length takes torch's vector loop and its
    scalar tail; a blend rounded twice moves ~1/6 of its pixels) holding the
    :data:`LUMA_TELLTALES`, at 40 factors; and ``mean`` on 64 planes of chosen integer sums at two
    sizes (a multiplication by the reciprocal moves ~1/3 of such means). Where any differs, the
    torch ops run (the same views, slower)."""
    x = torch.randint(0, 256, (1, 3, 37, 41), generator=torch.Generator().manual_seed(0)).to(torch.float32)
    x.view(3, -1)[:, : len(LUMA_TELLTALES)] = torch.tensor(LUMA_TELLTALES, dtype=torch.float32).T
    drawn = torch.rand(35, generator=torch.Generator().manual_seed(1)) * 2
    factors = torch.cat([torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0]), drawn])
    for f in factors.view(-1, 1):
        for torch_op, c_op in zip(JITTER_OPS[:HUE], native_jitter_ops(native, 37 * 41)[:HUE]):
            if not torch.equal(c_op(x.clone(), f), torch_op(x, f)):
                return False
    for torch_op, c_op in ((grayscale, native.grayscale_), (solarize, native.solarize_)):
        if not torch.equal(c_op(x.clone()), torch_op(x)):
            return False
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    out = torch.empty_like(x)
    native.normalize(x, mean, std, out)
    return torch.equal(out, normalize(x.clone(), mean, std)) and _mean_divides(37 * 41) and _mean_divides(224 * 224)


def _mean_divides(npix: int) -> bool:
    """Whether torch's ``mean`` of integer planes of ``npix`` values is their sum divided by
    ``npix`` in float32, as the C contrast computes it, for 64 sums across the range."""
    sums = torch.linspace(0, 255 * npix, 64, dtype=torch.float64).round().to(torch.int64)
    planes = (sums[:, None] // npix + (torch.arange(npix) < sums[:, None] % npix)).to(torch.float32)
    got = planes.view(64, 1, 1, npix).mean(dim=(1, 2, 3))
    return torch.equal(got, sums.to(torch.float32) / torch.tensor(float(npix)))


# Slots of the sync-free colour step, in the order it runs them: the 4 positions of the jitter
# order (0-3), then grayscale, blur, solarize (4-6, drawn where these parameters are > 0). A
# view's op at a slot is -1 (none) or 0..3 (the jitter op at that position; 0 for the others).
DRAWN_OPS = ("grayscale", "blur_sigma", "solarize")
GRAY_SLOT, BLUR_SLOT, SOLARIZE_SLOT = 4, 5, 6


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which views each op of the sync-free colour step takes: ``views[:, s]`` (on the device)
    lists the batch's views sorted by their op at slot ``s`` (those with none first, then op 0,
    1, ...), ``counts[s][k + 1]`` (on the host) how many take op ``k`` there."""

    views: torch.Tensor
    counts: list[list[int]]

    def takers(self, slot: int, op: int) -> torch.Tensor | None:
        """The views that run op ``op`` at ``slot`` (``[m]`` indices), None where none does."""
        start, m = sum(self.counts[slot][: op + 1]), self.counts[slot][op + 1]
        return self.views[start : start + m, slot] if m else None


def _slot_ops(params: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """Each view's op at each slot, ``[n, 7]`` int64."""
    drawn = torch.stack([params[k].to(device) > 0 for k in DRAWN_OPS], 1)
    return torch.cat([params["jitter_order"].to(device, torch.int64), drawn.long() - 1], 1)


def plan_colour(batches: Sequence[dict[str, torch.Tensor]], device: torch.device) -> list[Plan]:
    """The :class:`Plan` of each batch of views (``params`` as :func:`colour`'s), with one host
    read for all of them: their op counts, the only value the sync-free path reads. Sorting the
    views by op runs on the device (a stable sort of small integers, no sync)."""
    ops = [_slot_ops(p, device) for p in batches]
    values = torch.arange(-1, len(JITTER_OPS), device=device)
    counts = torch.stack([(o[:, :, None] == values).sum(0) for o in ops]).tolist()  # the one host read
    return [Plan(o.argsort(dim=0, stable=True), c) for o, c in zip(ops, counts)]


def _colour_planned(x: torch.Tensor, params: dict[str, torch.Tensor], aug: ViewAug, plan: Plan) -> torch.Tensor:
    """The sync-free path: at each slot, each op runs once on the views that take it there
    (gathered into one contiguous batch by the plan, their results written back in place), in
    each view's own jitter order; views without an op at a slot are not touched by it."""
    x = x.to(torch.float32, copy=True)
    device = x.device

    def run(slot: int, op_idx: int, op: Callable[..., torch.Tensor], *keys: str) -> None:
        takers = plan.takers(slot, op_idx)
        if takers is not None:
            args = (params[k].to(device).index_select(0, takers) for k in keys)
            x.index_copy_(0, takers, op(x.index_select(0, takers), *args))

    for pos in range(4):  # each view's own order: at position pos, its op jitter_order[pos]
        for op_idx, key in enumerate(JITTER_KEYS):
            run(pos, op_idx, JITTER_OPS[op_idx], key)
    run(GRAY_SLOT, 0, grayscale)
    run(BLUR_SLOT, 0, lambda v, sigma: _blur(v, sigma, aug, sync_free=True), "blur_sigma")
    run(SOLARIZE_SLOT, 0, solarize)
    return x


def finish_views(
    views: Sequence[torch.Tensor],
    params: dict[str, torch.Tensor],
    augs: Sequence[ViewAug],
    sync_free: bool | None = None,
) -> list[torch.Tensor]:
    """Colour + normalise a loader batch: ``views`` are N uint8 ``[B, 3, S_i, S_i]`` (view i
    drawn from ``augs[i]``), ``params`` ``{name: [B, N, ...]}``. Views that share a size,
    blur and normalisation go through :func:`colour` together (``sync_free`` as there; on an
    accelerator each op runs once on all the group's views that take it, and one host read
    plans every group of the batch, :func:`plan_colour`). Returns N float ``[B, 3, S_i, S_i]``."""
    if len(views) != len(augs):
        raise ValueError(f"{len(views)} views in the batch but {len(augs)} view augmentations")
    groups: dict[tuple, list[int]] = {}
    for i, (v, a) in enumerate(zip(views, augs)):
        blur = (a.blur_kind, a.blur_kernel if a.blur_kind != "pil" else a.blur_sigma[1])
        groups.setdefault((tuple(v.shape[1:]), blur, a.mean, a.std), []).append(i)
    batches = [
        (idx, torch.cat([views[i] for i in idx]), {k: torch.cat([v[:, i] for i in idx]) for k, v in params.items()})
        for idx in groups.values()
    ]
    sync_free = _sync_free(views[0], sync_free)
    plans = plan_colour([p for _, _, p in batches], views[0].device) if sync_free else [None] * len(batches)
    out: list[torch.Tensor | None] = [None] * len(views)
    for (idx, x, p), plan in zip(batches, plans):
        aug = augs[idx[0]]  # what colour() reads of it (blur, normalisation) is the group's
        y = _colour_planned(x, p, aug, plan) if plan is not None else _colour_per_view(x, p, aug)
        y = normalize(y, aug.mean, aug.std)
        for i, part in zip(idx, y.chunk(len(idx))):
            out[i] = part
    return out  # type: ignore[return-value]


def finish_image_into(
    views: Sequence[torch.Tensor],
    params: dict[str, torch.Tensor],
    augs: Sequence[ViewAug],
    out: Sequence[torch.Tensor],
) -> None:
    """Colour + normalise one image's N uint8 views ``[3, S_i, S_i]`` on the CPU straight into
    ``out[i]`` (float32 ``[3, S_i, S_i]``: its rows of the batch a loader worker hands on, already
    in shared memory), ``params`` ``{name: [N, ...]}``. The pixels of :func:`finish_views`,
    without its per-group batch, the normalisation's second pass and the collate step's copy of
    every float view (:class:`.items.FinishedViews`)."""
    if not len(views) == len(augs) == len(out):
        raise ValueError(f"{len(views)} views, {len(augs)} view augmentations and {len(out)} outputs")
    native = cpu_kernels.kernels()
    in_c = native is not None and native_colour_is_torchs(native)
    for i, (x, aug, dst) in enumerate(zip(views, augs, out)):
        v = _colour_view(x[None], {k: p[i : i + 1] for k, p in params.items()}, aug, native)
        if in_c:
            native.normalize(v, aug.mean, aug.std, dst)  # type: ignore[union-attr]
        else:
            normalize(v[0], aug.mean, aug.std, out=dst)
