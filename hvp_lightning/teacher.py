"""Teacher-side machinery of self-distillation methods (DINO, iBOT), written once.

* :func:`make_teacher` / :func:`ema_update` / :func:`cosine_momentum`: the momentum
  teacher, an exponential moving average of the student with momentum rising 0.996 -> 1
  on a cosine over training (DINO paper, sec. 3.1);
* :func:`teacher_temperature`: the linear teacher-temperature warm-up (per epoch);
* :class:`Centering`: the running centre subtracted from teacher logits (avoids collapse
  to one dimension); it is updated *after* the loss of a step, once per optimiser step, from
  the teacher outputs of all that step's micro-batches, averaged over all ranks.
"""

from __future__ import annotations

import copy
import math
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


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
    """True if outputs depend on batch composition (so a teacher forward cannot be reused)."""
    return any(isinstance(m, _BatchNorm) for m in module.modules())


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
        if not isinstance(teacher_logits, torch.Tensor):
            teacher_logits = torch.cat([t.reshape(-1, t.shape[-1]) for t in teacher_logits])
        x = teacher_logits.detach().reshape(-1, teacher_logits.shape[-1]).float()
        stats = torch.cat([x.sum(0), x.new_tensor([float(x.shape[0])])])
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
