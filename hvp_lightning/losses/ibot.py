"""iBOT's loss per sample (Zhou et al., ICLR 2022, https://arxiv.org/abs/2111.07832).

Per sample, ``l_b = lambda1 * CLS_b + lambda2 * (M_b(g1) + M_b(g2)) / 2``: ``CLS_b`` is DINO's
bracket (:func:`~hvp_lightning.losses.dino.dino_loss`), ``M_b(g)`` the cross-entropy between
teacher and student patch tokens of the same global g, averaged over g's masked tokens
(:func:`ibot_patch_loss`). The batch mean of ``l_b`` is exactly the official ``iBOTLoss``.
``M_b`` is unary in the global, so the exact table over global pairs
(:func:`ibot_pair_table`) is one DINO cross-entropy table plus G patch terms.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .dino import combination_loss, dino_loss, student_log_probs, teacher_probs


def ibot_patch_loss(
    teacher_patch_logits: torch.Tensor,
    student_patch_logits: torch.Tensor,
    mask: torch.Tensor,
    center2: torch.Tensor,
    tau_t: float,
    tau_s: float,
) -> torch.Tensor:
    """Masked-token mean cross-entropy ``M_b`` of one global view, per sample ``[B]``.

    Teacher and student patch logits ``[B, N, K]`` of the same view; ``mask`` ``[B, N]`` or
    ``[B, h, w]``. As official iBOT: the sum over masked tokens of
    ``-softmax((t - c2)/tau_t) . log_softmax(s/tau_s)`` over the number of masked tokens
    (clamped to >= 1, so an unmasked image contributes 0)."""
    with torch.autocast(teacher_patch_logits.device.type, enabled=False):  # rank the loss in fp32
        ce = -(
            teacher_probs(teacher_patch_logits, center2, tau_t) * student_log_probs(student_patch_logits, tau_s)
        ).sum(-1)  # [B, N]
        m = mask.flatten(1).to(ce.dtype)
        return (ce * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def ibot_loss_terms(
    teacher_cls: Sequence[torch.Tensor],
    student_cls: Sequence[torch.Tensor],
    teacher_patch: Sequence[torch.Tensor],
    student_patch: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor],
    center: torch.Tensor,
    center2: torch.Tensor,
    tau_t: float,
    tau_t2: float,
    tau_s: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unweighted per-sample terms ``(CLS_b, mean_i M_b(i))``, each ``[B]`` (see module doc).

    ``teacher_cls``/``teacher_patch``/``student_patch``/``masks``: the globals (same order);
    ``student_cls``: the globals then the locals."""
    if not len(teacher_patch) == len(student_patch) == len(masks) == len(teacher_cls):
        raise ValueError("one teacher/student patch output and one mask per global view")
    cls = dino_loss(teacher_cls, student_cls, center, tau_t, tau_s)
    patch = torch.stack(
        [ibot_patch_loss(t, s, m, center2, tau_t2, tau_s) for t, s, m in zip(teacher_patch, student_patch, masks)]
    ).mean(0)
    return cls, patch


def ibot_loss(
    teacher_cls: Sequence[torch.Tensor],
    student_cls: Sequence[torch.Tensor],
    teacher_patch: Sequence[torch.Tensor],
    student_patch: Sequence[torch.Tensor],
    masks: Sequence[torch.Tensor],
    center: torch.Tensor,
    center2: torch.Tensor,
    tau_t: float,
    tau_t2: float,
    tau_s: float,
    lambda1: float = 1.0,
    lambda2: float = 1.0,
) -> torch.Tensor:
    """Official iBOT loss per sample ``[B]``: ``lambda1 * CLS_b + lambda2 * mean_i M_b(i)``;
    its ``.mean()`` is the official batch loss (CLS over ``2L + 2`` terms, patch over 2).

    Args:
        teacher_cls: Teacher CLS logits of the 2 globals, each ``(B, K)``.
        student_cls: Student CLS logits of the 2 globals then the L locals, each ``(B, K)``.
        teacher_patch: Teacher patch logits of the globals, each ``(B, N, K2)`` (N patch tokens).
        student_patch: Student patch logits of the (masked) globals, each ``(B, N, K2)``.
        masks: One boolean mask per global, ``(B, N)`` or ``(B, h, w)``; True = masked token.
        center: CLS teacher centre ``(1, K)``.
        center2: Patch teacher centre ``(1, K2)``.
        tau_t: CLS teacher temperature.
        tau_t2: Patch teacher temperature.
        tau_s: Student temperature.
        lambda1: Weight of the CLS term.
        lambda2: Weight of the masked-patch term.

    Returns:
        ``(B,)`` float32 on the logits' device.

    Raises:
        ValueError: If the teacher/student patch outputs, masks and teacher CLS outputs differ in number.
    """
    cls, patch = ibot_loss_terms(
        teacher_cls, student_cls, teacher_patch, student_patch, masks, center, center2, tau_t, tau_t2, tau_s
    )
    return lambda1 * cls + lambda2 * patch


def ibot_pair_table(
    ce: torch.Tensor, patch_terms: torch.Tensor, pairs: torch.Tensor, lambda1: float = 1.0, lambda2: float = 1.0
) -> torch.Tensor:
    """Per-sample loss of each global pair ``pairs`` ``[P, 2]`` (:func:`global_pair_index`)
    with the fixed locals: ``[B, P]``, one column per row of ``pairs``.

    ``ce`` ``[B, G, G + L]`` is DINO's CLS cross-entropy table (teacher global -> student
    global/local, :func:`dino_ce_table`), ``patch_terms`` ``[B, G]`` the ``M_b(g)``. Entry
    (b, (g1, g2)) = ``lambda1 * CLS bracket / (2L + 2) + lambda2 * (M_b(g1) + M_b(g2)) / 2``
    = :func:`ibot_loss` of that pair.

    Args:
        ce: CLS cross-entropy table ``(B, G, G + L)`` from :func:`dino_ce_table`.
        patch_terms: Masked-patch term of each global ``(B, G)``.
        pairs: Candidate global pairs ``(P, 2)`` (int64, any device; moved to ``ce``'s).
        lambda1: Weight of the CLS term.
        lambda2: Weight of the masked-patch term.

    Returns:
        ``(B, P)`` on ``ce``'s device, one column per row of ``pairs``.
    """
    bsz, g, v = ce.shape
    pairs = pairs.to(ce.device)
    locals_ = torch.arange(v - g, device=ce.device).expand(bsz, pairs.shape[0], v - g)
    cls = combination_loss(ce, pairs.expand(bsz, -1, -1), locals_, g)
    g1, g2 = pairs.unbind(1)
    return lambda1 * cls + lambda2 * (patch_terms[:, g1] + patch_terms[:, g2]) / 2
