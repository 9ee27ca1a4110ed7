"""Teacher-side machinery of self-distillation methods (DINO, iBOT), written once.

* :func:`make_teacher` / :func:`ema_update` / :func:`cosine_momentum`: the momentum
  teacher, an exponential moving average of the student with momentum rising 0.996 -> 1
  on a cosine over training (DINO paper, sec. 3.1);
* :func:`teacher_temperature`: the linear teacher-temperature warm-up (per epoch);
* :class:`Centering`: the running centre subtracted from teacher logits (avoids collapse
  to one dimension); it is updated *after* the loss of a step, once per optimiser step, from
  the teacher outputs of all that step's micro-batches, averaged over all ranks;
* :func:`clip_gradients_per_parameter`: upstream DINO's and iBOT's clipping, each parameter on
  its own (``method.clip_grad_kind: per_parameter``; ``global``: one norm over all of them, as
  the HVP code's DINO, torch's ``clip_grad_norm_``);
* :class:`MomentumTargetMixin`: the LightningModule side of any momentum (EMA) target --
  DINO/iBOT's teacher, BYOL's target network, MoCo v3's momentum encoder: moved once per
  optimiser step on the cosine momentum schedule;
* :class:`TeacherStudentMixin`: DINO's self-distillation on top of it -- teacher built from
  the student, centres once per optimiser step, weight-decay schedule, clipping and
  last-layer freeze, evaluation of the teacher.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.profiler import record_function

from .optim import split_weight_decay, warmup_cosine


def make_teacher(student: nn.Module) -> nn.Module:
    """A frozen copy of ``student``: no gradients, no stochastic depth, no dropout.

    The official DINO teacher is built without drop-path; copying the student and
    switching its stochastic layers off gives the same network with identical weights.
    """
    teacher = copy.deepcopy(student)
    teacher.requires_grad_(False)
    for m in teacher.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        elif hasattr(m, "drop_prob"):  # timm DropPath (stochastic depth)
            m.drop_prob = 0.0
    return teacher


def has_batchnorm(module: nn.Module) -> bool:
    """True if outputs depend on batch composition (so a teacher forward cannot be reused):
    BatchNorm, or any other norm that keeps running statistics of its batches (timm's EvoNorm
    B variants normalise by the batch variance in training)."""
    return any(
        isinstance(m, _BatchNorm) or any(n.startswith("running_") for n, _ in m.named_buffers(recurse=False))
        for m in module.modules()
    )


def cosine_momentum(step: int, total: int, base: float = 0.996, final: float = 1.0) -> float:
    """EMA momentum of optimiser step ``step`` (0-based) out of ``total``: cosine base -> final."""
    progress = min(1.0, max(0.0, step / max(1, total)))
    return final - (final - base) * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """``teacher <- m * teacher + (1 - m) * student`` over parameters (buffers are the
    teacher's own, as in DINO). Both modules must have the same parameter order."""
    t_params = list(teacher.parameters())
    s_params = [p.detach() for p in student.parameters()]
    if len(t_params) != len(s_params):
        raise ValueError("teacher and student have different parameter lists")
    torch._foreach_mul_(t_params, momentum)
    torch._foreach_add_(t_params, s_params, alpha=1.0 - momentum)


def teacher_temperature(epoch: int, temp: float, warmup_temp: float, warmup_epochs: int) -> float:
    """Teacher softmax temperature at ``epoch``: linear ``warmup_temp -> temp`` over the first
    ``warmup_epochs`` epochs (endpoints included, like DINO's ``np.linspace``), then ``temp``."""
    if epoch >= warmup_epochs:
        return temp
    if warmup_epochs == 1:
        return warmup_temp
    return warmup_temp + (temp - warmup_temp) * epoch / (warmup_epochs - 1)


class Centering(nn.Module):
    """Running centre ``c`` of teacher logits: ``c <- m c + (1 - m) mean(teacher logits)``.

    ``center`` has shape ``[1, dim]`` and broadcasts over ``[B, dim]`` (DINO's CLS) and
    ``[B, N, dim]`` (iBOT's patch tokens). The mean is over every leading dimension and all
    ranks, so each process keeps the same centre under DDP.

    Gradient accumulation: :meth:`accumulate` adds a micro-batch's outputs to a pending sum
    and :meth:`step` applies it once per optimiser step, so k micro-batches of B move the
    centre exactly as one batch of kB does (one EMA step, one all-reduce). :meth:`update`
    is both at once.
    """

    center: torch.Tensor

    def __init__(self, dim: int, momentum: float = 0.9) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("center", torch.zeros(1, dim))
        self._pending: torch.Tensor | None = None  # [sum of logits..., count] since the last step

    @torch.no_grad()
    def accumulate(self, teacher_logits: torch.Tensor | Iterable[torch.Tensor]) -> None:
        """Add teacher outputs to the pending update (no communication, centre unchanged)."""
        parts = [teacher_logits] if isinstance(teacher_logits, torch.Tensor) else list(teacher_logits)
        dim = parts[0].shape[-1]
        # Column sums in fp32 per tensor: no concatenated or fp32 copy of the (large) logits.
        total = sum(t.detach().reshape(-1, dim).sum(0, dtype=torch.float32) for t in parts)
        count = sum(t.numel() // dim for t in parts)
        stats = torch.cat([total, torch.full((1,), float(count), device=total.device)])  # no host-to-device copy
        self._pending = stats if self._pending is None else self._pending + stats

    @torch.no_grad()
    def step(self) -> None:
        """Move the centre towards the mean of everything accumulated since the last step."""
        if self._pending is None:
            return
        stats, self._pending = self._pending, None
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(stats)
        batch_center = (stats[:-1] / stats[-1]).to(self.center.dtype)
        self.center.mul_(self.momentum).add_(batch_center[None], alpha=1.0 - self.momentum)

    def update(self, teacher_logits: torch.Tensor | Iterable[torch.Tensor]) -> None:
        """One step from these outputs alone (no accumulation)."""
        self.accumulate(teacher_logits)
        self.step()


def clip_gradients_per_parameter(params: Sequence[nn.Parameter], clip: float) -> None:
    """DINO's clipping: each parameter's gradient is rescaled to norm <= ``clip`` on its own
    (``clip / (norm + 1e-6)``, at most 1), with torch's multi-tensor kernels: a handful of
    launches for all parameters instead of two per parameter (a ViT-S has ~150)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    scale = torch._foreach_add(torch._foreach_norm(grads), 1e-6)
    torch._foreach_reciprocal_(scale)
    torch._foreach_mul_(scale, clip)
    torch._foreach_clamp_max_(scale, 1.0)
    torch._foreach_mul_(grads, scale)


class MomentumTargetMixin(L.LightningModule):
    """Momentum (EMA) targets moved once per optimiser step: ``target <- m target + (1 - m) online``
    for each pair of :meth:`momentum_pairs`, ``m`` rising from ``settings.<momentum_key>`` to 1
    on a cosine over training (:func:`cosine_momentum`; DINO sec. 3.1, BYOL sec. 3.2, MoCo v3
    ``--moco-m-cos``).

    Once per optimiser step, not per micro-batch: under ``trainer.accumulate_grad_batches=k``
    every micro-batch of a step sees the same target (Lightning has just stepped iff
    ``global_step`` moved, checked in :meth:`on_train_batch_end`). HVP's selection pass never
    moves it (only this hook does). Put the mixin before ``HardViewMixin, SSLMethod``.
    """

    settings: Any  # the method's settings (hvp_lightning/settings/)
    momentum_key = "momentum_teacher"  # settings.<key>: the base momentum
    momentum_log = "train/teacher_momentum"
    # Which step's momentum the update after optimiser step s (0-based) uses: that step's own
    # (lag 1: DINO, BYOL update the target after the online step with tau of that step), or the
    # next step's (lag 0: MoCo v3 moves its momentum encoder at the start of each step).
    momentum_lag = 1

    def momentum_pairs(self) -> list[tuple[nn.Module, nn.Module]]:  # pragma: no cover
        """``(target, online)`` module pairs with the same parameter order."""
        raise NotImplementedError(f"{type(self).__name__} must provide momentum_pairs()")

    def momentum_at(self, step: int) -> float:
        """EMA momentum of the update made once ``step`` optimiser steps are done."""
        total = max(1, int(self.trainer.estimated_stepping_batches))
        return cosine_momentum(step - self.momentum_lag, total, float(getattr(self.settings, self.momentum_key)))

    def on_optimizer_step_done(self, step: int) -> None:
        """Once per optimiser step, ``step`` = steps done: move every target."""
        momentum = self.momentum_at(step)
        for target, online in self.momentum_pairs():
            ema_update(target, online, momentum)
        self.log(self.momentum_log, momentum, on_step=True, on_epoch=False, batch_size=1)

    def on_train_start(self) -> None:
        super().on_train_start()
        self._ema_step = self.trainer.global_step

    def on_train_batch_end(self, outputs: Any, batch: dict[str, Any], batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        step = self.trainer.global_step
        if step == getattr(self, "_ema_step", 0):
            return
        self._ema_step = step
        self.on_optimizer_step_done(step)


class TeacherStudentMixin(MomentumTargetMixin):
    """Self-distillation around a method's loss, written once for DINO and iBOT.

    The host has a student ``backbone`` and ``head`` and ``settings`` with DINO's keys
    (:class:`~hvp_lightning.settings.dino.TeacherStudentSettings`: ``momentum_teacher``, ``teacher_temp``,
    ``warmup_teacher_temp(_epochs)``, ``teacher_reuse``, ``clip_grad(_kind)``, ``freeze_last_layer``,
    ``optimizer.weight_decay(_end)``),
    calls :meth:`init_teacher` once its head exists, and feeds its :class:`Centering` modules
    with :meth:`Centering.accumulate` after each loss. Put the mixin first:
    ``class DINO(TeacherStudentMixin, HardViewMixin, SSLMethod)``.

    Gradient accumulation (``trainer.accumulate_grad_batches=k``): EMA teacher, centres,
    weight-decay and momentum schedules advance once per optimiser step
    (:meth:`on_train_batch_end`, ``global_step``); every micro-batch of a step sees the same
    teacher, centre and temperatures, and the centre moves by the mean over all k
    micro-batches' teacher outputs, so without BatchNorm k x B equals one step of kB.
    Clipping and the last-layer freeze act on the accumulated (and, under ``16-mixed``,
    already unscaled) gradients: Lightning calls ``configure_gradient_clipping`` once per
    step, after ``GradScaler.unscale_``.
    """

    backbone: nn.Module
    head: nn.Module
    teacher: nn.ModuleDict

    def init_teacher(self) -> None:
        """The teacher (frozen copies of backbone and head) and whether its outputs may be
        reused from HVP's selection pass: only without BatchNorm, whose outputs depend on the
        batch they were normalised with."""
        self.teacher = nn.ModuleDict({"backbone": make_teacher(self.backbone), "head": make_teacher(self.head)})
        self.teacher_reuse = self.settings.teacher_reuse and not has_batchnorm(self.teacher)

    def teacher_temp(self) -> float:
        m = self.settings
        return teacher_temperature(
            self.current_epoch, m.teacher_temp, m.warmup_teacher_temp, int(m.warmup_teacher_temp_epochs)
        )

    # --- optimisation -------------------------------------------------------------------------
    def param_groups(self) -> list[dict[str, Any]]:
        """Student parameters; biases and norm weights without weight decay (as DINO)."""
        reg, no_reg = split_weight_decay((n, p) for n, p in self.named_parameters() if not n.startswith("teacher."))
        return [{"params": reg, "wd_schedule": True}, {"params": no_reg, "weight_decay": 0.0}]

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Cosine weight-decay schedule ``weight_decay -> weight_decay_end`` (DINO), per step."""
        opt = self.settings.optimizer
        end = getattr(opt, "weight_decay_end", None)
        if end is None or not opt.weight_decay:
            return
        total = max(1, int(self.trainer.estimated_stepping_batches))
        wd = opt.weight_decay * warmup_cosine(self.trainer.global_step, total, 0, end / opt.weight_decay)
        for group in self.optimizers().param_groups:  # type: ignore[union-attr]
            if group.get("wd_schedule"):
                group["weight_decay"] = wd

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Lightning's clipping (a no-op unless trainer.gradient_clip_val is set), then DINO's.
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)  # type: ignore[arg-type]
        self.clip_and_freeze_gradients()

    def clip_and_freeze_gradients(self) -> None:
        """Clipping (``clip_grad``, 0 = off; ``clip_grad_kind``: one norm over all trained
        parameters, or each on its own), then the head's last layer gets no update during the first
        ``freeze_last_layer`` epochs (DINO's stabiliser; its gradients are dropped after
        the clipping, as both official codes do, so AdamW skips it, weight decay included)."""
        s = self.settings
        clip = float(s.clip_grad or 0.0)
        params = [p for p in self.parameters() if p.requires_grad and p.grad is not None]
        if clip > 0 and s.clip_grad_kind == "global":
            nn.utils.clip_grad_norm_(params, clip)
        elif clip > 0:
            clip_gradients_per_parameter(params, clip)
        if self.current_epoch < s.freeze_last_layer:
            for name, p in self.head.named_parameters():  # every output layer (iBOT: last_layer2 too)
                if name.startswith("last_layer"):
                    p.grad = None

    def momentum_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.teacher["backbone"], self.backbone), (self.teacher["head"], self.head)]

    def on_optimizer_step_done(self, step: int) -> None:
        """Centres first (from all of this step's micro-batches), then the EMA teacher."""
        with record_function("hvp/ema"):  # a profiler range (benchmarks/step_profile.py); free otherwise
            for centering in (m for m in self.modules() if isinstance(m, Centering)):  # iBOT: patch centre too
                centering.step()
            super().on_optimizer_step_done(step)

    @property
    def eval_backbone(self) -> nn.Module:
        """DINO evaluates the teacher (it is the better model, DINO paper sec. 5.4)."""
        return self.teacher["backbone"]
