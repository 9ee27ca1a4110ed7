"""HVP's settings: :class:`HVP`, what a :class:`~hvp_lightning.selection.HardViewMixin` host runs
its selection with (``self.hvp``), declared once (the ``hvp`` config group is derived from it)."""

from __future__ import annotations

import math
from typing import Literal

from .declare import SettingError, Settings, declared, setting

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


@declared
class HVP(Settings):
    """Hard View Pretraining's settings: ``HVP(num_views=8, mode="random")``; the rest keep their
    defaults. ``HVP(enabled=False)`` (or no HVP at all) is the method as published: 2 views per image.

    Args:
        **keys: any of the keys below, each documented where it is declared.
    """

    enabled: bool = setting(True, "HVP on; false keeps the other keys but trains the baseline")
    num_views: int = setting(
        4, "candidate views per image N (>= 2); C(N,2) pairs are scored (the paper studies 4 and 8)", ge=2
    )
    mode: Literal[MODES] = setting(
        "hard",
        "hard = argmax loss (HVP); easy = argmin (the paper's cooperative ablation); random = uniform over the same "
        "candidates (the control); min_iou = the candidates whose crops overlap least, no selection forward (the "
        "geometry control)",
    )
    every_n_steps: int = setting(
        1, "select hard views every k-th optimiser step, plain steps between (paper Table 7)", ge=1
    )
    selection_precision: Literal[PRECISIONS] = setting(
        "auto",
        "precision of the selection forward: auto = the training step's (fp32 on CPU); fp32; bf16/fp16 autocast on GPU",
    )
    colour: Literal[HVP_COLOURS] = setting(
        "per_view",
        "per_view: each candidate its own colour draw; static: one per image, applied to the chosen pair after the "
        "selection saw the candidates uncoloured (paper section 6; pair methods)",
    )
    global_pairs: Literal[GLOBAL_PAIRS] = setting(
        "cross",
        "DINO/iBOT: global pairs scored: cross = one crop of each global pipeline (the official HVP code); all = "
        "every C(G,2) pair",
    )
    num_global_candidates: int | None = setting(None, "DINO/iBOT: G global candidates (null: num_views)", ge=2)
    num_local_candidates: int | None = setting(
        None, "DINO: Lc local candidates (null: ceil(L * num_views / 2)); iBOT selects globals only (null or L)", ge=0
    )
    max_combinations: int | Literal["auto"] | None = setting(
        "auto",
        "DINO: score K random (global pair, locals) combinations (null: the exact maximum; auto: the method's "
        "hvp_max_combinations, DINO's the paper's 128); not read by min_iou, which scores nothing",
        ge=1,
    )
    selection_scale: float = setting(
        1.0,
        "hard/easy: score the candidates on copies resized by this factor (antialiased; each side rounded half up to "
        "the backbone's multiple, a ViT's patch, at least its minimum); the chosen views train at full size. 1 = full "
        "size",
        gt=0,
        le=1,
    )
    selection_fraction: float = setting(
        1.0,
        "hard/easy: score a seeded random ceil(fraction * batch) of each micro-batch's samples (at least 2); the "
        "others train on their first candidates. 1 = every sample",
        gt=0,
        le=1,
    )

    def rules(self) -> None:
        """The cheaper selections make the loss table cheaper: only for the modes that read it
        (hard, easy). ``min_iou`` runs no selection forward, so it takes no selection precision
        either (``max_combinations`` is not read by it: DINO's default sets one)."""
        if not self.enabled or self.mode in ("hard", "easy"):
            return
        why = {
            "random": "a uniform choice does not read the losses, so a cheaper selection pass would change only "
            "the logs",
            "min_iou": "it chooses from the crop boxes, without a selection forward",
        }[self.mode]
        defaults: dict[str, object] = {"selection_scale": 1, "selection_fraction": 1}
        if self.mode == "min_iou":
            defaults["selection_precision"] = "auto"
        for key, default in defaults.items():
            if getattr(self, key) != default:
                raise SettingError(key, getattr(self, key), f"{default} with {{mode}}={self.mode} ({why})")

    @property
    def views_per_image(self) -> int:
        """Candidate views the data pipeline makes per image of a pair method (2 = baseline)."""
        return self.num_views if self.enabled else 2


HVP_OFF = HVP(enabled=False)


def hvp_settings(hvp: HVP | dict | None) -> HVP:
    """``hvp`` as :class:`HVP`: None is HVP off; a mapping (a checkpoint's hyperparameters) is read."""
    return HVP_OFF if hvp is None else HVP.from_dict(hvp)


def selection_side(side: int, scale: float, multiple: int = 1, minimum: int = 1) -> int:
    """The side a ``side`` px view has in the selection pass under ``hvp.selection_scale=scale``:
    ``side * scale`` rounded half up to a multiple of ``multiple``, at least ``max(multiple,
    minimum)``, never above ``side`` (the rule selection/scale.py applies and start-up checks a
    backbone against)."""
    rounded = multiple * math.floor(side * scale / multiple + 0.5)
    return min(side, max(rounded, multiple, minimum))
