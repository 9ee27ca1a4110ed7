"""VICReg's loss (Bardes, Ponce and LeCun, ICLR 2022, https://arxiv.org/abs/2105.04906) and its
leave-one-out candidate table.

Loss (official code, facebookresearch/vicreg ``main_vicreg.py``), embeddings ``x, y`` ``[M, D]``:

    lambda * mean((x - y)^2)                                         invariance (MSE)
    + mu * [mean_j relu(1 - sqrt(var_j(x) + 1e-4)) + (same for y)] / 2   variance (unbiased var)
    + nu * [sum_{i!=j} cov_ij(x)^2 + (same for y)] / D                covariance (cov = centred x^T x / (M-1))

with lambda = mu = 25, nu = 1. Under DDP the invariance term is each rank's own mean (DDP's
gradient average makes it the global one) and variance and covariance are taken over the
embeddings of all ranks (the official ``FullGatherLayer``).

The loss is a function of the whole batch, so a sample has no loss of its own. The candidate
score (docs/DESIGN.md, section 3) of sample b on pair (k, l) is the leave-one-out increase of the
batch loss when b's pair is (k, l) and every other sample of the (global) batch keeps its first
candidate pair (0, 1), times the batch size M: ``M * (L(b -> (k, l)) - L(all (0, 1)))``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .pairs import pair_index
from .precision import exact_fp32
from .simclr import gather_with_grad
from .swap import RowSwap, pair_swap

VAR_EPS = 1e-4  # official: sqrt(var + 0.0001)


def off_diagonal_sq(c: torch.Tensor) -> torch.Tensor:
    """Sum of the squared off-diagonal entries of a square matrix."""
    return c.pow(2).sum() - c.diagonal().pow(2).sum()


def vicreg_loss_terms(z1: torch.Tensor, z2: torch.Tensor, gather: bool = False) -> tuple[torch.Tensor, ...]:
    """The three unweighted VICReg terms (invariance, variance, covariance) of views ``z1``,
    ``z2`` ``[B, D]``, in fp32; ``gather=True`` takes variance and covariance over all ranks."""
    with torch.autocast(z1.device.type, enabled=False):
        dtype = torch.promote_types(z1.dtype, torch.float32)  # fp32 at least
        x, y = z1.to(dtype), z2.to(dtype)
        invariance = F.mse_loss(x, y)
        if gather:
            x, _ = gather_with_grad(x)
            y, _ = gather_with_grad(y)
        m, d = x.shape
        x, y = x - x.mean(0), y - y.mean(0)
        std_x, std_y = torch.sqrt(x.var(0) + VAR_EPS), torch.sqrt(y.var(0) + VAR_EPS)
        variance = F.relu(1 - std_x).mean() / 2 + F.relu(1 - std_y).mean() / 2
        covariance = (off_diagonal_sq(x.T @ x / (m - 1)) + off_diagonal_sq(y.T @ y / (m - 1))) / d
    return invariance, variance, covariance


def vicreg_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    sim_coeff: float = 25.0,
    std_coeff: float = 25.0,
    cov_coeff: float = 1.0,
    gather: bool = False,
) -> torch.Tensor:
    """The official VICReg batch loss of two views.

    Args:
        z1, z2: expander outputs of the two views, ``(B, D)``, any float dtype (computed in fp32 at least).
        sim_coeff, std_coeff, cov_coeff: the weights lambda, mu, nu of the invariance, variance
            and covariance terms (paper: 25, 25, 1).
        gather: take variance and covariance over the embeddings of every rank (DDP).

    Returns:
        The loss, a scalar tensor on ``z1``'s device.
    """
    inv, var, cov = vicreg_loss_terms(z1, z2, gather)
    return sim_coeff * inv + std_coeff * var + cov_coeff * cov


def branch_increase(swap: RowSwap, std_coeff: float, cov_coeff: float) -> torch.Tensor:
    """``[B, N]``: increase of one branch's variance + covariance terms (weighted) when sample
    b's row is candidate n, from ``S' = S + a a^T - c c^T - d d^T / M`` (:mod:`.swap`).

    ``||S'||_F^2 - ||S||_F^2 = 2 (a^T S a - c^T S c - d^T S d / M) + ||a a^T - c c^T - d d^T / M||_F^2``,
    the last term from the Gram entries of a, c, d: one ``[B*N, D] x [D, D]`` product in all.
    """
    m, dim = swap.m, swap.sq_old.shape[0]
    scatter = swap.centred.T @ swap.centred
    a, c, d = swap.new, swap.old, swap.step

    def hinge(sq: torch.Tensor) -> torch.Tensor:
        return F.relu(1 - torch.sqrt(sq / (m - 1) + VAR_EPS))

    variance = std_coeff / (2 * dim) * (hinge(swap.sq_new) - hinge(swap.sq_old)).sum(-1)
    sa, sc = a @ scatter, c @ scatter
    quad = (a * sa).sum(-1) - (c * sc).sum(-1) - (d * (sa - sc)).sum(-1) / m
    aa, cc, dd = (a * a).sum(-1), (c * c).sum(-1), (d * d).sum(-1)
    ac, ad, cd = (a * c).sum(-1), (a * d).sum(-1), (c * d).sum(-1)
    rank3 = aa**2 + cc**2 + dd**2 / m**2 - 2 * ac**2 - 2 * ad**2 / m + 2 * cd**2 / m
    diagonal = ((swap.sq_new - swap.sq_old) * (swap.sq_new + swap.sq_old)).sum(-1)
    covariance = cov_coeff / (dim * (m - 1) ** 2) * (2 * quad + rank3 - diagonal)
    return variance + covariance


def vicreg_pair_table(
    z: torch.Tensor,
    sim_coeff: float = 25.0,
    std_coeff: float = 25.0,
    cov_coeff: float = 1.0,
    reference: tuple[torch.Tensor, torch.Tensor] | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """Leave-one-out score of every candidate pair: ``z`` ``[N, B, D]`` -> ``[B, N(N-1)/2]``.

    Entry (b, c), pair ``(k, l) = pair_index(N)[c]``, is ``M * (L' - L)`` with ``L`` the
    :func:`vicreg_loss` of the reference batch (every sample on its pair (0, 1): ``z[0]``,
    ``z[1]``) and ``L'`` that of the same batch with sample b's rows replaced by ``z[k, b]``
    (first branch) and ``z[l, b]`` (second). Column 0 is 0. ``reference`` ``([M, D], [M, D])``:
    all ranks' pair-(0, 1) embeddings with this rank's at ``offset`` (DDP; the invariance
    term is then the global mean, as DDP's gradient average makes it).

    Exact, vectorised: the invariance change is per sample; each branch's variance and
    covariance change depends only on the candidate in that branch (:func:`branch_increase`).

    Args:
        z: candidate embeddings ``(N, B, D)``: N views of this rank's B samples.
        sim_coeff, std_coeff, cov_coeff: the loss weights of :func:`vicreg_loss`.
        reference: under DDP, all ranks' pair-(0, 1) embeddings ``((M, D), (M, D))``; None: ``z[0], z[1]`` (M = B).
        offset: the row of this rank's first sample in ``reference``.

    Returns:
        ``(B, N(N-1)/2)`` scores in fp32 (fp64 for fp64 input), columns in :func:`pair_index` order.
    """
    with exact_fp32(z.device.type):
        sw = pair_swap(z, reference, offset)
        m, dim = sw.ref1.shape
        first = branch_increase(sw.first, std_coeff, cov_coeff)
        second = branch_increase(sw.second, std_coeff, cov_coeff)
        k, l = pair_index(z.shape[0], device=z.device).unbind(1)
        inv_new = (sw.cand[:, k] - sw.cand[:, l]).pow(2).sum(-1)
        inv_old = (sw.ref1[sw.rows] - sw.ref2[sw.rows]).pow(2).sum(-1)[:, None]
        return sim_coeff / dim * (inv_new - inv_old) + m * (first[:, k] + second[:, l])
