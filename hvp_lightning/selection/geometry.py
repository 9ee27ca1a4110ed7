"""Where the candidate crops lie, and ``hvp.mode=min_iou``: the candidates whose crops overlap
least, chosen from the augmentation parameters alone, without a selection forward.

The crop boxes are the loader's recorded parameters (``batch["params"]``: ``crop_x``,
``crop_y``, ``crop_w``, ``crop_h``, each ``[B, N]``, in source-image pixels; a flip does not
move a box). :func:`crop_iou` is the one IoU of the package: the analysis
(:mod:`hvp_lightning.analysis.metrics`) uses it too, so "the lowest-IoU pair" means the same in
both. Ties are broken towards the lower column / candidate index, on every device (a stable
sort), so that the choice is a function of the parameters alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

CROP_KEYS = ("crop_x", "crop_y", "crop_w", "crop_h")


def crop_iou(params: Mapping[str, torch.Tensor], pairs: torch.Tensor) -> torch.Tensor:
    """Intersection over union of the crop boxes ``(crop_x, crop_y, crop_w, crop_h)`` of every
    view pair: ``params`` ``{name: [B, N]}``, ``pairs`` ``[P, 2]`` view positions -> float ``[B, P]``
    in ``pairs`` order, on the parameters' device."""
    x, y, w, h = (params[k].float() for k in CROP_KEYS)
    idx = pairs.to(x.device)
    a, b = idx[:, 0], idx[:, 1]
    iw = (torch.minimum(x[:, a] + w[:, a], x[:, b] + w[:, b]) - torch.maximum(x[:, a], x[:, b])).clamp(min=0)
    ih = (torch.minimum(y[:, a] + h[:, a], y[:, b] + h[:, b]) - torch.maximum(y[:, a], y[:, b])).clamp(min=0)
    inter = iw * ih
    union = w[:, a] * h[:, a] + w[:, b] * h[:, b] - inter
    return inter / union.clamp(min=1e-12)


def least_overlap(iou: torch.Tensor) -> torch.Tensor:
    """Per sample, the column of least IoU, the lowest such column on ties: ``[B, C]`` -> int64 ``[B]``."""
    return iou.argsort(dim=1, stable=True)[:, 0]


def least_overlapping_locals(
    params: Mapping[str, torch.Tensor], num_globals: int, pairs: torch.Tensor, num_local: int
) -> torch.Tensor:
    """DINO under ``min_iou``: for each global pair, the ``num_local`` local candidates that
    overlap its two globals least, by ``IoU(g1, j) + IoU(g2, j)`` (the geometric counterpart of
    HVP's local term ``CE(g1->j) + CE(g2->j)``), ascending, the lower index first on ties.

    Args:
        params: The loader's parameters, ``[B, G + Lc]`` each (globals first).
        num_globals: G.
        pairs: Global pairs ``[P, 2]`` (:func:`~hvp_lightning.selection.global_pair_index`).
        num_local: L, the locals kept (``0 <= L <= Lc``).

    Returns:
        int64 ``[B, P, L]``: indices into the Lc local candidates, on the parameters' device.
    """
    x = params["crop_x"]
    lc = x.shape[1] - num_globals
    glob = torch.arange(num_globals, device=x.device)
    loc = torch.arange(num_globals, num_globals + lc, device=x.device)
    to_local = crop_iou(params, torch.cartesian_prod(glob, loc)).unflatten(1, (num_globals, lc))  # [B, G, Lc]
    idx = pairs.to(x.device)
    terms = to_local[:, idx[:, 0]] + to_local[:, idx[:, 1]]  # [B, P, Lc]
    return terms.argsort(dim=-1, stable=True)[..., :num_local]
