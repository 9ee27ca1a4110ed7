"""Hard View Pretraining: the whole selection algorithm, shared by every method.

One HVP step (docs/DESIGN.md sections 1-2): score every candidate combination with the
method's own per-sample loss in a pass that changes no state, choose per sample, gather the
chosen views, run the method's unchanged step on them. By concern:

* :class:`HVP` -- the settings (:mod:`.settings`; the ``hvp`` config group is derived from them);
* :mod:`.pairs` -- candidate pairs (:func:`pair_index`, :func:`global_pair_index`) and the
  gathers from a choice to views and their augmentation parameters;
* :mod:`.multicrop` -- DINO/iBOT: combinations of 2 globals + L locals, searched exactly
  (:func:`dino_combination_table`, :func:`dino_exact_selection`) or sampled;
* :mod:`.choice` -- :func:`choose` (hard / easy / random, never a non-finite entry) and the
  seeds of HVP's private generators;
* :mod:`.geometry` -- crop IoU of candidate pairs and ``hvp.mode=min_iou``'s choice by it;
* :mod:`.scale`, :mod:`.fraction` -- the cheaper selection passes ``hvp.selection_scale``
  (downscaled copies) and ``hvp.selection_fraction`` (a random part of the samples);
* :mod:`.forward_pass` -- the selection forward's precision and :func:`frozen_state`;
* :mod:`.mixin` -- :class:`HardViewMixin`, the select-then-train ``training_step``, and
  :class:`CandidateScores`, what a selection pass hands from ``candidate_scores`` to ``select_views``;
* :mod:`.totals` -- the run totals behind ``summary.json``'s ``hvp`` entry.

The per-sample losses and candidate tables themselves (network outputs -> loss values) live
in :mod:`hvp_lightning.losses`, which this package imports; the methods import both. Imports
only ``losses/``, ``nn/``, :mod:`hvp_lightning.declare` and torch and Lightning: no loader,
cluster, run or config code, so that a user's own
LightningModule with its own loader is a complete host (docs/DESIGN.md section 9 lists this,
tests/test_package.py checks it). What the host provides: docs/methods.md.
"""

from ..settings.hvp import GLOBAL_PAIRS, HVP, HVP_OFF, LOSS_MODES, MODES, PRECISIONS, hvp_settings, selection_side
from .choice import choose, stable_seed
from .forward_pass import (
    STEP_DTYPES,
    ambient_autocast_dtype,
    frozen_state,
    resolve_selection_dtype,
    step_autocast_dtype,
)
from .fraction import merge_samples, sample_subset, scored_count, scored_samples
from .geometry import crop_iou, least_overlap, least_overlapping_locals
from .mixin import CandidateScores, HardViewMixin
from .multicrop import (
    CombinationTable,
    DinoSelection,
    chosen_views_batch,
    dino_combination_table,
    dino_exact_selection,
    gather_combination_views,
)
from .pairs import gather_pair_params, gather_pairs, gather_view_params, global_pair_index, pair_index
from .scale import fit_mask, scale_views
from .totals import TOTALS, hvp_summary, summarise_totals

__all__ = [
    "GLOBAL_PAIRS",
    "MODES",
    "PRECISIONS",
    "STEP_DTYPES",
    "TOTALS",
    "CandidateScores",
    "CombinationTable",
    "DinoSelection",
    "HVP",
    "HVP_OFF",
    "HVPConfig",
    "LOSS_MODES",
    "HardViewMixin",
    "ambient_autocast_dtype",
    "choose",
    "crop_iou",
    "fit_mask",
    "least_overlap",
    "least_overlapping_locals",
    "merge_samples",
    "sample_subset",
    "scale_views",
    "scored_count",
    "scored_samples",
    "selection_side",
    "chosen_views_batch",
    "dino_combination_table",
    "dino_exact_selection",
    "frozen_state",
    "gather_combination_views",
    "gather_pair_params",
    "gather_pairs",
    "gather_view_params",
    "global_pair_index",
    "hvp_settings",
    "hvp_summary",
    "pair_index",
    "resolve_selection_dtype",
    "stable_seed",
    "step_autocast_dtype",
    "summarise_totals",
]

HVPConfig = HVP  # an alias: code that imports HVPConfig keeps working
