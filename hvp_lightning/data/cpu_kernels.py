"""Plain-C kernels for the CPU per-view colour path: the hue rotation, PIL's box blur and the
9 px blur's convolution, one pass over a view each instead of ~100 (hue) or dozens (blur) of
eager torch passes whose temporaries spill out of the cache (benchmarks/RESULTS.md, "A view's CPU
cost"), and the other jitter ops, grayscale, solarize and normalisation in place, one pass each.
They give the views the eager code gives, bit for bit:

* the hue does :func:`.batched.hue`'s float32 adds, multiplies, divisions and floors in its
  order, one rounding each: compiled with ``-ffp-contract=off -fno-fast-math`` nothing is fused
  or reordered, so IEEE arithmetic gives the same bits on any machine;
* PIL's blur is integer arithmetic (:func:`.batched.pil_blur_view`'s formula, Pillow's own);
* the 9 px convolution sums its taps as ``fmaf`` from zero, kernel rows outer, columns inner:
  the order of oneDNN's depthwise kernel that torch's ``conv2d`` runs on x86 with FMA (AVX2,
  AVX-512). Another torch build or CPU may sum otherwise, so :mod:`.batched` uses it only where
  it reproduces this process's ``conv2d`` sums on a probe image of the view's size;
* the jitter's blends and the luma are fused multiply-adds (``fmaf``) where torch's vectorised
  kernels fuse them (x86 with FMA); :func:`.batched.native_colour_is_torchs` checks that once per
  process, else the torch ops run.

The source is compiled at first use with the system C compiler (``cc``) into a shared object
under the user's cache directory, named by the hash of the source, flags and platform, and
written atomically (several processes or ranks may build it at once); later processes only load
it. On x86-64 with GCC each function is built for AVX-512, AVX2+FMA and baseline x86-64 and
picked at load by the CPU (``target_clones``), so one cached file serves every node sharing a
home directory. Loader workers never build it: :class:`.items.FinishedViews` builds it in the
main process before they start. Without a compiler, or if building or loading fails, the
colour path stays on its eager torch code (same views, only slower) after one log line.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.utils.data import get_worker_info

from ..run.atomic import atomic_write

log = logging.getLogger(__name__)

COMPILER = "cc"
BUILD_TIMEOUT_S = 120
# -fno-trapping-math lets the compiler vectorise the branch-free selects; it changes no value.
FLAGS = ("-O3", "-std=gnu99", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-fno-trapping-math")

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif
/* Helpers are inlined into each clone, so they get its instruction set too. */
#define INLINE static inline __attribute__((always_inline))

/* floor(x) for |x| < 2^31 from a truncation (vectorises without SSE4.1's roundps). */
INLINE float floor_small(float x) {
    float t = (float)(int32_t)x;
    return t > x ? t - 1.0f : t;
}

/* min + role * (mid - min) + (role == 2) * (max - 2 mid + min), role = clamp(2.5 - ||sector - at| - 3|, 0, 2) */
INLINE float place(float sector, float at, float above_min, float mn, float spread) {
    float a = fabsf(fabsf(sector - at) - 3.0f);
    float role = 2.5f - a;
    role = role < 0.0f ? 0.0f : role;
    role = role > 2.0f ? 2.0f : role;
    float top = role - 1.0f;
    top = top > 0.0f ? top : 0.0f;
    return (role * above_min + mn) + top * spread;
}

/* batched.hue on one image in place: its planes r, g, b (disjoint) of npix floats holding
   integers 0..255; each pixel is read whole before it is written. */
CLONES void hvp_hue(float *restrict rp, float *restrict gp, float *restrict bp, long npix, float shift) {
    const float k255 = (float)(1.0 / 255), k6 = (float)(1.0 / 6.0), tiny = 1e-30f;
    const float scale = (float)(255 + 1.0 - 1e-3);
    for (long i = 0; i < npix; i++) {
        float r = rp[i], g = gp[i], b = bp[i];
        float mx = r > g ? r : g;
        mx = mx > b ? mx : b;
        float mn = r < g ? r : g;
        mn = mn < b ? mn : b;
        float maxc = mx * k255;
        float rng = maxc - mn * k255;
        float s = rng / (maxc > tiny ? maxc : tiny);
        float div = rng > tiny ? rng : tiny;
        float rc = (maxc - r * k255) / div, gc = (maxc - g * k255) / div, bc = (maxc - b * k255) / div;
        float not_r = mx - r, not_g = mx - g;
        not_r = not_r < 1.0f ? not_r : 1.0f;
        not_g = not_g < 1.0f ? not_g : 1.0f;
        float h = (bc - gc) * (1.0f - not_r);
        h = h + ((rc + 2.0f) - bc) * ((1.0f - not_g) * not_r);
        h = h + ((gc + 4.0f) - rc) * (not_g * not_r);
        h = h * k6 + 1.0f;
        h = h - floor_small(h);
        h = h + shift;
        h = h - floor_small(h);
        float h6 = h * 6.0f;
        float sector = floor_small(h6);
        float f = h6 - sector;
        float sxf = s * f;
        float q = (1.0f - sxf) * maxc;
        float t = (sxf + (1.0f - s)) * maxc;
        float odd = sector - floor_small(sector * 0.5f) * 2.0f;
        float mid = floor_small((q * odd + t * (1.0f - odd)) * scale);
        float above_min = mid - mn;
        float spread = (mx - mn) - above_min * 2.0f;
        float o0 = place(sector, 2.5f, above_min, mn, spread), o1 = place(sector, 4.5f, above_min, mn, spread);
        rp[i] = o0;
        gp[i] = o1;
        bp[i] = ((mx + mid + mn) - o0) - o1;
    }
}

INLINE void box_out(const uint32_t *s, const uint32_t *f, uint8_t *dst, long n, uint32_t ww, uint32_t fw) {
    for (long i = 0; i < n; i++) dst[i] = (uint8_t)((s[i] * ww + f[i] * fw + (1u << 23)) >> 24);
}

INLINE long clamp_index(long i, long n) { return i < 0 ? 0 : i >= n ? n - 1 : i; }

/* One extended box pass along each of h rows of w pixels, the end pixels repeated. */
INLINE void rows_pass(const uint8_t *src, uint8_t *dst, long h, long w, long r, uint32_t ww, uint32_t fw,
                      uint8_t *line, uint32_t *s, uint32_t *f) {
    long e = r + 1;
    for (long y = 0; y < h; y++) {
        const uint8_t *in = src + y * w;
        for (long k = 0; k < e; k++) {
            line[k] = in[0];
            line[e + w + k] = in[w - 1];
        }
        for (long x = 0; x < w; x++) line[e + x] = in[x];
        for (long x = 0; x < w; x++) {
            s[x] = line[x + 1];
            f[x] = (uint32_t)line[x] + line[x + 2 * r + 2];
        }
        for (long t = 2; t <= 2 * r + 1; t++)
            for (long x = 0; x < w; x++) s[x] += line[x + t];
        box_out(s, f, dst + y * w, w, ww, fw);
    }
}

/* The same pass along the columns, a whole output row at a time. */
INLINE void cols_pass(const uint8_t *src, uint8_t *dst, long h, long w, long r, uint32_t ww, uint32_t fw,
                      uint32_t *s, uint32_t *f) {
    for (long y = 0; y < h; y++) {
        const uint8_t *lo = src + clamp_index(y - r - 1, h) * w, *hi = src + clamp_index(y + r + 1, h) * w;
        const uint8_t *first = src + clamp_index(y - r, h) * w;
        for (long x = 0; x < w; x++) {
            s[x] = first[x];
            f[x] = (uint32_t)lo[x] + hi[x];
        }
        for (long t = y - r + 1; t <= y + r; t++) {
            const uint8_t *row = src + clamp_index(t, h) * w;
            for (long x = 0; x < w; x++) s[x] += row[x];
        }
        box_out(s, f, dst + y * w, w, ww, fw);
    }
}

/* PIL's GaussianBlur of planes of h x w integers 0..255: three row passes, three column passes,
   each (ww * inner sum + fw * outer pair + 2^23) >> 24 (< 2^32), rounded to uint8 as PIL. */
CLONES int hvp_pil_blur(const float *x, float *out, long planes, long h, long w, long r, long ww, long fw) {
    long n = planes * h * w, m = w > h ? w : h;
    uint8_t *a = malloc(n), *b = malloc(n), *line = malloc(w + 2 * (r + 1));
    uint32_t *s = malloc(m * sizeof(uint32_t)), *f = malloc(m * sizeof(uint32_t));
    int ok = a && b && line && s && f;
    if (ok) {
        for (long i = 0; i < n; i++) a[i] = (uint8_t)(int32_t)x[i];
        for (long p = 0; p < planes; p++) {
            uint8_t *pa = a + p * h * w, *pb = b + p * h * w;
            rows_pass(pa, pb, h, w, r, ww, fw, line, s, f);
            rows_pass(pb, pa, h, w, r, ww, fw, line, s, f);
            rows_pass(pa, pb, h, w, r, ww, fw, line, s, f);
            cols_pass(pb, pa, h, w, r, ww, fw, s, f);
            cols_pass(pa, pb, h, w, r, ww, fw, s, f);
            cols_pass(pb, pa, h, w, r, ww, fw, s, f);
        }
        for (long i = 0; i < n; i++) out[i] = a[i];
    }
    free(a), free(b), free(line), free(s), free(f);
    return ok ? 0 : -1;
}

INLINE long reflect_index(long i, long n) { return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i; }

/* k x k convolution of planes of h x w (k / 2 < h, w) with reflect padding, unrounded: each
   sum fmaf(w, x, acc) from 0, kernel rows outer, columns inner. */
CLONES int hvp_conv_reflect(const float *x, float *out, long planes, long h, long w, const float *wk, long k) {
    long p = k / 2, pw = w + 2 * p, ph = h + 2 * p;
    float *pad = malloc(ph * pw * sizeof(float)), *acc = malloc(w * sizeof(float));
    int ok = pad && acc;
    for (long c = 0; ok && c < planes; c++) {
        const float *src = x + c * h * w;
        for (long y = 0; y < ph; y++) {
            const float *row = src + reflect_index(y - p, h) * w;
            float *dst = pad + y * pw;
            for (long j = 0; j < p; j++) {
                dst[j] = row[p - j];
                dst[p + w + j] = row[w - 2 - j];
            }
            for (long j = 0; j < w; j++) dst[p + j] = row[j];
        }
        float *o = out + c * h * w;
        for (long y = 0; y < h; y++) {
            for (long j = 0; j < w; j++) acc[j] = 0.0f;
            for (long u = 0; u < k; u++)
                for (long v = 0; v < k; v++) {
                    const float wt = wk[u * k + v], *row = pad + (y + u) * pw + v;
                    for (long j = 0; j < w; j++) acc[j] = fmaf(wt, row[j], acc[j]);
                }
            for (long j = 0; j < w; j++) o[y * w + j] = acc[j];
        }
    }
    free(pad), free(acc);
    return ok ? 0 : -1;
}

/* The jitter's other ops, grayscale, solarize and normalisation on one image (planes r, g, b of
   npix floats holding integers 0..255), in place, as batched.py's torch ops compute them here:
   products and sums of float32 rounded once each; torch's add with alpha and its addcmul as
   one fused multiply-add (fmaf), which is what its vectorised CPU kernels do on x86 with FMA.
   batched.native_colour_is_torchs checks that against this process's torch before use. */
INLINE float trunc255(float v) {
    v = v < 0.0f ? 0.0f : v;
    v = v > 255.0f ? 255.0f : v;
    return floorf(v); /* not floor_small: its int conversion after the clamps stops GCC 12 vectorising */
}

/* floor(r * 0.2989 + g * 0.587 + b * 0.114), torchvision's weights and order (batched._luma). */
INLINE float luma_floor(float r, float g, float b) {
    return floorf(fmaf(b, 0.114f, fmaf(g, 0.587f, r * 0.2989f)));
}

/* batched._blend: x * f + other * (1 - f), truncated to 0..255. */
INLINE float blend(float x, float other, float f, float omf) { return trunc255(fmaf(other, omf, x * f)); }

CLONES void hvp_brightness(float *x, long n, float f) {
    for (long i = 0; i < n; i++) x[i] = trunc255(x[i] * f);
}

/* The mean of the floored luma is its integer sum over npix (exact in float32 too while
   npix * 255 < 2^24: the caller's condition) divided by npix in float32, as torch's mean. */
CLONES void hvp_contrast(float *x, long npix, float f) {
    const float *r = x, *g = x + npix, *b = x + 2 * npix;
    int32_t sum = 0; /* < 2^24 */
    for (long i = 0; i < npix; i++) sum += (int32_t)luma_floor(r[i], g[i], b[i]);
    const float mean = (float)sum / (float)npix, omf = 1.0f - f;
    for (long i = 0; i < 3 * npix; i++) x[i] = blend(x[i], mean, f, omf);
}

CLONES void hvp_saturation(float *x, long npix, float f) {
    float *restrict r = x, *restrict g = x + npix, *restrict b = x + 2 * npix; /* disjoint planes */
    const float omf = 1.0f - f;
    for (long i = 0; i < npix; i++) {
        float l = luma_floor(r[i], g[i], b[i]);
        r[i] = blend(r[i], l, f, omf);
        g[i] = blend(g[i], l, f, omf);
        b[i] = blend(b[i], l, f, omf);
    }
}

CLONES void hvp_grayscale(float *x, long npix) {
    float *restrict r = x, *restrict g = x + npix, *restrict b = x + 2 * npix;
    for (long i = 0; i < npix; i++) r[i] = g[i] = b[i] = luma_floor(r[i], g[i], b[i]);
}

CLONES void hvp_solarize(float *x, long n) {
    for (long i = 0; i < n; i++) x[i] = x[i] >= 128.0f ? 255.0f - x[i] : x[i];
}

/* augment.normalize: x * scale_c, then minus shift_c, two float32 roundings (not fused). */
CLONES void hvp_normalize(const float *x, float *out, long npix, float s0, float s1, float s2, float h0, float h1,
                          float h2) {
    const float scale[3] = {s0, s1, s2}, shift[3] = {h0, h1, h2};
    for (long c = 0; c < 3; c++) {
        const float *src = x + c * npix;
        float *dst = out + c * npix;
        for (long i = 0; i < npix; i++) {
            float v = src[i] * scale[c];
            dst[i] = v - shift[c];
        }
    }
}

/* batched.pil_box for one sigma: Pillow's _gaussian_blur_radius and box weights, its float32
   and float64 steps in its order. */
void hvp_pil_box(float sigma, long *box) {
    float sigma2 = sigma * sigma / 3.0f;
    float big_l = (float)sqrt((double)sigma2 * 12.0 + 1.0);
    float small_l = (float)floor(((double)big_l - 1.0) * 0.5);
    float a = (small_l * 2.0f + 1.0f) * (small_l * (small_l + 1.0f) - sigma2 * 3.0f);
    a = a / ((sigma2 - (small_l + 1.0f) * (small_l + 1.0f)) * 6.0f);
    float radius = small_l + a;
    long r = (long)radius, ww = (long)(16777216.0f / (radius * 2.0f + 1.0f));
    box[0] = r, box[1] = ww, box[2] = (16777216L - (2 * r + 1) * ww) / 2;
}
"""


