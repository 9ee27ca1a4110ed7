"""DINO (Caron et al., ICCV 2021, https://arxiv.org/abs/2104.14294), multi-crop, with exact Hard View Pretraining.

Loss (official, per sample): :mod:`hvp_lightning.losses.dino`.

Hard views (docs/DESIGN.md; the search is :mod:`hvp_lightning.selection.multicrop`): the
combination space is (global pair) x (L of Lc local
candidates). A combination's loss splits into a pair term ``CE(g1->g2) + CE(g2->g1)`` and a
sum of unary local terms ``CE(g1->j) + CE(g2->j)``, so for each global pair the best
locals are the top-L (hard) or bottom-L (easy) unary terms: an exact argmax/argmin over all
``P * C(Lc,L)`` combinations costs one cross-entropy table and a top-k per pair. The P global
pairs are ``hvp.global_pairs``: ``cross`` (default, the official HVP code) pairs a crop of
pipeline 1 with one of pipeline 2 (``G/2 * G/2`` pairs), so the trained views keep DINO's
asymmetry; ``all`` scores every ``C(G,2)`` pair.

View layout in ``batch["views"]``: HVP off, ``[global1, global2, local_1..local_L]`` (the
baseline); HVP on, ``[G global candidates (pipelines 1,2,1,2,...), Lc local candidates]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from ..losses.dino import dino_ce_table, dino_loss
from ..nn.heads import DINOHead
from ..nn.teacher import Centering, TeacherStudentMixin
from ..selection import (
    CandidateScores,
    HardViewMixin,
    chosen_views_batch,
    crop_iou,
    dino_combination_table,
    gather_combination_views,
    global_pair_index,
    least_overlapping_locals,
    stable_seed,
)
from ..settings.dino import DINOSettings, TeacherStudentSettings
from .base import SSLMethod


class DinoColumns(NamedTuple):
    """What DINO's selection pass hands its :meth:`DINO.select_views` beside the table (a
    column is a global pair with its locals, which differ per sample and per mode)."""

    pairs: torch.Tensor  # [B, C, 2] each column's global candidates
    locals: torch.Tensor  # [B, C, L] each column's local candidates
    teacher: torch.Tensor | None  # [G, B, K] teacher outputs of the global candidates, where reusable


# --- the method -------------------------------------------------------------------------------


class DINO(TeacherStudentMixin, HardViewMixin, SSLMethod):
    """DINO with an optional exact hard-view selection (see module docstring).

    HVP flow: :meth:`candidate_scores` returns a ``[B, P]`` table, one column per global
    pair of ``hvp.global_pairs`` (``cross``: 4 of the 6 pairs of G=4), whose entry is the
    loss of that pair with its best locals *under the current mode* (top-L for hard,
    bottom-L for easy, random for random), and hands those locals back with it
    (:class:`DinoColumns`); the mixin's ``choose`` picks the column; :meth:`select_views`
    gathers the pair and the locals it was handed. So the
    choice is the exact argmax/argmin over all ``P * C(Lc,L)`` combinations (or a uniform
    one). With ``hvp.max_combinations=K`` the columns are instead K random combinations per
    sample (paper's setting). (So the mixin's ``hvp/selection_candidate_loss`` is the mean
    of those columns, not of all combinations.)

    Teacher reuse: the teacher is gradient-free and unchanged between the selection pass
    and the training step, so the selection's teacher outputs of the two chosen globals are
    passed to :meth:`ssl_step` via ``batch["teacher_out"]``. That is exact when the teacher
    has no BatchNorm (ViTs; drop-path is off in the teacher) and the selection runs in fp32
    or at the step's own precision (``auto``); with a BatchNorm teacher (ResNet) the output
    depends on the batch it was normalised with, so the training step runs its own teacher
    forward. ``method.teacher_reuse=false`` always forwards again.

    The selection pass changes no state: no centre update (only :meth:`ssl_step` feeds it,
    after its loss), no EMA, BatchNorm buffers and RNG frozen by the mixin's ``frozen_state``.

    EMA teacher, temperature and weight-decay schedules, clipping, last-layer freeze and
    their behaviour under gradient accumulation: :class:`~hvp_lightning.nn.teacher.TeacherStudentMixin`.

    Settings: :class:`~hvp_lightning.settings.dino.DINOSettings`: head (``out_dim``,
    ``head_hidden_dim``, ``bottleneck_dim``, ``head_layers``, ``use_bn_in_head``, ``norm_last_layer``),
    teacher (``momentum_teacher``, ``teacher_temp``, ``warmup_teacher_temp``,
    ``warmup_teacher_temp_epochs``, ``center_momentum``, ``teacher_reuse``), ``student_temp``,
    ``freeze_last_layer``, ``clip_grad``, multi-crop (``num_local_crops``, ``local_crop_size``,
    ``global_scale``, ``local_scale``, blur/solarize probabilities), ``batch_size``, ``optimizer``;
    construction: :class:`~hvp_lightning.methods.base.SSLMethod`.
    """

    settings_type = DINOSettings
    settings: TeacherStudentSettings

    def build(self) -> None:
        m = self.settings
        self.num_local = m.num_local_crops
        self.num_globals, self.num_locals_cand = m.candidate_counts(self.hvp)
        self.head = self.build_head()
        self.init_teacher()
        self.centering = Centering(m.out_dim, m.center_momentum)

    def build_head(self) -> DINOHead:
        """The student head (the teacher's is a copy); a hook so iBOT can add patch outputs."""
        m = self.settings
        return DINOHead(
            self.backbone.feature_dim,
            m.out_dim,
            m.head_hidden_dim,
            m.bottleneck_dim,
            m.head_layers,
            m.use_bn_in_head,
            m.norm_last_layer,
        )

    # --- forward ----------------------------------------------------------------------------
    @staticmethod
    def _forward(backbone: nn.Module, head: nn.Module, crops: Sequence[torch.Tensor], group: int) -> list[torch.Tensor]:
        """Head outputs per crop; ``group`` consecutive crops share one forward (as DINO's
        multi-crop wrapper batches same-size crops), so BatchNorm sees the same batch sizes
        in the selection pass as in the training step."""
        out: list[torch.Tensor] = []
        group = max(1, group)
        for i in range(0, len(crops), group):
            chunk = crops[i : i + group]
            out += list(head(backbone(torch.cat(list(chunk)))).chunk(len(chunk)))
        return out

    # --- training step ------------------------------------------------------------------------
    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        views = batch["views"]
        globals_, locals_ = list(views[:2]), list(views[2:])
        teacher_out = batch.get("teacher_out")
        if teacher_out is None:
            with torch.no_grad():
                teacher_out = self._forward(self.teacher.backbone, self.teacher.head, globals_, 2)
        student_out = self._forward(self.backbone, self.head, globals_, 2)
        student_out += self._forward(self.backbone, self.head, locals_, len(locals_))
        tau_t = self.teacher_temp()
        loss = dino_loss(teacher_out, student_out, self.centering.center, tau_t, self.settings.student_temp).mean()
        # After the loss, as DINO; applied once per optimiser step (on_train_batch_end).
        self.centering.accumulate(teacher_out)  # detaches itself
        b = globals_[0].shape[0]
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=b)
        self.log("train/teacher_temp", tau_t, on_step=True, on_epoch=False, batch_size=b)
        return loss

    # --- HVP hooks --------------------------------------------------------------------------
    def candidate_scores(self, batch: dict[str, Any]) -> CandidateScores:
        views = batch["views"]
        g = self.num_globals
        globals_, locals_ = list(views[:g]), list(views[g:])
        teacher = torch.stack(self._forward(self.teacher.backbone, self.teacher.head, globals_, 2))  # [G, B, K]
        student = self._forward(self.backbone, self.head, globals_, 2)
        student += self._forward(self.backbone, self.head, locals_, self.num_local)
        ce = dino_ce_table(
            teacher, torch.stack(student), self.centering.center, self.teacher_temp(), self.settings.student_temp
        )
        table = dino_combination_table(
            ce,
            g,
            self.num_local,
            self.hvp.mode,
            self.hvp.max_combinations,
            self._locals_generator(),
            self.hvp.global_pairs,
        )
        reuse = self.teacher_reuse and self.selection_outputs_reusable()
        return CandidateScores(table.loss, DinoColumns(table.pairs, table.locals, teacher if reuse else None))

    def candidate_overlap(self, batch: dict[str, Any]) -> CandidateScores:
        """``hvp.mode=min_iou``: one column per global pair of ``hvp.global_pairs``, its crop IoU,
        with the L locals that overlap that pair's globals least
        (:func:`~hvp_lightning.selection.least_overlapping_locals`): the mixin takes the least
        overlapping pair, :meth:`select_views` it and its locals."""
        params = batch["params"]
        pairs = global_pair_index(self.num_globals, self.hvp.global_pairs, params["crop_x"].device)
        iou = crop_iou(params, pairs)  # [B, P]
        locs = least_overlapping_locals(params, self.num_globals, pairs, self.num_local)
        return CandidateScores(iou, DinoColumns(pairs.expand(iou.shape[0], -1, -1), locs, None))

    def select_views(
        self, batch: dict[str, Any], choice: torch.Tensor, context: DinoColumns | None = None
    ) -> dict[str, Any]:
        """The chosen 2 globals + L locals of each sample, in the baseline's view layout.

        Without a selection pass (``context`` None: HVP's off-steps), the first combination:
        global candidates 0 and 1 (one of each pipeline) and the first L local candidates."""
        views, g, n_loc = batch["views"], self.num_globals, self.num_local
        bsz = choice.shape[0]
        b = torch.arange(bsz, device=choice.device)
        if context is None:
            pair = torch.arange(2, device=choice.device).expand(bsz, 2)
            locs = torch.arange(n_loc, device=choice.device).expand(bsz, n_loc)
        else:
            pair, locs = context.pairs[b, choice], context.locals[b, choice]
        teacher_out = None
        if context is not None and context.teacher is not None:
            t = context.teacher
            teacher_out = [t[pair[:, 0], b], t[pair[:, 1], b]]
        return chosen_views_batch(batch, gather_combination_views(views, g, pair, locs), pair, locs, g, teacher_out)

    def _locals_generator(self) -> torch.Generator | None:
        """Private generator for random local picks / sampled combinations, so they neither
        consume nor mirror the global RNG stream (the selection pass restores that anyway)."""
        if self.hvp.mode != "random" and self.hvp.max_combinations is None:
            return None
        return torch.Generator().manual_seed(
            stable_seed(self.seed, self.global_step, self.global_rank, 1, self.hvp_batch_idx)
        )
