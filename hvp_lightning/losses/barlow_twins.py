"""Barlow Twins' loss (Zbontar, Jing, Misra, LeCun and Deny, ICML 2021, https://arxiv.org/abs/2103.03230)
and its leave-one-out candidate table.

Loss (official code, facebookresearch/barlowtwins ``main.py``): each branch's embeddings are
standardised per feature with the batch mean and biased variance (``BatchNorm1d(affine=False)``,
eps 1e-5; synchronised over all ranks), ``C = x_hat^T y_hat / M`` over the global batch M
(the official code all-reduces the ranks' partial sums), and

    L = sum_i (1 - C_ii)^2 + lambda * sum_{i != j} C_ij^2,        lambda = 0.0051.

The candidate score (docs/DESIGN.md, section 3) is the leave-one-out increase of that batch loss,
times M, when sample b's pair is (k, l) and every other sample keeps its pair (0, 1). The
standardisation depends on sample b too; the table includes that change exactly.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .pairs import pair_index
from .precision import exact_fp32
from .swap import pair_swap

BN_EPS = 1e-5  # torch.nn.BatchNorm1d's default, the official code's


def all_reduce_with_grad(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over all ranks, differentiable: the backward sums the ranks' gradients (so
    with DDP's gradient average the step is the global-batch loss's gradient). Single process: ``x``."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_reduce

    return all_reduce(x.contiguous())


def world_rows(x: torch.Tensor) -> int:
    """Rows of ``x`` summed over all ranks (the loader gives every rank the same batch size)."""
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return x.shape[0] * world


def standardise(z: torch.Tensor, eps: float = BN_EPS) -> torch.Tensor:
    """Per-feature ``(z - mean) / sqrt(var + eps)`` with the global batch's mean and biased variance:
    ``BatchNorm1d(affine=False)`` in training mode, synchronised over the ranks."""
    m = world_rows(z)
    mean = all_reduce_with_grad(z.sum(0)) / m
    var = all_reduce_with_grad((z - mean).pow(2).sum(0)) / m
    return (z - mean) / torch.sqrt(var + eps)


def barlow_twins_loss_terms(
    z1: torch.Tensor, z2: torch.Tensor, eps: float = BN_EPS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum_i (1 - C_ii)^2, sum_{i != j} C_ij^2)`` of projector outputs ``z1``, ``z2`` ``[B, D]``,
    in fp32, over the global batch (the same values on every rank)."""
    with torch.autocast(z1.device.type, enabled=False):
        dtype = torch.promote_types(z1.dtype, torch.float32)  # fp32 at least
        x, y = standardise(z1.to(dtype), eps), standardise(z2.to(dtype), eps)
        c = all_reduce_with_grad(x.T @ y / world_rows(x))
        on_diag = (c.diagonal() - 1).pow(2).sum()
        off_diag = c.pow(2).sum() - c.diagonal().pow(2).sum()
    return on_diag, off_diag


def barlow_twins_loss(z1: torch.Tensor, z2: torch.Tensor, lambd: float = 0.0051, eps: float = BN_EPS) -> torch.Tensor:
    """The official Barlow Twins batch loss: ``on_diag + lambd * off_diag``.

    Args:
        z1, z2: projector outputs of the two views, ``(B, D)``, any float dtype (computed in fp32 at least);
            under DDP the cross-correlation is summed over the ranks.
        lambd: the weight of the off-diagonal (redundancy) term (paper: 0.0051).
        eps: the standardisation's epsilon (``BatchNorm1d``'s).

    Returns:
        The loss, a scalar tensor on ``z1``'s device, the same value on every rank.
    """
    on_diag, off_diag = barlow_twins_loss_terms(z1, z2, eps)
    return on_diag + lambd * off_diag


