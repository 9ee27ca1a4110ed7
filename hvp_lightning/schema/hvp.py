"""``hvp``: Hard View Pretraining's keys (``+hvp=on``), the settings :class:`~hvp_lightning.selection.HardViewMixin` runs on."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from .base import COUNT, Section, integer, number

# The choices made from a table of the method's losses (a selection forward); ``min_iou`` is made
# from the crop boxes alone (no forward).
LOSS_MODES = ("hard", "easy", "random")
MODES = (*LOSS_MODES, "min_iou")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# Multi-crop methods: which pairs of global candidates are scored. ``cross`` pairs a crop of
# DINO's global pipeline 1 with one of pipeline 2 (the official HVP code); ``all`` = C(G,2).
GLOBAL_PAIRS = ("cross", "all")
# How candidates are coloured: each its own colour draw (per_view), or one per image, applied
# to the chosen pair after the selection pass saw the candidates uncoloured (static; paper section 6).
HVP_COLOURS = ("per_view", "static")


class HVPConfig(Section):
    """The ``hvp`` group, and the settings a :class:`~hvp_lightning.selection.HardViewMixin` host
    sets as ``self.hvp``. Without ``+hvp=on`` a run has no ``hvp`` node and HVP is off:
    ``HVPConfig(enabled=False)``, the method as published (2 views per image).

    Args:
        **keys: any of the keys below, each documented where it is declared; the rest keep their
            defaults (``HVPConfig(num_views=8, mode="random")``).
    """

    enabled: bool = True
    """HVP on (``+hvp=on`` sets it); false keeps the other keys but trains the baseline"""
    num_views: integer(2) = 4
    """candidate views per image N (>= 2); C(N,2) pairs are scored (the paper studies 4 and 8)"""
    mode: Literal[MODES] = "hard"
    """hard = argmax loss (HVP); easy = argmin (the paper's cooperative ablation); random = uniform over the same candidates (the control); min_iou = the candidates whose crops overlap least, no selection forward (the geometry control)"""
    every_n_steps: COUNT = 1
    """select hard views every k-th optimiser step, plain steps between (paper Table 7)"""
    selection_precision: Literal[PRECISIONS] = "auto"
    """precision of the selection forward: auto = the training step's (fp32 on CPU); fp32; bf16/fp16 autocast on GPU"""
    colour: Literal[HVP_COLOURS] = "per_view"
    """per_view: each candidate its own colour draw; static: one per image, applied to the chosen pair after the selection saw the candidates uncoloured (paper section 6; pair methods)"""
    global_pairs: Literal[GLOBAL_PAIRS] = "cross"
    """DINO/iBOT: global pairs scored: cross = one crop of each global pipeline (the official HVP code); all = every C(G,2) pair"""
    num_global_candidates: integer(2) | None = None
    """DINO/iBOT: G global candidates (null: num_views)"""
    num_local_candidates: integer(0) | None = None
    """DINO: Lc local candidates (null: ceil(L * num_views / 2)); iBOT selects globals only (null or L)"""
    max_combinations: integer(1) | None = Field(
        None, json_schema_extra={"compose": "${oc.select:method.hvp_max_combinations,null}"}
    )
    """DINO: score K random (global pair, locals) combinations (null: the exact maximum); default: the method's hvp_max_combinations (DINO: the paper's 128); not read by min_iou, which scores nothing"""
    selection_scale: number(0, 1, open_low=True) = 1.0
    """hard/easy: score the candidates on copies resized by this factor (antialiased; each side rounded half up to the backbone's multiple, a ViT's patch, at least its minimum); the chosen views train at full size. 1 = full size"""
    selection_fraction: number(0, 1, open_low=True) = 1.0
    """hard/easy: score a seeded random ceil(fraction * batch) of each micro-batch's samples (at least 2); the others train on their first candidates. 1 = every sample"""

    @property
    def views_per_image(self) -> int:
        """Candidate views the data pipeline must produce per image (2 = baseline)."""
        return self.num_views if self.enabled else 2


HVP_OFF = HVPConfig(enabled=False)


def selection_side(side: int, scale: float, multiple: int = 1, minimum: int = 1) -> int:
    """The side a ``side`` px view has in the selection pass under ``hvp.selection_scale=scale``:
    ``side * scale`` rounded half up to a multiple of ``multiple``, at least ``max(multiple,
    minimum)``, never above ``side`` (the rule selection/scale.py applies and start-up checks a
    backbone against)."""
    rounded = multiple * math.floor(side * scale / multiple + 0.5)
    return min(side, max(rounded, multiple, minimum))
