"""iBOT's blockwise patch masks: shape, ratio, probability, reproducibility, a private generator."""

from __future__ import annotations

import random

import torch

from hvp_lightning.nn.masks import block_mask, ibot_masks


def test_block_masks() -> None:
    state = torch.get_rng_state()
    rng = random.Random(0)
    m = block_mask(14, 14, 0.4 * 196, rng)
    assert m.dtype == bool and m.shape == (14, 14) and 0 < m.sum() <= 0.4 * 196
    masks = ibot_masks(200, 14, 14, (0.1, 0.5), 0.5, 0.3, random.Random(1))
    ratio = masks.flatten(1).float().mean(1)
    assert masks.shape == (200, 14, 14) and masks.dtype == torch.bool
    assert 0.3 < (ratio > 0).float().mean() < 0.7  # about half the images are masked
    assert ratio.max() <= 0.5 and ratio[ratio > 0].mean() > 0.15
    assert torch.equal(masks, ibot_masks(200, 14, 14, (0.1, 0.5), 0.5, 0.3, random.Random(1)))  # reproducible
    assert not ibot_masks(5, 4, 4, (0.1, 0.5), 0.0, 0.3, random.Random(2)).any()
    assert ibot_masks(5, 4, 4, (0.5, 0.5), 1.0, 0.3, random.Random(2)).flatten(1).sum(1).min() > 0
    assert torch.equal(torch.get_rng_state(), state)  # a private generator only
