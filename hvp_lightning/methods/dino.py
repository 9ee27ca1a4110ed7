"""DINO (Caron et al., ICCV 2021), multi-crop, with exact Hard View Pretraining.

Loss (official): with ``q_i = softmax((T_i - c) / tau_t)`` for the two teacher globals and
``log p_j = log_softmax(S_j / tau_s)`` for the student's 2 globals + L locals, a sample's
loss is ``sum_{i, j != i} CE(q_i, p_j) / (2L + 2)``; the batch mean is DINO's loss.

Hard views (docs/DESIGN.md): the combination space is (global pair) x (L of Lc local
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

import dataclasses
import math
from typing import Any, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from ..backbones import BACKBONES
from ..errors import ConfigError
from ..data.augment import ViewAug
from ..data.datamodule import view_aug
from ..heads import DINOHead
from ..selection import HardViewMixin, stable_seed, choose, global_pair_index
from ..teacher import Centering, cosine_momentum, ema_update, has_batchnorm, make_teacher, teacher_temperature
from .base import SSLMethod, hvp_config, warmup_cosine

# --- the loss, per sample ---------------------------------------------------------------------


def teacher_probs(t: torch.Tensor, center: torch.Tensor, tau_t: float) -> torch.Tensor:
    return F.softmax((t.float() - center) / tau_t, dim=-1)


def student_log_probs(s: torch.Tensor, tau_s: float) -> torch.Tensor:
    return F.log_softmax(s.float() / tau_s, dim=-1)


def dino_cross_entropy(teacher_logits: torch.Tensor, student_logits: torch.Tensor, center: torch.Tensor,
                       tau_t: float, tau_s: float) -> torch.Tensor:
    """Per-sample ``CE(t->s) = -sum_d softmax((t - c)/tau_t)_d log_softmax(s/tau_s)_d``: ``[B]``."""
    return -(teacher_probs(teacher_logits, center, tau_t) * student_log_probs(student_logits, tau_s)).sum(-1)


def dino_loss(teacher_out: Sequence[torch.Tensor], student_out: Sequence[torch.Tensor], center: torch.Tensor,
              tau_t: float, tau_s: float) -> torch.Tensor:
    """Official DINO loss per sample ``[B]``: teacher crop i against every student crop
    j != i (student crops 0, 1 are the same globals as the teacher's), averaged over the
    ``2 * (2 + L) - 2 = 2L + 2`` terms. ``.mean()`` of it is the official batch loss."""
    qs = [teacher_probs(t, center, tau_t) for t in teacher_out]
    logps = [student_log_probs(s, tau_s) for s in student_out]
    total: torch.Tensor | float = 0.0
    terms = 0
    for i, q in enumerate(qs):
        for j, logp in enumerate(logps):
            if i == j:
                continue
            total = total - (q * logp).sum(-1)
            terms += 1
    if terms == 0:
        raise ValueError("dino_loss needs at least one (teacher, other student crop) term")
    return total / terms  # type: ignore[return-value]


def dino_ce_table(teacher: torch.Tensor, student: torch.Tensor, center: torch.Tensor, tau_t: float,
                  tau_s: float) -> torch.Tensor:
    """Every teacher/student cross-entropy at once: ``teacher [G, B, K]``, ``student [V, B, K]``
    -> ``[B, G, V]`` with entry (b, g, v) = ``CE_b(g -> v)``."""
    # fp32 even under mixed precision: the argmax must rank the loss the method computes.
    with torch.autocast(teacher.device.type, enabled=False):
        q = teacher_probs(teacher, center, tau_t)
        logp = student_log_probs(student, tau_s)
        return -torch.einsum("gbk,vbk->bgv", q, logp)


# --- exact (and sampled) combination search -------------------------------------------------


class CombinationTable(NamedTuple):
    """Per-sample candidate combinations: column c of sample b is global pair ``pairs[b, c]``
    (indices into the G global candidates) with locals ``locals[b, c]`` (indices into the Lc
    local candidates) and official DINO loss ``loss[b, c]``."""

    loss: torch.Tensor  # [B, C]
    pairs: torch.Tensor  # [B, C, 2]
    locals: torch.Tensor  # [B, C, L]


def combination_loss(ce: torch.Tensor, pairs: torch.Tensor, locals_: torch.Tensor, num_globals: int) -> torch.Tensor:
    """Loss of combinations ``pairs [B, C, 2]`` + ``locals [B, C, L]`` from a CE table ``[B, G, V]``."""
    b = torch.arange(ce.shape[0], device=ce.device)[:, None]
    g1, g2 = pairs.unbind(-1)
    pair_terms = ce[b, g1, g2] + ce[b, g2, g1]
    j = num_globals + locals_
    local_terms = ce[b[..., None], g1[..., None], j] + ce[b[..., None], g2[..., None], j]
    return (pair_terms + local_terms.sum(-1)) / (2 * locals_.shape[-1] + 2)


def _uniform_subsets(shape: tuple[int, ...], n: int, k: int, generator: torch.Generator | None,
                     device: torch.device) -> torch.Tensor:
    """Uniformly random k-subsets of ``range(n)``, one per entry of ``shape``: ``[*shape, k]``."""
    return torch.rand(*shape, n, generator=generator).argsort(-1)[..., :k].to(device)


def dino_combination_table(ce: torch.Tensor, num_globals: int, num_local: int, mode: str = "hard",
                           max_combinations: int | None = None, generator: torch.Generator | None = None,
                           global_pairs: str = "cross") -> CombinationTable:
    """Candidate combinations of every sample, sized so that ``choose(table.loss, mode)``
    returns the exact optimum over all ``P * C(Lc,L)`` combinations, P the global pairs of
    ``global_pairs`` (:func:`~hvp_lightning.selection.global_pair_index`).

    Exact (``max_combinations`` None or >= the number of combinations): one column per
    global pair, holding the pair's best locals under ``mode`` -- top-L (hard), bottom-L
    (easy) or a uniform L-subset (random; with the uniform column choice this is a uniform
    combination). Non-finite local terms rank last, so a pair's column is finite whenever L
    of its local terms are. Sampled (the paper's fidelity setting): ``max_combinations``
    columns, each an independently drawn uniform combination (with replacement) per sample.
    """
    bsz, g, v = ce.shape
    lc = v - num_globals
    if num_globals != g or g < 2 or not 0 <= num_local <= lc:
        raise ValueError(f"need G >= 2 globals and 0 <= L <= Lc: G={g}, L={num_local}, Lc={lc}")
    pairs = global_pair_index(g, global_pairs, device=ce.device)  # [P, 2]
    total = pairs.shape[0] * math.comb(lc, num_local)
    if max_combinations is not None and max_combinations < total:
        pick = torch.randint(pairs.shape[0], (bsz, max_combinations), generator=generator).to(ce.device)
        cpairs = pairs[pick]
        clocals = _uniform_subsets((bsz, max_combinations), lc, num_local, generator, ce.device)
        return CombinationTable(combination_loss(ce, cpairs, clocals, g), cpairs, clocals)
    g1, g2 = pairs.unbind(1)
    pair_terms = ce[:, g1, g2] + ce[:, g2, g1]  # [B, P]
    local_terms = ce[:, g1, g:] + ce[:, g2, g:]  # [B, P, Lc]
    if mode in ("hard", "easy"):
        worst = float("-inf") if mode == "hard" else float("inf")
        ranked = local_terms.masked_fill(~torch.isfinite(local_terms), worst)
        idx = ranked.topk(num_local, dim=-1, largest=mode == "hard").indices
        vals = local_terms.gather(-1, idx)
    elif mode == "random":
        idx = _uniform_subsets(tuple(local_terms.shape[:2]), lc, num_local, generator, ce.device)
        vals = local_terms.gather(-1, idx)
    else:
        raise ValueError(f"mode={mode!r}; allowed: hard, easy, random")
    loss = (pair_terms + vals.sum(-1)) / (2 * num_local + 2)
    return CombinationTable(loss, pairs.expand(bsz, -1, -1), idx)


class DinoSelection(NamedTuple):
    pair: torch.Tensor  # [B, 2] chosen global candidates
    locals: torch.Tensor  # [B, L] chosen local candidates
    loss: torch.Tensor  # [B] official DINO loss of the chosen combination


def dino_exact_selection(T: torch.Tensor, S_glob: torch.Tensor, S_loc: torch.Tensor, L: int, center: torch.Tensor,
                         tau_t: float, tau_s: float, mode: str = "hard", max_combinations: int | None = None,
                         generator: torch.Generator | None = None, global_pairs: str = "cross") -> DinoSelection:
    """Per-sample choice of 2 globals + L locals from ``T``/``S_glob`` ``[G, B, K]`` (teacher /
    student logits of the global candidates) and ``S_loc`` ``[Lc, B, K]``: the argmax (hard),
    argmin (easy) or a uniform draw (random) of the DINO loss over all combinations whose
    global pair is in ``global_pairs``, or over ``max_combinations`` random ones of them.
    Vectorised over samples."""
    ce = dino_ce_table(T, torch.cat([S_glob, S_loc]), center, tau_t, tau_s)
    table = dino_combination_table(ce, T.shape[0], L, mode, max_combinations, generator, global_pairs)
    choice = choose(table.loss, mode, generator)
    b = torch.arange(choice.shape[0], device=choice.device)
    return DinoSelection(table.pairs[b, choice], table.locals[b, choice], table.loss[b, choice])


# --- config helpers ---------------------------------------------------------------------------


def candidate_counts(cfg: DictConfig) -> tuple[int, int]:
    """(G global, Lc local) views the loader produces per image.

    HVP off: (2, L). HVP on: ``hvp.num_global_candidates`` (default ``hvp.num_views``, i.e.
    4) and ``hvp.num_local_candidates`` (default ``ceil(L * num_views / 2)``, i.e. 2L): each
    of DINO's crops is drawn ``num_views / 2`` times, as in the paper's 4 + 16 setting.
    """
    num_local = int(cfg.method.num_local_crops)
    hvp = hvp_config(cfg)
    if not hvp.enabled:
        return 2, num_local
    node = cfg.hvp
    g = node.get("num_global_candidates") or hvp.num_views
    lc = node.get("num_local_candidates")
    lc = math.ceil(num_local * hvp.num_views / 2) if lc is None else lc
    if int(g) < 2:
        raise ConfigError(f"hvp.num_global_candidates={g!r} is not allowed: expected an integer >= 2")
    if int(lc) < num_local:
        raise ConfigError(f"hvp.num_local_candidates={lc!r} is not allowed: expected an integer >= "
                          f"method.num_local_crops={num_local}")
    return int(g), int(lc)


def _check_crops(cfg: DictConfig) -> None:
    m = cfg.method
    if int(m.num_local_crops) < 0:
        raise ConfigError(f"method.num_local_crops={m.num_local_crops!r} is not allowed: expected an integer >= 0")
    if int(m.num_local_crops) > 0 and int(m.local_crop_size) < 1:
        raise ConfigError(f"method.local_crop_size={m.local_crop_size!r} is not allowed: expected an integer >= 1")
    b = cfg.backbone
    if BACKBONES[b.name].family == "vit" and int(m.num_local_crops) > 0 and m.local_crop_size % b.patch_size:
        raise ConfigError(f"method.local_crop_size={m.local_crop_size!r} is not allowed: a multiple of "
                          f"backbone.patch_size={b.patch_size} for {b.name}")
    for key in ("global_scale", "local_scale"):
        lo, hi = m[key]
        if not 0 < lo <= hi <= 1:
            raise ConfigError(f"method.{key}={list(m[key])!r} is not allowed: two numbers 0 < min <= max <= 1")


def clip_gradients_per_parameter(params: Sequence[nn.Parameter], clip: float) -> None:
    """DINO's clipping: each parameter's gradient is rescaled to norm <= ``clip`` on its own."""
    for p in params:
        if p.grad is not None:
            norm = p.grad.detach().norm(2)
            p.grad.mul_(torch.clamp(clip / (norm + 1e-6), max=1.0))


# --- the method -------------------------------------------------------------------------------


class DINO(HardViewMixin, SSLMethod):
    """DINO with an optional exact hard-view selection (see module docstring).

    HVP flow: :meth:`candidate_scores` returns a ``[B, P]`` table, one column per global
    pair of ``hvp.global_pairs`` (``cross``: 4 of the 6 pairs of G=4), whose entry is the
    loss of that pair with its best locals *under the current mode* (top-L for hard,
    bottom-L for easy, random for random), and stashes those locals; the mixin's ``choose``
    picks the column; :meth:`select_views` gathers the pair and its stashed locals. So the
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

    Gradient accumulation (``trainer.accumulate_grad_batches=k``): EMA teacher, centres,
    weight-decay and momentum schedules advance once per optimiser step
    (:meth:`on_train_batch_end`, ``global_step``); every micro-batch of a step sees the same
    teacher, centre and temperatures, and the centre moves by the mean over all k
    micro-batches' teacher outputs, so without BatchNorm k x B equals one step of kB.
    Clipping and the last-layer freeze act on the accumulated (and, under ``16-mixed``,
    already unscaled) gradients: Lightning calls ``configure_gradient_clipping`` once per
    step, after ``GradScaler.unscale_``.
    """

    def __init__(self, cfg: DictConfig | dict) -> None:
        super().__init__(cfg)
        m = self.cfg.method
        _check_crops(self.cfg)
        self.num_local = int(m.num_local_crops)
        self.num_globals, self.num_locals_cand = self.view_counts(self.cfg)
        self.head = self.build_head()
        self.teacher = nn.ModuleDict({"backbone": make_teacher(self.backbone), "head": make_teacher(self.head)})
        self.centering = Centering(m.out_dim, m.center_momentum)
        self.teacher_reuse = bool(m.get("teacher_reuse", True)) and not has_batchnorm(self.teacher)
        self._selection: dict[str, Any] | None = None
        self._ema_step = 0

    def build_head(self) -> DINOHead:
        """The student head (the teacher's is a copy); a hook so iBOT can add patch outputs."""
        m = self.cfg.method
        return DINOHead(self.backbone.feature_dim, m.out_dim, m.head_hidden_dim, m.bottleneck_dim, m.head_layers,
                        m.use_bn_in_head, m.norm_last_layer)

    # --- views ------------------------------------------------------------------------------
    @classmethod
    def view_counts(cls, cfg: DictConfig) -> tuple[int, int]:
        """(global, local) views per image in the loader; a hook so iBOT can keep its locals
        out of the candidates. DINO: :func:`candidate_counts`."""
        return candidate_counts(cfg)

    @classmethod
    def view_augs(cls, cfg: DictConfig) -> tuple[ViewAug, ...]:
        """DINO's multi-crop: two asymmetric global pipelines (1: blur p=1; 2: blur p=0.1,
        solarize p=0.2) at ``data.crop_size`` and scale ``method.global_scale``, and locals
        (blur p=0.5) at ``method.local_crop_size`` and ``method.local_scale``. Flip,
        jitter, grayscale and normalisation come from ``data``; jitter saturation from
        ``method.jitter_saturation``. With HVP, global candidates alternate the two pipelines."""
        m = cfg.method
        _check_crops(cfg)
        base = dataclasses.replace(view_aug(cfg.data), saturation=float(m.jitter_saturation))
        glob = [dataclasses.replace(base, size=int(cfg.data.crop_size), scale=tuple(m.global_scale),
                                    blur_p=float(m.global_blur_p[i]), solarize_p=float(m.global_solarize_p[i]))
                for i in range(2)]
        loc = dataclasses.replace(base, size=int(m.local_crop_size), scale=tuple(m.local_scale),
                                  blur_p=float(m.local_blur_p), solarize_p=0.0)
        g, lc = cls.view_counts(cfg)
        return tuple(glob[i % 2] for i in range(g)) + (loc,) * lc

    # --- forward ----------------------------------------------------------------------------
    @staticmethod
    def _forward(backbone: nn.Module, head: nn.Module, crops: Sequence[torch.Tensor], group: int) -> list[torch.Tensor]:
        """Head outputs per crop; ``group`` consecutive crops share one forward (as DINO's
        multi-crop wrapper batches same-size crops), so BatchNorm sees the same batch sizes
        in the selection pass as in the training step."""
        out: list[torch.Tensor] = []
        group = max(1, group)
        for i in range(0, len(crops), group):
            chunk = crops[i:i + group]
            out += list(head(backbone(torch.cat(list(chunk)))).chunk(len(chunk)))
        return out

    def teacher_temp(self) -> float:
        m = self.cfg.method
        return teacher_temperature(self.current_epoch, m.teacher_temp, m.warmup_teacher_temp,
                                   int(m.warmup_teacher_temp_epochs))

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
        loss = dino_loss(teacher_out, student_out, self.centering.center, tau_t, self.cfg.method.student_temp).mean()
        # After the loss, as DINO; applied once per optimiser step (on_train_batch_end).
        self.centering.accumulate(torch.stack([t.detach() for t in teacher_out]))
        b = globals_[0].shape[0]
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=b)
        self.log("train/teacher_temp", tau_t, on_step=True, on_epoch=False, batch_size=b)
        return loss

    # --- HVP hooks --------------------------------------------------------------------------
    def candidate_scores(self, batch: dict[str, Any]) -> torch.Tensor:
        views = batch["views"]
        g = self.num_globals
        globals_, locals_ = list(views[:g]), list(views[g:])
        teacher = torch.stack(self._forward(self.teacher.backbone, self.teacher.head, globals_, 2))  # [G, B, K]
        student = self._forward(self.backbone, self.head, globals_, 2)
        student += self._forward(self.backbone, self.head, locals_, self.num_local)
        ce = dino_ce_table(teacher, torch.stack(student), self.centering.center, self.teacher_temp(),
                           self.cfg.method.student_temp)
        table = dino_combination_table(ce, g, self.num_local, self.hvp.mode, self.hvp.max_combinations,
                                       self._locals_generator(), self.hvp.global_pairs)
        reuse = self.teacher_reuse and self.selection_outputs_reusable()
        self._selection = {"key": views[0], "pairs": table.pairs, "locals": table.locals,
                           "teacher": teacher if reuse else None}
        return table.loss

    def select_views(self, batch: dict[str, Any], choice: torch.Tensor) -> dict[str, Any]:
        """The chosen 2 globals + L locals of each sample, in the baseline's view layout.

        Without a fresh selection (HVP's off-steps), the first combination: global
        candidates 0 and 1 (one of each pipeline) and the first L local candidates."""
        sel, self._selection = self._selection, None
        views, g, n_loc = batch["views"], self.num_globals, self.num_local
        bsz = choice.shape[0]
        b = torch.arange(bsz, device=choice.device)
        if sel is not None and sel["key"] is views[0]:
            pair, locs = sel["pairs"][b, choice], sel["locals"][b, choice]
        else:
            sel = None
            pair = torch.tensor([0, 1], device=choice.device).expand(bsz, 2)
            locs = torch.arange(n_loc, device=choice.device).expand(bsz, n_loc)
        glob = torch.stack(list(views[:g]))
        out_views = [glob[pair[:, 0], b], glob[pair[:, 1], b]]
        if n_loc:
            loc = torch.stack(list(views[g:]))
            out_views += [loc[locs[:, s], b] for s in range(n_loc)]
        out = dict(batch, views=out_views)
        out.pop("teacher_out", None)
        if sel is not None and sel["teacher"] is not None:
            t = sel["teacher"]
            out["teacher_out"] = [t[pair[:, 0], b], t[pair[:, 1], b]]
        if "params" in batch:  # augmentation parameters travel with their views
            idx = torch.cat([pair, g + locs], dim=1)  # [B, 2 + L] view positions
            out["params"] = {k: p[b.to(p.device)[:, None], idx.to(p.device)] for k, p in batch["params"].items()}
        return out

    def _locals_generator(self) -> torch.Generator | None:
        """Private generator for random local picks / sampled combinations, so they neither
        consume nor mirror the global RNG stream (the selection pass restores that anyway)."""
        if self.hvp.mode != "random" and self.hvp.max_combinations is None:
            return None
        return torch.Generator().manual_seed(stable_seed(self.seed, self.global_step, self.global_rank, 1,
                                                          self.hvp_batch_idx))

    # --- optimisation -------------------------------------------------------------------------
    def param_groups(self) -> list[dict[str, Any]]:
        """Student parameters; biases and norm weights without weight decay (as DINO)."""
        reg, no_reg = [], []
        for name, p in self.named_parameters():
            if not p.requires_grad or name.startswith("teacher."):
                continue
            (no_reg if p.ndim <= 1 or name.endswith(".bias") else reg).append(p)
        return [{"params": reg, "wd_schedule": True}, {"params": no_reg, "weight_decay": 0.0}]

    def on_train_start(self) -> None:
        self._ema_step = self.trainer.global_step

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Cosine weight-decay schedule ``weight_decay -> weight_decay_end`` (DINO), per step."""
        opt_cfg = self.cfg.method.optimizer
        end = opt_cfg.get("weight_decay_end")
        if end is None or not opt_cfg.weight_decay:
            return
        total = max(1, int(self.trainer.estimated_stepping_batches))
        wd = opt_cfg.weight_decay * warmup_cosine(self.trainer.global_step, total, 0, end / opt_cfg.weight_decay)
        for group in self.optimizers().param_groups:  # type: ignore[union-attr]
            if group.get("wd_schedule"):
                group["weight_decay"] = wd

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        # Lightning's clipping (a no-op unless trainer.gradient_clip_val is set), then DINO's.
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)  # type: ignore[arg-type]
        self.clip_and_freeze_gradients()

    def clip_and_freeze_gradients(self) -> None:
        """DINO's per-parameter clipping (``method.clip_grad``, 0 = off), then the head's last
        layer gets no update during the first ``method.freeze_last_layer`` epochs (DINO's
        stabiliser; its gradients are dropped, so AdamW skips it, weight decay included)."""
        clip = float(self.cfg.method.get("clip_grad") or 0.0)
        if clip > 0:
            clip_gradients_per_parameter([p for p in self.parameters() if p.requires_grad], clip)
        if self.current_epoch < int(self.cfg.method.get("freeze_last_layer", 0)):
            for name, p in self.head.named_parameters():  # every output layer (iBOT: last_layer2 too)
                if name.startswith("last_layer"):
                    p.grad = None

    def on_train_batch_end(self, outputs: Any, batch: dict[str, Any], batch_idx: int) -> None:
        """Centres and EMA teacher once per optimiser step (not per micro-batch under
        accumulation): Lightning has just stepped iff ``global_step`` moved."""
        super().on_train_batch_end(outputs, batch, batch_idx)
        step = self.trainer.global_step
        if step == self._ema_step:
            return
        self._ema_step = step
        for centering in (m for m in self.modules() if isinstance(m, Centering)):  # iBOT: patch centre too
            centering.step()
        total = max(1, int(self.trainer.estimated_stepping_batches))
        momentum = cosine_momentum(step - 1, total, self.cfg.method.momentum_teacher)
        ema_update(self.teacher.backbone, self.backbone, momentum)
        ema_update(self.teacher.head, self.head, momentum)
        self.log("train/teacher_momentum", momentum, on_step=True, on_epoch=False, batch_size=1)

    @property
    def eval_backbone(self) -> nn.Module:
        """DINO evaluates the teacher (it is the better model, DINO paper sec. 5.4)."""
        return self.teacher.backbone
