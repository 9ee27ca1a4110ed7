"""Pair metrics of candidate views, computed from their sampled augmentation parameters.

The paper (section 6, appendix "fANOVA") explains HVP's choices with three pair metrics;
they are defined here once, vectorised over samples and candidate pairs, so the online
callback, the Parquet log and the offline analysis all agree:

* **IoU** of the two crop boxes, in source-image pixels (flip does not move a box;
  :func:`~hvp_lightning.selection.geometry.crop_iou`, shared with ``hvp.mode=min_iou``);
* **relative centre distance**: Euclidean distance of the two box centres divided by the
  source image's diagonal ``sqrt(src_w**2 + src_h**2)`` -- in ``[0, 1)``, comparable
  across image sizes and aspect ratios (the paper says only "normalised distance");
* **colour distance**: Euclidean distance of the colour-jitter factors
  ``(brightness, contrast, saturation, hue)``; a view without jitter has the identity
  factors ``(1, 1, 1, 0)``.

Every function takes the loader's parameter dict (``name -> [B, N]``, see
:data:`hvp_lightning.data.augment.PARAM_NAMES`) and a pair index ``[P, 2]`` (e.g.
:func:`hvp_lightning.selection.pair_index`) and returns ``[B, P]`` in pair-index order.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..selection.geometry import crop_iou

JITTER_NAMES = ("brightness", "contrast", "saturation", "hue")
JITTER_IDENTITY = (1.0, 1.0, 1.0, 0.0)
METRIC_NAMES = ("iou", "rel_dist", "color_dist")


def _pair(params: Mapping[str, torch.Tensor], name: str, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The parameter ``name`` of both views of every pair: two ``[B, P]`` float tensors."""
    p = params[name].float()
    idx = pairs.to(p.device)
    return p[:, idx[:, 0]], p[:, idx[:, 1]]


def relative_center_distance(params: Mapping[str, torch.Tensor], pairs: torch.Tensor) -> torch.Tensor:
    """Distance of the two box centres over the source image diagonal (``[0, 1)``)."""
    x1, x2 = _pair(params, "crop_x", pairs)
    y1, y2 = _pair(params, "crop_y", pairs)
    w1, w2 = _pair(params, "crop_w", pairs)
    h1, h2 = _pair(params, "crop_h", pairs)
    sw, _ = _pair(params, "src_w", pairs)
    sh, _ = _pair(params, "src_h", pairs)
    dx = (x1 + w1 / 2) - (x2 + w2 / 2)
    dy = (y1 + h1 / 2) - (y2 + h2 / 2)
    return torch.sqrt(dx**2 + dy**2) / torch.sqrt(sw**2 + sh**2).clamp(min=1e-12)


def jitter_factors(params: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Colour-jitter factors ``[B, N, 4]``, forced to the identity where ``jitter`` is 0, so a
    log that kept the raw sampled factors of a skipped jitter still measures correctly."""
    f = torch.stack([params[k].float() for k in JITTER_NAMES], dim=-1)
    if "jitter" not in params:
        return f
    ident = torch.tensor(JITTER_IDENTITY, dtype=f.dtype).to(f.device, non_blocking=True)  # no stream sync on a GPU
    return torch.where(params["jitter"].float()[..., None] > 0, f, ident)


def color_distance(params: Mapping[str, torch.Tensor], pairs: torch.Tensor) -> torch.Tensor:
    """Euclidean distance of the two views' ``(brightness, contrast, saturation, hue)``."""
    f = jitter_factors(params)
    idx = pairs.to(f.device)
    return (f[:, idx[:, 0]] - f[:, idx[:, 1]]).norm(dim=-1)


def jitter_differences(params: Mapping[str, torch.Tensor], pairs: torch.Tensor) -> dict[str, torch.Tensor]:
    """``|factor_k - factor_l|`` per jitter parameter: ``{"brightness_diff": [B, P], ...}``."""
    f = jitter_factors(params)
    idx = pairs.to(f.device)
    d = (f[:, idx[:, 0]] - f[:, idx[:, 1]]).abs()
    return {f"{name}_diff": d[..., i] for i, name in enumerate(JITTER_NAMES)}


def pair_metrics(params: Mapping[str, torch.Tensor], pairs: torch.Tensor) -> dict[str, torch.Tensor]:
    """All three pair metrics (:data:`METRIC_NAMES`), each ``[B, P]``."""
    return {
        "iou": crop_iou(params, pairs),
        "rel_dist": relative_center_distance(params, pairs),
        "color_dist": color_distance(params, pairs),
    }