def barlow_twins_pair_table(
    z: torch.Tensor,
    lambd: float = 0.0051,
    eps: float = BN_EPS,
    reference: tuple[torch.Tensor, torch.Tensor] | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """Leave-one-out score of every candidate pair: ``z`` ``[N, B, D]`` -> ``[B, N(N-1)/2]``.

    Entry (b, c), pair ``(k, l) = pair_index(N)[c]``, is ``M * (L' - L)``: ``L`` the
    :func:`barlow_twins_loss` of the reference batch (``z[0]``, ``z[1]``: every sample on its
    pair (0, 1)), ``L'`` that of the same batch with sample b's rows replaced by ``z[k, b]`` and
    ``z[l, b]`` -- new means, variances and cross-correlation. Column 0 is 0. ``reference``:
    all ranks' pair-(0, 1) embeddings ``([M, D], [M, D])``, this rank's at ``offset`` (DDP).

    How: with scatter diagonals ``s_x, s_y`` and cross scatter ``K`` (:mod:`.swap`), ``C_ij =
    sqrt(p_i q_j) K_ij / M``, ``p = 1 / (s_x / M + eps)``, ``q`` likewise. A swap changes ``p``
    (by the first candidate), ``q`` (by the second) and ``K`` by ``R = a e^T - c f^T - d_x d_y^T / M``,
    so ``sum_ij p_i q_j K'_ij^2 = p^T (K*K) q + 2 sum_r s_r (p*u_r)^T K (q*v_r) + sum_rt s_r s_t
    (p.u_r u_t)(q.v_r v_t)`` over R's three rank-one terms: four ``[B*N, D] x [D, D]`` products.
    The first term is taken as its change from the reference (no cancellation of large sums).

    Args:
        z: candidate embeddings ``(N, B, D)``: N views of this rank's B samples.
        lambd, eps: as in :func:`barlow_twins_loss`.
        reference: under DDP, all ranks' pair-(0, 1) embeddings ``((M, D), (M, D))``; None: ``z[0], z[1]`` (M = B).
        offset: the row of this rank's first sample in ``reference``.

    Returns:
        ``(B, N(N-1)/2)`` scores in fp32 (fp64 for fp64 input), columns in :func:`pair_index` order.
    """
    n = z.shape[0]
    with exact_fp32(z.device.type):
        pair = pair_swap(z, reference, offset)
        sx, sy = pair.first, pair.second
        m = sx.m
        cross = sx.centred.T @ sy.centred  # K [D, D]
        w = cross * cross
        p0, q0 = 1 / (sx.sq_old / m + eps), 1 / (sy.sq_old / m + eps)  # [D]
        p, q = 1 / (sx.sq_new / m + eps), 1 / (sy.sq_new / m + eps)  # [B, N, D]
        hp, hq = p - p0, q - q0
        # change of p^T W q: hp.(W q0) + (W^T p0).hq + hp^T W hq, [B, N(first), N(second)]
        frob = (hp @ (w @ q0))[:, :, None] + (hq @ (w.T @ p0))[:, None, :] + torch.einsum("bkd,bld->bkl", hp, hq @ w.T)
        us = (sx.new, sx.old.expand_as(sx.new), sx.step)
        vs = (sy.new, sy.old.expand_as(sy.new), sy.step)
        signs = (1.0, -1.0, -1.0 / m)
        for s, u, v in zip(signs, us, vs):
            frob = frob + 2 * s * torch.einsum("bkd,bld->bkl", p * u, (q * v) @ cross.T)
        for s, u, v in zip(signs, us, vs):
            for t, u2, v2 in zip(signs, us, vs):
                frob = frob + s * t * ((p * u * u2).sum(-1)[:, :, None] * (q * v * v2).sum(-1)[:, None, :])
        k, l = pair_index(n, device=z.device).unbind(1)
        diag_old = torch.sqrt(p0 * q0) * cross.diagonal() / m  # [D]
        k_diag = (
            cross.diagonal() + sx.new[:, k] * sy.new[:, l] - sx.old * sy.old - sx.step[:, k] * sy.step[:, l] / m
        )  # [B, P, D]
        diag_new = torch.sqrt(p[:, k] * q[:, l]) * k_diag / m
        on_diag = ((1 - diag_new).pow(2) - (1 - diag_old).pow(2)).sum(-1)
        off_diag = frob[:, k, l] / m**2 - (diag_new.pow(2) - diag_old.pow(2)).sum(-1)
        return m * (on_diag + lambd * off_diag)
