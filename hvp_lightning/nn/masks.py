"""iBOT's blockwise patch masks (BEiT's "block" prediction shape), drawn on the host from a
private ``random.Random`` so they never touch torch's global RNG (the loader's views)."""

from __future__ import annotations

import math
import random

import numpy as np
import torch


def block_mask(
    h: int, w: int, num_masked: float, rng: random.Random, min_aspect: float = 0.3, attempts: int = 10
) -> np.ndarray:
    """Bool ``[h, w]`` patch mask of about ``num_masked`` patches made of random rectangles.

    BEiT's rule, as iBOT's loader uses it: repeatedly draw a block of area
    ``U((min(h, w) // 3)**2, remaining)`` and aspect ratio log-uniform in
    ``[min_aspect, 1/min_aspect]``, strictly smaller than the grid, at a uniform position;
    keep it if it adds between 1 and ``remaining`` new patches (up to ``attempts`` draws),
    and stop when the target is met or no draw fits. Python ``random`` on a private
    generator: cheap per draw and never touches torch's global RNG."""
    mask = np.zeros((h, w), dtype=bool)
    log_lo, log_hi = math.log(min_aspect), -math.log(min_aspect)
    min_area = (min(h, w) // 3) ** 2
    count = 0
    while count < num_masked:
        budget = num_masked - count
        added = 0
        for _ in range(attempts):
            area = rng.uniform(min_area, budget)
            aspect = math.exp(rng.uniform(log_lo, log_hi))
            bh, bw = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if bh >= h or bw >= w:
                continue
            top, left = rng.randint(0, h - bh), rng.randint(0, w - bw)
            block = mask[top : top + bh, left : left + bw]
            new = bh * bw - int(block.sum())
            if 0 < new <= budget:
                block[...] = True
                added = new
                break
        if added == 0:
            break
        count += added
    return mask


def ibot_masks(
    n: int, h: int, w: int, ratio: tuple[float, float], prob: float, min_aspect: float, rng: random.Random
) -> torch.Tensor:
    """``n`` independent masks ``[n, h, w]``: each image is masked with probability ``prob``,
    at a ratio ``U(ratio)`` of its patches, else not at all. iBOT's ViT recipe
    (``pred_ratio 0 0.3``, ``pred_ratio_var 0 0.2``) is ``prob=0.5``, ``ratio=(0.1, 0.5)``."""
    out = []
    for _ in range(n):
        r = rng.uniform(*ratio) if rng.random() < prob else 0.0
        out.append(block_mask(h, w, r * h * w, rng, min_aspect))
    return torch.from_numpy(np.stack(out)) if out else torch.zeros(0, h, w, dtype=torch.bool)
