"""HVP's static colour (paper section 6, "Taking a closer look at the IoU"): one colour
augmentation per image, shared by all its candidates, applied only after the hardest pair is
chosen.

With ``hvp.colour=static`` the data module leaves the training views as uint8 crops
(``SSLDataModule(defer_colour=True)``); the training step (``HardViewMixin``, through the
host hooks :class:`~hvp_lightning.methods.base.SSLMethod` implements with this module) then

1. gives every candidate of an image the colour parameters of its view 0 (:func:`share_colour`;
   view 0's are drawn from its own key, so they stay a function of (seed, epoch, image, slot)),
2. scores the candidates uncoloured (crops normalised only, :func:`uncoloured`), as the
   paper's selection saw them,
3. colours and normalises the chosen pair with that one colour draw (:func:`coloured`).

Which parameters count as colour: the whole photometric step (jitter and its order, grayscale,
blur, solarize), everything applied after the crop and flip. Pair methods only (DINO/iBOT's
two global pipelines differ in blur and solarize).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .augment import ViewAug, normalize
from .batched import finish_views

COLOUR_KEYS = (
    "jitter",
    "brightness",
    "contrast",
    "saturation",
    "hue",
    "jitter_order",
    "grayscale",
    "blur_sigma",
    "solarize",
)


def share_colour(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``params`` ``{name: [B, N, ...]}`` with every view's colour parameters replaced by view 0's."""
    return {k: v[:, :1].expand_as(v).clone() if k in COLOUR_KEYS else v for k, v in params.items()}


def uncoloured(views: Sequence[torch.Tensor], aug: ViewAug) -> list[torch.Tensor]:
    """uint8 crops ``[B, 3, S, S]`` normalised without any colour op: what the selection scores."""
    if views[0].dtype != torch.uint8:
        raise ValueError("hvp.colour=static needs uint8 views: build SSLDataModule with defer_colour=True")
    return [normalize(v, aug.mean, aug.std) for v in views]


def coloured(views: Sequence[torch.Tensor], params: dict[str, torch.Tensor], aug: ViewAug) -> list[torch.Tensor]:
    """The chosen uint8 views coloured with their (shared) parameters and normalised."""
    return finish_views(views, params, (aug,) * len(views))
