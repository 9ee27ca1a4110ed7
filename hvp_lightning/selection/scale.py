"""``hvp.selection_scale``: the selection pass scores downscaled copies of the candidates.

The loader makes every candidate at full size, crop and colour drawn as always; the selection
pass sees each view resized by the scale (bilinear with antialiasing, torch's
``interpolate(..., antialias=True)``: an area-weighted downsample, not a subsample), and the
chosen views train at full size. Views of one size are resized together, one op per size (DINO:
one for the globals, one for the locals), on the views' device, with no host sync.

The side rule (:func:`selection_side`): ``side * scale`` rounded half up to a multiple of
``multiple``, at least ``max(multiple, minimum)``, never above ``side``. The host says the
multiple and minimum its backbone needs (``HardViewMixin.selection_size_rule``): a ViT's patch
(so the token grid is whole; the position embedding is interpolated to it, timm's
``dynamic_img_size``), a ResNet's smallest input (8 px with the CIFAR stem, else 32 px).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..settings.hvp import selection_side


def scale_views(views: list[torch.Tensor], scale: float, multiple: int = 1, minimum: int = 1) -> list[torch.Tensor]:
    """``views`` (``[B, C, H, W]`` each) resized for the selection pass, in their order; views of
    one size go through one batched resize. A view whose sides stay the same is passed on as is."""
    out: list[torch.Tensor | None] = [None] * len(views)
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, v in enumerate(views):
        by_size.setdefault(tuple(v.shape[-2:]), []).append(i)
    for (h, w), positions in by_size.items():
        size = (selection_side(h, scale, multiple, minimum), selection_side(w, scale, multiple, minimum))
        if size == (h, w):
            for i in positions:
                out[i] = views[i]
            continue
        stacked = torch.cat([views[i] for i in positions])
        resized = F.interpolate(stacked, size=size, mode="bilinear", antialias=True, align_corners=False)
        for i, r in zip(positions, resized.chunk(len(positions))):
            out[i] = r
    return out  # type: ignore[return-value]


def fit_mask(mask: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """A patch mask ``[B, h, w]`` on another patch grid: a patch of the new grid is masked where
    the patch of the old grid under its centre is (``nearest-exact``), so a block of the mask
    stays a block and its share of the grid is kept up to rounding. iBOT's masks are drawn on
    the full-size grid and travel with their views; the selection pass at
    ``hvp.selection_scale`` reads them on its smaller grid."""
    if tuple(mask.shape[-2:]) == tuple(grid):
        return mask
    return F.interpolate(mask[:, None].float(), size=grid, mode="nearest-exact")[:, 0] > 0.5
