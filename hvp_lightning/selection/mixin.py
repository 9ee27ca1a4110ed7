"""The HVP training step: :class:`HardViewMixin`, shared by every method.

A LightningModule that mixes it in supplies the hooks of :class:`HardViewMixin` (the whole
list of what a host provides: docs/methods.md, "What a host provides"):

* ``candidate_scores(batch)``: the method's own per-sample loss for every candidate
  combination ``c`` (pairs for SimSiam/SimCLR, crop sets for DINO/iBOT), ``[B, C]``, computed
  from a forward over all candidate views -- or :class:`CandidateScores`, the table with what
  ``select_views`` needs of the same pass. The mixin runs it without gradients, with
  BatchNorm running statistics frozen and RNG streams restored afterwards;
* ``select_views(batch, choice, context)``: the ordinary 2-view (or multi-crop) batch made of
  each sample's chosen combination (pair methods get this for free);
* ``ssl_step(batch, batch_idx) -> loss``: the method's unchanged training step;
* with ``hvp.colour=static`` only, ``uncoloured_candidates(batch)`` and ``colour_views(batch)``:
  the host's data pipeline knows what colour is;
* optional: ``candidate_overlap(batch)`` (``hvp.mode=min_iou``; the default serves pair methods),
  ``selection_size_rule()`` (``hvp.selection_scale``) and ``hvp_sample_keys``
  (``hvp.selection_fraction``).

The cheaper selections (docs/DESIGN.md section 5): ``hvp.selection_scale`` scores downscaled
copies of the candidates (:mod:`.scale`), ``hvp.selection_fraction`` scores a random part of
the samples (:mod:`.fraction`), ``hvp.mode=min_iou`` scores nothing and takes the least
overlapping crops (:mod:`.geometry`).

With HVP off, ``training_step`` is exactly ``ssl_step``: the mixin adds nothing.

Gradient accumulation: ``hvp.every_n_steps`` counts optimiser steps (Lightning's
``global_step``), so the k micro-batches of one optimiser step either all select hard views
or all train on plain ones -- the accumulated step is the same kind of step as one big batch.
Random draws (``random`` mode, DINO's sampled locals, iBOT's masks, the scored samples of
``selection_fraction``) are seeded by
(seed, global_step, micro-batch index, rank), so the micro-batches of one step draw differently.

The mixin reads nothing of its host but ``self.hvp``, the hooks and LightningModule's own
members (ranks and gathers through Lightning's ``trainer.world_size`` and ``all_gather``), and
nothing of a batch but ``views`` (and ``params``, which travel with their views): a user's own
module with its own loader is a complete host.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple

import lightning as L
import torch
from torch.profiler import record_function

from ..settings.hvp import HVP
from .choice import choose, stable_seed
from .forward_pass import ambient_autocast_dtype, frozen_state, outputs_reusable, resolve_selection_dtype
from .fraction import merge_samples, sample_subset, scored_samples
from .geometry import CROP_KEYS, crop_iou, least_overlap
from .pairs import gather_pair_params, gather_pairs, pair_index
from .scale import scale_views
from .totals import TOTALS, add_totals, rank_totals


class CandidateScores(NamedTuple):
    """What a selection pass found: the table the choice is made on, and what the host's
    ``select_views`` needs of the same pass to turn a chosen column into views (DINO: each
    column's global pair and locals, and the teacher outputs the step may reuse). A host whose
    columns say everything (pair methods: column c is pair c) returns the bare table.

    Args:
        table: Per-sample loss of every candidate combination, ``(B, C)``.
        context: Handed unchanged to ``select_views`` (None: nothing).
    """

    table: torch.Tensor
    context: Any = None


class HardViewMixin(L.LightningModule):
    """Overrides ``training_step`` with HVP's select-then-train step (see module docstring).

    Put it before the host's LightningModule base: ``class SimSiam(HardViewMixin, SSLMethod)``.
    The host sets ``self.hvp`` (an :class:`~hvp_lightning.selection.HVP`) in ``__init__`` and provides the hooks
    below. What the mixin needs of the host beyond them is LightningModule's own
    (``global_step``, ``global_rank``, ``device``, ``log``, ``trainer``, ``all_gather``), hence
    that base: a type checker sees every member the mixin uses, and a host written ``class
    Mine(HardViewMixin, L.LightningModule)`` keeps working.

    Host contract (B samples, N candidate views, C candidate combinations); a batch is a dict
    whose ``views`` is a list of ``(B, ...)`` tensors (the mixin reads nothing else of it):

    - ``candidate_scores(batch) -> (B, C)`` or :class:`CandidateScores`: per-sample loss of every
      candidate, from a forward over all candidates; runs inside :func:`frozen_state` (no
      gradient, no state change).
    - ``ssl_step(batch, batch_idx) -> ()``: the method's unchanged step on the chosen batch,
      returning the scalar loss.
    - ``select_views(batch, choice, context) -> batch``: ``choice`` is int64 ``(B,)`` (a column of
      the table), ``context`` what ``candidate_scores`` handed back beside the table (None on
      steps without a selection pass, whose ``choice`` is column 0); returns an ordinary batch
      of the chosen views. The default serves pair methods whose ``batch["views"]`` holds the N
      candidates: it returns two, plus the chosen ``batch["params"]`` (augmentation
      parameters, ``(B, N, ...)`` each) if present.
    - ``hvp.colour=static`` only: ``uncoloured_candidates(batch) -> batch`` (what the selection
      scores: the loader's crops, colour-free, every candidate of an image sharing one colour
      draw) and ``colour_views(batch) -> batch`` (the chosen crops coloured with that draw).

    - optional, ``candidate_overlap(batch) -> (B, C)`` or :class:`CandidateScores`
      (``hvp.mode=min_iou``): the crop IoU of every column's views, whose least entry is chosen;
      the default serves pair methods (column c = pair c, from ``batch["params"]``' crop boxes).
    - optional, ``selection_size_rule() -> (multiple, minimum)`` (``hvp.selection_scale``): what
      a view's side in the selection pass is rounded to (:func:`~.scale.selection_side`); without
      it (1, 1). ``SSLMethod`` provides it from its backbone.

    Optional attributes: ``seed`` (int, default 0), a part of the private generators' seeds;
    ``hvp_sample_keys`` (``hvp.selection_fraction``): batch entries besides ``views`` and
    ``params`` that hold one value per sample (a ``[B, ...]`` tensor or a list of them) and travel
    with the views, e.g. iBOT's ``masks``.

    Args:
        *args: Passed on to the host's LightningModule base (methods take ``cfg``).
        **kwargs: Likewise.
    """

    hvp: HVP
    hvp_batch_idx: int = 0  # micro-batch being selected: part of the private generators' seeds
    hvp_sample_keys: tuple[str, ...] = ()  # per-sample batch entries beyond views and params
    # hvp.colour=static only; declared, not defined here, so that a base class of the host
    # (SSLMethod) may provide them: what the selection scores, and the chosen views coloured.
    uncoloured_candidates: Callable[[dict[str, Any]], dict[str, Any]]
    colour_views: Callable[[dict[str, Any]], dict[str, Any]]
    # hvp.selection_scale: (multiple, minimum) of a view's side in the selection pass (a ViT: its
    # patch); declared likewise, (1, 1) where the host has none.
    selection_size_rule: Callable[[], tuple[int, int]]
    # Wraps each selection pass; no-op unless set: the run's perf callback times the pass with it
    # (hvp_lightning/run/perf.py), the FLOP count tells the selection's FLOPs by it (training/cost.py).
    selection_phase: Callable[[], AbstractContextManager[Any]] = nullcontext

    # --- hooks the host provides ---------------------------------------------------------
    def candidate_scores(self, batch: dict[str, Any]) -> torch.Tensor | CandidateScores:  # pragma: no cover
        """``[B, C]``: the method's per-sample loss of every candidate combination, from a
        forward over all candidate views (called by :meth:`score_candidates`, frozen); or
        :class:`CandidateScores`, that table and what :meth:`select_views` needs of this pass."""
        raise NotImplementedError(f"{type(self).__name__} must provide candidate_scores(batch) -> [B, C]")

    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:  # pragma: no cover
        """The method's unchanged training step on an ordinary (chosen) batch: the loss."""
        raise NotImplementedError(f"{type(self).__name__} must provide ssl_step(batch, batch_idx) -> loss")

    def select_views(self, batch: dict[str, Any], choice: torch.Tensor, context: Any = None) -> dict[str, Any]:
        """Default for pair methods: ``batch['views']`` is a list of N candidate batches and
        column c of the table is pair c of :func:`pair_index` (``context`` is not needed)."""
        stacked = torch.stack(batch["views"])
        pairs = pair_index(stacked.shape[0], device=choice.device)
        v1, v2 = gather_pairs(stacked, pairs, choice)
        out = dict(batch, views=[v1, v2])
        if "params" in batch:  # augmentation parameters travel with their views
            out["params"] = gather_pair_params(batch["params"], pairs, choice)
        return out

    def candidate_overlap(self, batch: dict[str, Any]) -> torch.Tensor | CandidateScores:
        """``hvp.mode=min_iou``: ``[B, C]``, the crop IoU of every column's views, from the crop
        boxes in ``batch["params"]``. Default for pair methods: column c is pair c."""
        n = len(batch["views"])
        return crop_iou(batch["params"], pair_index(n, device=batch["params"]["crop_x"].device))

    # --- the step --------------------------------------------------------------------------
    def hvp_active(self) -> bool:
        """HVP on this optimiser step? Same answer for every micro-batch of one step."""
        return self.hvp.enabled and self.global_step % self.hvp.every_n_steps == 0

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if not self.hvp.enabled:
            return self.ssl_step(batch, batch_idx)
        self.hvp_batch_idx = batch_idx
        crops = self._static_colour(batch) if self.hvp.colour == "static" else None
        if not self.hvp_active():
            # Alternating schedule: an ordinary step on the first two (i.i.d.) candidates.
            return self.ssl_step(self._chosen(batch, self._first_combination(batch), None, crops), batch_idx)
        if self.hvp.mode == "min_iou":
            return self._geometric_step(batch, batch_idx, crops)
        # profiler ranges (benchmarks/step_profile.py), free otherwise; the host's phase (timers)
        with record_function("hvp/selection"), self.selection_phase():
            scored = self._scored_samples(batch, batch_idx)
            scores = self.score_candidates(
                batch if scored is None else sample_subset(batch, scored, self.hvp_sample_keys)
            )
            choice = choose(scores.table, self.hvp.mode, self._choice_generator(batch_idx))
            chosen = self._chosen(batch, choice, scores.context, crops, scored)
        with record_function("hvp/train_forward"):
            loss = self.ssl_step(chosen, batch_idx)
        self._record_selection(scores.table, choice, loss, scored, batch["views"][0].shape[0])
        return loss

    def _geometric_step(self, batch: dict[str, Any], batch_idx: int, crops: list[torch.Tensor] | None) -> torch.Tensor:
        """``hvp.mode=min_iou``: each sample's least overlapping column, no selection forward."""
        params = batch.get("params")
        if params is None or any(k not in params for k in CROP_KEYS):
            raise KeyError(
                f"hvp.mode=min_iou: {type(self).__name__}'s batch has no crop boxes "
                f"(batch['params'] with {', '.join(CROP_KEYS)}, [B, N] each)"
            )
        with record_function("hvp/selection"), self.selection_phase():
            overlap = self.candidate_overlap(batch)
            if isinstance(overlap, torch.Tensor):
                overlap = CandidateScores(overlap)
            choice = least_overlap(overlap.table)
            chosen = self._chosen(batch, choice, overlap.context, crops)
        with record_function("hvp/train_forward"):
            loss = self.ssl_step(chosen, batch_idx)
        self._record_overlap(overlap.table, choice, loss)
        return loss

    def _static_colour(self, batch: dict[str, Any]) -> list[torch.Tensor]:
        """``hvp.colour=static``: in place, the batch becomes what the selection scores (the
        host's ``uncoloured_candidates``), so callbacks log what the step used; returns the
        loader's crops, from which the chosen views are cut."""
        missing = [hook for hook in ("uncoloured_candidates", "colour_views") if not hasattr(self, hook)]
        if missing:
            raise NotImplementedError(f"hvp.colour=static: {type(self).__name__} must provide {', '.join(missing)}")
        crops = batch["views"]
        batch.update(self.uncoloured_candidates(batch))
        return crops

    def _chosen(
        self,
        batch: dict[str, Any],
        choice: torch.Tensor,
        context: Any,
        crops: list[torch.Tensor] | None,
        scored: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """The training batch of ``choice``; with static colour, cut from the crops and coloured
        now. With ``scored`` (``hvp.selection_fraction``) ``choice`` and ``context`` are those
        samples'; the others keep their first combination."""
        source = batch if crops is None else dict(batch, views=crops)
        if scored is None:
            chosen = self.select_views(source, choice, context)
        else:
            first = self.select_views(source, self._first_combination(source), None)
            picked = self.select_views(sample_subset(source, scored, self.hvp_sample_keys), choice, context)
            chosen = merge_samples(first, scored, picked, self.hvp_sample_keys)
        return chosen if crops is None else self.colour_views(chosen)

    def score_candidates(self, batch: dict[str, Any]) -> CandidateScores:
        """The selection pass: ``candidate_scores`` under :func:`frozen_state`, at the selection
        precision: the step's autocast (``auto``), its own, or none at all for fp32 (even
        inside the training step's ``bf16-mixed``/``16-mixed`` autocast). With
        ``hvp.selection_scale`` < 1 it scores resized copies of the views
        (:func:`~hvp_lightning.selection.scale.scale_views`). The table comes back in fp32."""
        device = batch["views"][0].device
        self.hvp_step_dtype = ambient_autocast_dtype(device.type)
        dtype = self._selection_dtype(device.type)
        amp = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
        if self.hvp.selection_scale != 1:
            rule = self.selection_size_rule() if hasattr(self, "selection_size_rule") else (1, 1)
            views = scale_views(batch["views"], self.hvp.selection_scale, *rule)
            batch = dict(batch, views=views)
        with frozen_state(self, device), amp:
            scores = self.candidate_scores(batch)
        if isinstance(scores, torch.Tensor):
            scores = CandidateScores(scores)
        return scores._replace(table=scores.table.float())

    def selection_outputs_reusable(self) -> bool:
        """May outputs of the current selection pass stand in for the training step's own (DINO
        and iBOT reuse the BatchNorm-free teacher's)? Yes if the selection runs in fp32 or at
        the step's own precision (``auto``), not if it runs lower than the step, nor on other
        views than the step's (``hvp.selection_scale`` < 1: smaller ones) or on part of the
        batch (``hvp.selection_fraction`` < 1). Valid inside ``candidate_scores``."""
        dtype = self._selection_dtype(self.device.type)
        h = self.hvp
        return outputs_reusable(h.selection_scale, h.selection_fraction, dtype, getattr(self, "hvp_step_dtype", None))

    # --- helpers ---------------------------------------------------------------------------
    def _first_combination(self, batch: dict[str, Any]) -> torch.Tensor:
        """Column 0 for every sample (the views' batch size: a batch needs no labels)."""
        views = batch["views"][0]
        return torch.zeros(views.shape[0], dtype=torch.long, device=views.device)

    def _selection_dtype(self, device_type: str) -> torch.dtype | None:
        """The selection's autocast dtype here; the same answer inside the selection pass
        (whose autocast is then the ambient one), so methods may ask it there too."""
        key = (self.hvp.selection_precision, device_type, ambient_autocast_dtype(device_type))
        resolved = self.__dict__.setdefault("_hvp_dtypes", {})
        if key not in resolved:  # resolve (and warn) once per setting
            resolved[key] = resolve_selection_dtype(*key)
        return resolved[key]

    def _scored_samples(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor | None:
        """``hvp.selection_fraction`` < 1: the samples this selection pass scores
        (:func:`~hvp_lightning.selection.fraction.scored_samples`), from a private generator
        seeded by (seed, step, micro-batch, rank); None where it scores them all."""
        views = batch["views"][0]
        fraction, b = self.hvp.selection_fraction, views.shape[0]
        if fraction == 1:
            return None
        seed = stable_seed(getattr(self, "seed", 0), self.global_step, batch_idx, self.global_rank, 3)
        scored = scored_samples(b, fraction, torch.Generator().manual_seed(seed), views.device)
        return None if scored.shape[0] == b else scored

    def _choice_generator(self, batch_idx: int) -> torch.Generator | None:
        """Private generator for ``random`` mode: reproducible, distinct per micro-batch under
        gradient accumulation, and it leaves the global RNG (and so the data loader's views)
        exactly where the baseline would have it."""
        if self.hvp.mode != "random":
            return None
        seed = getattr(self, "seed", 0)
        return torch.Generator().manual_seed(stable_seed(seed, self.global_step, batch_idx, self.global_rank))

    def _record_selection(
        self,
        table: torch.Tensor,
        choice: torch.Tensor,
        trained_loss: torch.Tensor,
        scored: torch.Tensor | None,
        batch_size: int,
    ) -> None:
        """Log what this HVP step did, under names that say which pass each value comes from.

        ``hvp/selection_*`` are the selection pass's own values (frozen BatchNorm buffers,
        candidates normalised per view set; SimCLR's negatives from the candidate sets), over
        the samples it scored (``scored``: ``hvp.selection_fraction``; None: all);
        ``hvp/trained_loss`` is the loss the training step then computed on the chosen views
        of the whole batch -- with BatchNorm or batch-level negatives the two differ. Non-finite
        table entries (never chosen, see :func:`choose`) are counted and left out of the
        candidate mean. ``last_selection`` covers the whole batch: an unscored sample's row of
        the table is NaN and its choice column 0 (its first combination).
        """
        finite = torch.isfinite(table)
        selected = table.gather(1, choice[:, None]).squeeze(1)
        candidates = torch.where(finite, table, 0.0).sum(1) / finite.sum(1)  # per sample; >= 1 finite (choose)
        nonfinite = (~finite).sum().to(table.dtype)
        trained = trained_loss.detach().to(table.dtype)
        sel, cand = selected.mean(), candidates.mean()
        k = table.shape[0]
        log = self.log
        log("hvp/selection_selected_loss", sel, on_step=True, on_epoch=True, batch_size=k)
        log("hvp/selection_candidate_loss", cand, on_step=True, on_epoch=True, batch_size=k)
        log("hvp/selection_selected_minus_candidate", sel - cand, on_step=True, on_epoch=False, batch_size=k)
        log("hvp/trained_loss", trained, on_step=True, on_epoch=True, batch_size=batch_size)
        log("hvp/nonfinite_candidates", nonfinite, on_step=True, on_epoch=False, batch_size=k)
        # Run totals (TOTALS order) stay on device: no sync per step.
        totals = getattr(self, "hvp_totals", None)
        self.hvp_totals = add_totals(totals, trained, batch_size, selected, candidates, nonfinite)
        table, choice = table.detach(), choice.detach()
        if scored is not None:  # the whole batch's: unscored rows NaN, their choice their first combination
            table = table.new_full((batch_size, table.shape[1]), float("nan")).index_copy(0, scored, table)
            choice = choice.new_zeros(batch_size).index_copy(0, scored, choice)
        self.last_selection = {"table": table, "choice": choice}

    def _record_overlap(self, iou: torch.Tensor, choice: torch.Tensor, trained_loss: torch.Tensor) -> None:
        """``hvp.mode=min_iou``'s logs: no loss table, so ``hvp/selected_iou`` and
        ``hvp/candidate_iou`` (the crop IoU of the chosen column and the mean over the columns)
        and ``hvp/trained_loss``; the run totals count the trained loss only; ``last_selection``
        has no table (None) and the choice."""
        b = iou.shape[0]
        trained = trained_loss.detach().float()
        self.log("hvp/selected_iou", iou.gather(1, choice[:, None]).mean(), on_step=True, on_epoch=True, batch_size=b)
        self.log("hvp/candidate_iou", iou.mean(), on_step=True, on_epoch=True, batch_size=b)
        self.log("hvp/trained_loss", trained, on_step=True, on_epoch=True, batch_size=b)
        self.hvp_totals = add_totals(getattr(self, "hvp_totals", None), trained, b)
        self.last_selection = {"table": None, "choice": choice.detach()}

    # --- run totals in checkpoints (resume) ---------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The run totals travel with the host's run counters, as CPU tensors, one per rank:
        each rank's sums are its own, and the summary adds them up over the ranks."""
        super().on_save_checkpoint(checkpoint)
        checkpoint.setdefault("hvp_lightning", {})["hvp_totals"] = self._totals_per_rank()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """This rank's totals back (:func:`~hvp_lightning.selection.totals.rank_totals`): with
        another number of ranks rank 0 takes the sum of all and the others zeros, so the
        summary's sum over the ranks still counts every saved step once."""
        super().on_load_checkpoint(checkpoint)
        saved = (checkpoint.get("hvp_lightning") or {}).get("hvp_totals")
        totals = rank_totals(saved, self.global_rank, self._world_size())
        if totals is not None:
            self.hvp_totals = totals.to(self.device)

    def _totals_per_rank(self) -> list[torch.Tensor | None]:
        """Every rank's run totals on the CPU, in rank order. With several processes a
        collective (Lightning's ``all_gather``, under the process group's timeout): every rank
        dumps the checkpoint's state, rank 0 writes it. A rank before its first HVP step
        gives zeros, so every rank gathers the same shape."""
        totals = getattr(self, "hvp_totals", None)
        if self._world_size() == 1:
            return [None if totals is None else totals.detach().cpu()]
        own = totals.detach() if totals is not None else torch.zeros(len(TOTALS), dtype=torch.float64)
        gathered = self.all_gather(own.to(self.device))  # [world, len(TOTALS)]
        return [t.clone() for t in gathered.cpu().unbind(0)]

    def _world_size(self) -> int:
        """The run's processes (Lightning's trainer); 1 for a module used without a trainer
        (a checkpoint read for evaluation, a unit test)."""
        try:
            return self.trainer.world_size
        except RuntimeError:  # not attached to a Trainer
            return 1
