"""Counter-based randomness for the data pipeline: every random number of a view is a pure
function of (run seed, epoch, image index, view slot, draw number).

Nothing here has state. A view's key is a hash of its four counters (:func:`view_key`), and
its ``j``-th uniform is the ``j``-th output of splitmix64 started at that key
(:func:`key_uniform`). splitmix64 (Steele, Lea & Flood 2014; Java's ``SplittableRandom``)
is a 64-bit bijective mix of ``key + (j + 1) * golden``: random access by ``j``, so a view
draws only the numbers it uses, and every view and every draw has its own counter. The same
arithmetic runs on Python ints (loader workers: one view at a time, ~0.5 us a number) and on
int64 tensors on any device (images held there: whole batches; int64 multiplication wraps
modulo 2^64, and logical shifts are arithmetic ones masked), so both paths draw the same
numbers for the same view (tests/test_determinism.py checks that bit for bit).

Because no generator carries state from one image to the next, what a view looks like does not
depend on which process, worker, batch or rank drew it, nor on what was drawn before: a run
gives the same views with any ``data.num_workers``, on any layout, and after a resume at any
step (docs/DESIGN.md, "Randomness contract").
"""

from __future__ import annotations

import torch

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2^64 / golden ratio, odd
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
TO_UNIT = 2.0**-53  # the top 53 bits of a 64-bit word -> a double in [0, 1)


def mix64(z: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit words whose output bits all depend on
    every input bit."""
    z = ((z ^ (z >> 30)) * MIX1) & MASK
    z = ((z ^ (z >> 27)) * MIX2) & MASK
    return z ^ (z >> 31)


def view_key(seed: int, epoch: int, index: int, slot: int) -> int:
    """The 64-bit key of view ``slot`` of image ``index`` in ``epoch`` of the run seeded ``seed``."""
    z = 0
    for counter in (seed, epoch, index, slot):
        z = mix64((z + GOLDEN + counter) & MASK)
    return z


def key_uniform(key: int, j: int) -> float:
    """Uniform number ``j`` in [0, 1) of the view with ``key`` (53 random bits)."""
    return (mix64((key + (j + 1) * GOLDEN) & MASK) >> 11) * TO_UNIT


# --- the same on int64 tensors (two's complement: a 64-bit word is its int64 bit pattern) ---------
def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of 64-bit words held as int64 (torch's ``>>`` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64_tensor(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shr(z, 30)) * _signed(MIX1)
    z = (z ^ _shr(z, 27)) * _signed(MIX2)
    return z ^ _shr(z, 31)


def view_keys(seed: int, epoch: int, index: torch.Tensor, slots: int) -> torch.Tensor:
    """:func:`view_key` of views ``0 .. slots - 1`` of images ``index`` ``[n]``: int64 ``[n, slots]``
    on ``index``'s device (the bit patterns of the 64-bit keys)."""
    head = mix64((mix64((GOLDEN + seed) & MASK) + GOLDEN + epoch) & MASK)  # the seed and epoch part, once
    x = mix64_tensor(index.to(torch.int64) + _signed((head + GOLDEN) & MASK))
    slot = torch.arange(slots, dtype=torch.int64, device=index.device)
    return mix64_tensor(x[:, None] + _signed(GOLDEN) + slot)


def key_uniforms(keys: torch.Tensor, count: int) -> torch.Tensor:
    """Uniforms ``0 .. count - 1`` of every key: float64 ``[*keys.shape, count]`` (those of
    :func:`key_uniform`, exactly)."""
    j = torch.arange(1, count + 1, dtype=torch.int64, device=keys.device) * _signed(GOLDEN)
    bits = _shr(mix64_tensor(keys[..., None] + j), 11)
    return bits.to(torch.float64) * TO_UNIT


# --- retries of a view (rejection sampling, :mod:`.iou_policy`) -----------------------------------
def try_key(key: int, t: int) -> int:
    """The key of try ``t`` of the view with ``key``: try 0 is the view itself, try ``t > 0``
    appends a fifth counter to :func:`view_key`'s chain (seed, epoch, index, slot, try)."""
    return key if t == 0 else mix64((key + GOLDEN + t) & MASK)


def try_keys(keys: torch.Tensor, tries: torch.Tensor) -> torch.Tensor:
    """:func:`try_key` elementwise: int64 ``keys`` and ``tries`` broadcast together."""
    t = tries.to(device=keys.device, dtype=torch.int64)
    return torch.where(t == 0, keys, mix64_tensor(keys + _signed(GOLDEN) + t))
