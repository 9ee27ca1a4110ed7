"""iBOT (Zhou et al., ICLR 2022, https://arxiv.org/abs/2111.07832): DINO's CLS self-distillation plus
masked image modelling on patch tokens, with exact Hard View Pretraining over the global views.

Loss (official ``iBOTLoss``): the student sees its two global crops with blockwise masks
(masked patch embeddings replaced by a learned token) and its L local crops unmasked; the
teacher sees the two globals unmasked. Per sample,

    l_b = lambda1 * CLS_b + lambda2 * (M_b(g1) + M_b(g2)) / 2

where ``CLS_b`` is DINO's bracket (teacher global i against every other student crop,
over ``2L + 2`` terms; :func:`~hvp_lightning.losses.dino.dino_loss`) and ``M_b(g)`` is the cross-entropy
between teacher and student patch tokens of the *same* global g, averaged over g's masked
tokens (:func:`~hvp_lightning.losses.ibot.ibot_patch_loss`). The official code averages the patch term over its 2
(same-view) pairs and the CLS term over its ``2L + 2`` pairs, each per batch, so the batch
mean of ``l_b`` is exactly the official loss.

Hard views (paper: "the original objective ... with global views only"): the candidates
are G global crops, each with its own mask (a candidate *is* crop + mask: the mask changes
the student's CLS output too); the L locals are the ordinary ones, fixed. ``M_b`` is unary
in the global, so the exact per-sample table over the global pairs (``hvp.global_pairs``:
``cross``, one crop of each global pipeline as the official HVP code, or ``all`` C(G,2)) is
one DINO cross-entropy table plus G patch terms.

View layout in ``batch["views"]``: ``[global_1..global_G, local_1..local_L]`` with G = 2
without HVP; ``batch["masks"]`` holds one bool ``[B, h, w]`` patch mask per global view.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ..losses.dino import dino_ce_table
from ..losses.ibot import ibot_loss_terms, ibot_pair_table, ibot_patch_loss
from ..nn.backbones import vit_tokens
from ..nn.heads import IBOTHead
from ..nn.masks import ibot_masks
from ..nn.sync_free import host_to_device
from ..nn.teacher import Centering, teacher_temperature
from ..selection import (
    CandidateScores,
    chosen_views_batch,
    crop_iou,
    fit_mask,
    global_pair_index,
    stable_seed,
)
from ..settings.ibot import IBOTSettings
from .dino import DINO

# What iBOT's selection pass hands its select_views beside the table, where the step may reuse
# them: the teacher's CLS ``[G, B, K]`` and patch ``[G, B, P, K']`` logits of the global candidates.
TeacherLogits = tuple[torch.Tensor, torch.Tensor]


class IBOT(DINO):
    """iBOT with an optional exact hard-view selection over global crops (module docstring).

    Everything that is not the loss -- EMA teacher, CLS centring, temperature and weight
    decay schedules, per-parameter clipping, last-layer freeze, multi-crop augmentations,
    teacher reuse, evaluation of the teacher backbone -- is DINO's (this class subclasses
    :class:`DINO`, itself ``TeacherStudentMixin, HardViewMixin, SSLMethod``). iBOT adds the :class:`IBOTHead`
    (``method.shared_head``: one output layer for CLS and patches; the teacher's head is a
    copy of the student's), a learned ``mask_token``, a second centre for patch logits
    (``patch_centering``) with its own temperature schedule, and blockwise masks.

    Masks: produced per global view in :meth:`training_step` from a private generator seeded
    by (seed, step, rank, batch index) unless the batch already carries ``masks``; they are
    part of the batch from then on, so the selection pass, the gather and the training
    step see the same ones, and the global RNG (hence the loader's views) is untouched.

    HVP flow: :meth:`candidate_scores` returns ``[B, P]`` over the ``hvp.global_pairs``
    pairs (:func:`ibot_pair_table`), with teacher reuse together with the selection's teacher
    CLS/patch logits; the mixin chooses a column; :meth:`select_views` gathers that pair's
    crops *and masks* (and those logits, handed to it by the mixin); the L locals pass
    through unchanged. The off-step combination (column 0) is globals 0 and 1, the baseline.

    Settings: :class:`~hvp_lightning.settings.ibot.IBOTSettings`: DINO's (see :class:`DINO`)
    plus ``patch_out_dim``, ``shared_head``, ``lambda1``, ``lambda2``, ``teacher_patch_temp``,
    ``warmup_teacher_patch_temp``, ``center_momentum2`` and the masks' ``mask_prob``,
    ``mask_ratio``, ``mask_min_aspect``.
    """

    settings_type = IBOTSettings
    settings: IBOTSettings
    hvp_sample_keys = ("masks",)  # one mask per global view and sample: they travel with the views

    def build(self) -> None:
        super().build()
        m = self.settings
        self.patch_centering = Centering(self.patch_dim, m.center_momentum2)
        self.mask_token = nn.Parameter(torch.zeros(1, self.backbone.feature_dim))  # zero-init, as iBOT
        self.token_path: Callable[..., tuple[torch.Tensor, torch.Tensor]] = vit_tokens  # compiled by configure_model

    @property
    def patch_dim(self) -> int:
        """Patch logits' size: ``out_dim`` with a shared head (official iBOT), else ``patch_out_dim``."""
        m = self.settings
        return m.out_dim if m.shared_head else m.patch_out_dim

    def build_head(self) -> IBOTHead:
        m = self.settings
        return IBOTHead(
            self.backbone.feature_dim,
            m.out_dim,
            self.patch_dim,
            m.shared_head,
            m.head_hidden_dim,
            m.bottleneck_dim,
            m.head_layers,
            m.use_bn_in_head,
            m.norm_last_layer,
        )

    def teacher_patch_temp(self) -> float:
        m = self.settings
        return teacher_temperature(
            self.current_epoch, m.teacher_patch_temp, m.warmup_teacher_patch_temp, m.warmup_teacher_temp_epochs
        )

    def configure_model(self) -> None:
        """With ``method.compile`` the backbones are compiled (the local crops' path) and so is
        :func:`vit_tokens`, the global crops' path: it calls the ViT's parts directly for masked
        image modelling, past a compiled backbone's forward. One graph per network, grad mode
        and mask/no mask; compiling the blocks one by one instead would need a graph per
        block (each has its own drop-path rate) and run past Dynamo's recompile limit."""
        compiled = bool(self.compiled_modules)
        super().configure_model()
        if self.compiled_modules and not compiled:
            self.token_path = torch.compile(vit_tokens)
            self.compiled_modules.append("vit_tokens")

    # --- masks ------------------------------------------------------------------------------
    def make_masks(self, batch: dict[str, Any], batch_idx: int = 0) -> list[torch.Tensor]:
        """One bool ``[B, h, w]`` mask per global view of ``batch`` (h, w: the patch grid).

        Seeded by (seed, step, rank, batch_idx): reproducible, distinct per micro-batch
        under gradient accumulation and per rank, and recomputable (same batch, same masks)."""
        views, m = batch["views"], self.settings
        ps = int(self.backbone.patch_size)
        h, w = views[0].shape[-2] // ps, views[0].shape[-1] // ps
        rng = random.Random(stable_seed(self.seed, self.global_step, self.global_rank, 2, batch_idx))
        masks = torch.stack(
            [
                ibot_masks(views[0].shape[0], h, w, m.mask_ratio, m.mask_prob, m.mask_min_aspect, rng)
                for _ in range(self.num_globals)
            ]
        )  # drawn on the host, as official iBOT's loader does
        return list(host_to_device(masks, views[0].device).unbind(0))

    def _masks(self, batch: dict[str, Any]) -> list[torch.Tensor]:
        masks = batch.get("masks")
        return list(masks) if masks is not None else self.make_masks(batch)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """Attach masks (if the loader did not) so they travel with their views, then HVP/DINO's step."""
        if batch.get("masks") is None:
            batch = dict(batch, masks=self.make_masks(batch, batch_idx))
        return super().training_step(batch, batch_idx)

    # --- forward ----------------------------------------------------------------------------
    def _token_forward(
        self,
        backbone: nn.Module,
        head: IBOTHead,
        crops: Sequence[torch.Tensor],
        masks: Sequence[torch.Tensor] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """CLS and patch logits per crop; the crops (same size) share one forward."""
        images, mask = torch.cat(list(crops)), torch.cat(list(masks)) if masks is not None else None
        for t in (images, mask) if self.compiled_modules else ():  # one graph for a step's 2 views and N candidates
            if t is not None:
                torch._dynamo.maybe_mark_dynamic(t, 0)
        cls, patches = self.token_path(backbone, images, mask, self.mask_token if mask is not None else None)
        c, p = head.forward_tokens(cls, patches)
        return list(c.chunk(len(crops))), list(p.chunk(len(crops)))

    # --- training step ------------------------------------------------------------------------
    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        views = batch["views"]
        globals_, locals_ = list(views[:2]), list(views[2:])
        masks = self._masks(batch)[:2]
        teacher_out = batch.get("teacher_out")
        if teacher_out is None:
            with torch.no_grad():
                t_cls, t_patch = self._token_forward(self.teacher.backbone, self.teacher.head, globals_)
        else:
            t_cls, t_patch = teacher_out
        s_cls, s_patch = self._token_forward(self.backbone, self.head, globals_, masks)
        s_cls += self._forward(self.backbone, self.head, locals_, len(locals_))
        m = self.settings
        tau_t, tau_t2 = self.teacher_temp(), self.teacher_patch_temp()
        cls, patch = ibot_loss_terms(
            t_cls,
            s_cls,
            t_patch,
            s_patch,
            masks,
            self.centering.center,
            self.patch_centering.center,
            tau_t,
            tau_t2,
            m.student_temp,
        )
        loss_cls, loss_patch = m.lambda1 * cls.mean(), m.lambda2 * patch.mean()
        loss = loss_cls + loss_patch
        # After the loss, as iBOT: both centres from this step's teacher outputs, applied once
        # per optimiser step (TeacherStudentMixin.on_train_batch_end).
        self.centering.accumulate(t_cls)
        self.patch_centering.accumulate(t_patch)
        b = globals_[0].shape[0]
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=b)
        self.log("train/loss_cls", loss_cls, on_step=True, on_epoch=True, batch_size=b)
        self.log("train/loss_patch", loss_patch, on_step=True, on_epoch=True, batch_size=b)
        self.log("train/teacher_temp", tau_t, on_step=True, on_epoch=False, batch_size=b)
        self.log("train/teacher_patch_temp", tau_t2, on_step=True, on_epoch=False, batch_size=b)
        return loss

    # --- HVP hooks --------------------------------------------------------------------------
    def candidate_scores(self, batch: dict[str, Any]) -> CandidateScores:
        views, g, m = batch["views"], self.num_globals, self.settings
        globals_, locals_ = list(views[:g]), list(views[g:])
        ps = int(self.backbone.patch_size)
        grid = (views[0].shape[-2] // ps, views[0].shape[-1] // ps)
        masks = [fit_mask(k, grid) for k in self._masks(batch)]  # hvp.selection_scale: the smaller grid
        tau_t, tau_t2, tau_s = self.teacher_temp(), self.teacher_patch_temp(), m.student_temp
        reuse = self.teacher_reuse and self.selection_outputs_reusable()
        t_cls, t_patch, s_cls, patch_terms = [], [], [], []
        for i in range(0, g, 2):  # globals two at a time, as the training step forwards them
            crops, crop_masks = globals_[i : i + 2], masks[i : i + 2]
            tc, tp = self._token_forward(self.teacher.backbone, self.teacher.head, crops)
            sc, sp = self._token_forward(self.backbone, self.head, crops, crop_masks)
            patch_terms += [
                ibot_patch_loss(t, s, k, self.patch_centering.center, tau_t2, tau_s)
                for t, s, k in zip(tp, sp, crop_masks)
            ]
            t_cls += tc
            s_cls += sc
            if reuse:
                t_patch += tp
        s_cls += self._forward(self.backbone, self.head, locals_, len(locals_))
        teacher = torch.stack(t_cls)  # [G, B, K]
        ce = dino_ce_table(teacher, torch.stack(s_cls), self.centering.center, tau_t, tau_s)
        pairs = global_pair_index(g, self.hvp.global_pairs, ce.device)
        table = ibot_pair_table(ce, torch.stack(patch_terms, 1), pairs, m.lambda1, m.lambda2)
        return CandidateScores(table, (teacher, torch.stack(t_patch)) if reuse else None)

    def candidate_overlap(self, batch: dict[str, Any]) -> torch.Tensor:
        """``hvp.mode=min_iou``: the crop IoU of every global pair of ``hvp.global_pairs``; the
        locals are the ordinary ones, as in every iBOT selection."""
        params = batch["params"]
        return crop_iou(params, global_pair_index(self.num_globals, self.hvp.global_pairs, params["crop_x"].device))

    def select_views(
        self, batch: dict[str, Any], choice: torch.Tensor, context: TeacherLogits | None = None
    ) -> dict[str, Any]:
        """Each sample's chosen global pair, with its masks (and the teacher logits ``context``
        the selection pass handed back, if reusable), followed by the unchanged locals. Column 0
        (HVP's off-steps) = globals 0 and 1."""
        views, g, n_loc = batch["views"], self.num_globals, self.num_local
        bsz = choice.shape[0]
        b = torch.arange(bsz, device=choice.device)
        pair = global_pair_index(g, self.hvp.global_pairs, choice.device)[choice]  # [B, 2]
        g1, g2 = pair.unbind(1)
        glob, masks = torch.stack(list(views[:g])), torch.stack(self._masks(batch))
        teacher_out = None
        if context is not None:
            t_cls, t_patch = context
            teacher_out = ([t_cls[g1, b], t_cls[g2, b]], [t_patch[g1, b], t_patch[g2, b]])
        locs = torch.arange(n_loc, device=choice.device).expand(bsz, n_loc)  # the locals, unchanged
        out = chosen_views_batch(batch, [glob[g1, b], glob[g2, b], *views[g:]], pair, locs, g, teacher_out)
        out["masks"] = [masks[g1, b], masks[g2, b]]
        return out
