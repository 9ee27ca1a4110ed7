"""DINO's loss per sample (Caron et al., ICCV 2021, https://arxiv.org/abs/2104.14294).

With ``q_i = softmax((T_i - c) / tau_t)`` for the two teacher globals and
``log p_j = log_softmax(S_j / tau_s)`` for the student's 2 globals + L locals, a sample's
loss is ``sum_{i, j != i} CE(q_i, p_j) / (2L + 2)``; the batch mean is DINO's loss. For the
hard-view search, :func:`dino_ce_table` gives every teacher -> student cross-entropy at once
and :func:`combination_loss` assembles the bracket of any combination of 2 globals + L
locals from it (the search, :mod:`hvp_lightning.selection.multicrop`, relies on its split
into a pair term and unary local terms).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .precision import exact_fp32


def teacher_probs(t: torch.Tensor, center: torch.Tensor, tau_t: float) -> torch.Tensor:
    return F.softmax((t.float() - center) / tau_t, dim=-1)


def student_log_probs(s: torch.Tensor, tau_s: float) -> torch.Tensor:
    return F.log_softmax(s.float() / tau_s, dim=-1)


def dino_cross_entropy(
    teacher_logits: torch.Tensor, student_logits: torch.Tensor, center: torch.Tensor, tau_t: float, tau_s: float
) -> torch.Tensor:
    """Per-sample ``CE(t->s) = -sum_d softmax((t - c)/tau_t)_d log_softmax(s/tau_s)_d``: ``[B]``."""
    return -(teacher_probs(teacher_logits, center, tau_t) * student_log_probs(student_logits, tau_s)).sum(-1)


def dino_loss(
    teacher_out: Sequence[torch.Tensor],
    student_out: Sequence[torch.Tensor],
    center: torch.Tensor,
    tau_t: float,
    tau_s: float,
) -> torch.Tensor:
    """Official DINO loss per sample ``[B]``: teacher crop i against every student crop
    j != i (student crops 0, 1 are the same globals as the teacher's), averaged over the
    ``2 * (2 + L) - 2 = 2L + 2`` terms. ``.mean()`` of it is the official batch loss.

    Args:
        teacher_out: Teacher logits of the 2 global crops, each ``(B, K)``.
        student_out: Student logits of the 2 globals then the L locals, each ``(B, K)``.
        center: Teacher centre ``(1, K)``, subtracted before the teacher softmax.
        tau_t: Teacher temperature.
        tau_s: Student temperature.

    Returns:
        ``(B,)`` float32 on the logits' device.
    """
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


def dino_ce_table(
    teacher: torch.Tensor, student: torch.Tensor, center: torch.Tensor, tau_t: float, tau_s: float
) -> torch.Tensor:
    """Every teacher/student cross-entropy at once: ``teacher [G, B, K]``, ``student [V, B, K]``
    -> ``[B, G, V]`` with entry (b, g, v) = ``CE_b(g -> v)``.

    Args:
        teacher: Teacher logits of the G candidate globals, ``(G, B, K)``.
        student: Student logits of the G globals then the local crops, ``(V, B, K)``.
        center: Teacher centre ``(1, K)``.
        tau_t: Teacher temperature.
        tau_s: Student temperature.

    Returns:
        ``(B, G, V)`` float32 on ``teacher``'s device (computed in fp32 even under autocast).
    """
    # fp32 even under mixed precision: the argmax must rank the loss the method computes.
    with exact_fp32(teacher.device.type):
        q = teacher_probs(teacher, center, tau_t)
        logp = student_log_probs(student, tau_s)
        return -torch.einsum("gbk,vbk->bgv", q, logp)


def combination_loss(ce: torch.Tensor, pairs: torch.Tensor, locals_: torch.Tensor, num_globals: int) -> torch.Tensor:
    """Loss of combinations ``pairs [B, C, 2]`` + ``locals [B, C, L]`` from a CE table ``[B, G, V]``."""
    b = torch.arange(ce.shape[0], device=ce.device)[:, None]
    g1, g2 = pairs.unbind(-1)
    pair_terms = ce[b, g1, g2] + ce[b, g2, g1]
    j = num_globals + locals_
    local_terms = ce[b[..., None], g1[..., None], j] + ce[b[..., None], g2[..., None], j]
    return (pair_terms + local_terms.sum(-1)) / (2 * locals_.shape[-1] + 2)