class Kernels:
    """The loaded library's functions on contiguous CPU float32 tensors ``[n, C, H, W]`` (the
    jitter's other ops, grayscale, solarize and normalisation: one image ``[1, 3, H, W]``, in place)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        ptr, long, flt = ctypes.c_void_p, ctypes.c_long, ctypes.c_float
        self._hue, self._pil_blur, self._conv = lib.hvp_hue, lib.hvp_pil_blur, lib.hvp_conv_reflect
        self._hue.argtypes, self._hue.restype = [ptr, ptr, ptr, long, flt], None
        self._pil_blur.argtypes, self._pil_blur.restype = [ptr, ptr, long, long, long, long, long, long], ctypes.c_int
        self._conv.argtypes, self._conv.restype = [ptr, ptr, long, long, long, ptr, long], ctypes.c_int
        self._pointwise = {name: getattr(lib, f"hvp_{name}") for name in ("brightness", "contrast", "saturation")}
        for fn in self._pointwise.values():
            fn.argtypes, fn.restype = [ptr, long, flt], None
        self._grayscale, self._solarize = lib.hvp_grayscale, lib.hvp_solarize
        for fn in (self._grayscale, self._solarize):
            fn.argtypes, fn.restype = [ptr, long], None
        self._normalize = lib.hvp_normalize
        self._normalize.argtypes, self._normalize.restype = [ptr, ptr, long, *[flt] * 6], None
        self._pil_box = lib.hvp_pil_box
        self._pil_box.argtypes, self._pil_box.restype = [flt, ctypes.POINTER(long)], None

    def hue_(self, x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """:func:`.batched.hue` of one image in place (``shift``: its one shift, turns), the same bits."""
        r, g, b = _image(x)[0]
        self._hue(r.data_ptr(), g.data_ptr(), b.data_ptr(), r.numel(), float(shift))
        return x

    def brightness_(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """:func:`.batched.brightness` of one image in place (``f``: its one factor)."""
        self._pointwise["brightness"](_image(x).data_ptr(), x.numel(), float(f))
        return x

    def contrast_(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """:func:`.batched.contrast` of one image in place; its mean is exact below 2^24 / 255
        pixels (:data:`CONTRAST_MAX_PIXELS`), where the caller uses it."""
        if x.shape[2] * x.shape[3] > CONTRAST_MAX_PIXELS:
            raise ValueError(f"the C contrast takes at most {CONTRAST_MAX_PIXELS} pixels, got {tuple(x.shape)}")
        self._pointwise["contrast"](_image(x).data_ptr(), x.shape[2] * x.shape[3], float(f))
        return x

    def saturation_(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """:func:`.batched.saturation` of one image in place."""
        self._pointwise["saturation"](_image(x).data_ptr(), x.shape[2] * x.shape[3], float(f))
        return x

    def grayscale_(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`.batched.grayscale` of one image in place."""
        self._grayscale(_image(x).data_ptr(), x.shape[2] * x.shape[3])
        return x

    def solarize_(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`.batched.solarize` of one image in place."""
        self._solarize(_image(x).data_ptr(), x.numel())
        return x

    def normalize(self, x: torch.Tensor, mean: Sequence[float], std: Sequence[float], out: torch.Tensor) -> None:
        """:func:`.augment.normalize` of one image into ``out`` (contiguous CPU float32, its size): its
        scales ``1 / (255 s)`` and shifts ``m / s`` rounded to float32 as torch does with them."""
        fits = out.is_contiguous() and out.dtype == torch.float32 and out.numel() == x.numel()
        if not (fits and out.device.type == "cpu"):
            raise ValueError(
                f"normalize writes into a contiguous CPU float32 tensor of {x.numel()} values, got {out.dtype} "
                f"{tuple(out.shape)} on {out.device} (contiguous: {out.is_contiguous()})"
            )
        scales = [1 / (255 * s) for s in std]
        shifts = [m / s for m, s in zip(mean, std)]
        self._normalize(_image(x).data_ptr(), out.data_ptr(), x.shape[2] * x.shape[3], *scales, *shifts)

    def pil_box(self, sigma: float) -> tuple[int, int, int]:
        """:func:`.batched.pil_box` of one sigma, on the host: ``(r, ww, fw)``."""
        box = (ctypes.c_long * 3)()
        self._pil_box(sigma, box)
        return box[0], box[1], box[2]

    def pil_blur(self, x: torch.Tensor, r: int, ww: int, fw: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`.batched.pil_blur_view` with PIL's box ``r, ww, fw`` (:meth:`pil_box`); ``out``
        may be ``x`` (the image is read whole first)."""
        x = _checked(x)
        out = torch.empty_like(x) if out is None else _image(out)
        n, c, h, w = x.shape
        if self._pil_blur(x.data_ptr(), out.data_ptr(), n * c, h, w, r, ww, fw):
            raise MemoryError("hvp_pil_blur: out of memory")
        return out

    def conv_reflect(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``conv2d`` of every plane with one ``[k, k]`` kernel after reflect padding by ``k // 2``,
        unrounded, summed in oneDNN's order (module docstring); ``out`` may be ``x`` (each plane
        is padded into a buffer of its own first)."""
        x, weight = _checked(x), weight.to(torch.float32).contiguous()
        n, c, h, w = x.shape
        k = weight.shape[-1]
        if k // 2 >= min(h, w):
            raise ValueError(f"a {k} px kernel's reflect padding needs images over {k // 2} px, got {h}x{w}")
        out = torch.empty_like(x) if out is None else _image(out)
        if self._conv(x.data_ptr(), out.data_ptr(), n * c, h, w, weight.data_ptr(), k):
            raise MemoryError("hvp_conv_reflect: out of memory")
        return out


CONTRAST_MAX_PIXELS = (2**24 - 1) // 255  # floored luma sums up to 255 per pixel stay exact in float32


def _image(x: torch.Tensor) -> torch.Tensor:
    """``x`` must be one contiguous CPU float32 image ``[1, 3, H, W]`` (the in-place kernels)."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.shape[:2] != (1, 3) or not x.is_contiguous():
        raise ValueError(
            f"in-place C kernels take one contiguous CPU float32 [1, 3, H, W] image, got {x.dtype} {tuple(x.shape)} "
            f"on {x.device} (contiguous: {x.is_contiguous()})"
        )
    return x


def _checked(x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 4:
        raise ValueError(
            f"C kernels take CPU float32 [n, C, H, W] images, got {x.dtype} {tuple(x.shape)} on {x.device}"
        )
    return x.contiguous()


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/hvp_lightning``, else ``~/.cache/hvp_lightning``: per user."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvp_lightning"


def library_path() -> Path:
    """Where this source's shared object lives: one file per source, flags and platform."""
    key = "\0".join((SOURCE, *FLAGS, platform.machine(), sys.platform))
    return cache_dir() / f"cpu_kernels-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def build(path: Path) -> None:
    """Compile :data:`SOURCE` into ``path`` (atomically: readers see no file or the whole one).
    Raises ``FileNotFoundError`` without a compiler, ``RuntimeError`` with its message if it fails
    or takes over :data:`BUILD_TIMEOUT_S`."""
    cc = shutil.which(COMPILER)
    if cc is None:
        raise FileNotFoundError(f"no C compiler ({COMPILER!r}) on PATH")
    with tempfile.TemporaryDirectory(prefix="hvp-cpu-kernels-") as tmp:
        src, lib = Path(tmp) / "cpu_kernels.c", Path(tmp) / "cpu_kernels.so"
        src.write_text(SOURCE)
        try:  # a compile takes ~1-5 s; a compiler that hangs (a stale NFS lock, a licence server) is given up
            done = subprocess.run(
                [cc, *FLAGS, "-o", str(lib), str(src), "-lm"], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as err:
            raise RuntimeError(f"{COMPILER} did not finish within {BUILD_TIMEOUT_S} s") from err
        if done.returncode != 0:
            raise RuntimeError(f"{COMPILER} failed: {(done.stderr or done.stdout).strip()[-500:]}")
        atomic_write(path, lambda f: f.write(lib.read_bytes()))


@functools.cache
def kernels() -> Kernels | None:
    """The C kernels, built on first use (never in a loader worker: there a missing library means
    the main process could not build it and has said why) and loaded once per process; ``None``
    where they cannot be had: the caller then runs its eager torch code."""
    path = library_path()
    try:
        if not path.exists():
            if get_worker_info() is not None:
                return None
            build(path)
        return Kernels(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError, AttributeError) as err:
        log.warning(
            "hvp_lightning: the CPU colour step's C kernels are not available (%s): it runs its torch code, "
            "the same views, only slower",
            err,
        )
        return None
