"""Leave-one-out batch statistics: the centred second moments of a batch after one sample's row
is swapped for a candidate, as rank-one updates (docs/DESIGN.md, section 3, "Batch-statistic
losses").

With reference rows ``x_1..x_M`` (mean ``mu``, centred scatter ``S = sum_i (x_i - mu)(x_i - mu)^T``)
and row ``g`` replaced by ``x'``, let ``a = x' - mu``, ``c = x_g - mu`` and ``d = a - c``. Then

    mu' = mu + d / M,        S' = S + a a^T - c c^T - d d^T / M

(and for two batches swapped in the same row, the cross scatter ``K = sum (x_i - mu_x)(y_i - mu_y)^T``
becomes ``K + a e^T - c f^T - d_x d_y^T / M``). Every candidate of every sample is one such
update, so a whole ``[B, N]`` table of batch losses costs a few matrix products, never a loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowSwap:
    """The pieces of ``S' = S + a a^T - c c^T - d d^T / M`` for every (sample b, candidate n)."""

    m: int  # rows of the batch (all ranks')
    centred: torch.Tensor  # [M, D] reference rows minus their mean
    new: torch.Tensor  # a [B, N, D]: candidate minus the reference mean
    old: torch.Tensor  # c [B, 1, D]: the swapped-out reference row, centred
    step: torch.Tensor  # d = a - c [B, N, D]
    sq_old: torch.Tensor  # [D] diagonal of S
    sq_new: torch.Tensor  # [B, N, D] diagonal of S'


def row_swap(reference: torch.Tensor, candidates: torch.Tensor, rows: torch.Tensor) -> RowSwap:
    """``reference`` ``[M, D]``, ``candidates`` ``[B, N, D]`` for the samples at ``rows`` ``[B]``
    of the reference: the statistics of the batch with row ``rows[b]`` replaced by candidate n."""
    m = reference.shape[0]
    if m < 2:
        raise ValueError(f"batch statistics need at least 2 samples, got {m}")
    mean = reference.mean(0)
    centred = reference - mean
    new = candidates - mean
    old = centred[rows][:, None]
    step = new - old
    sq_old = (centred * centred).sum(0)
    sq_new = sq_old + new * new - old * old - step * step / m
    return RowSwap(m, centred, new, old, step, sq_old, sq_new)


@dataclass(frozen=True)
class PairSwap:
    """Both branches of a two-view batch loss with one sample's pair of rows swapped for each
    candidate: the shared set-up of the leave-one-out tables (VICReg, Barlow Twins)."""

    cand: torch.Tensor  # [B, N, D] the candidates, by sample (fp32 at least)
    rows: torch.Tensor  # [B] each sample's row in the reference
    ref1: torch.Tensor  # [M, D] first-branch reference rows
    ref2: torch.Tensor  # [M, D] second-branch reference rows
    first: RowSwap  # the first branch with its row swapped for each candidate
    second: RowSwap  # the second branch likewise


def pair_swap(z: torch.Tensor, reference: tuple[torch.Tensor, torch.Tensor] | None, offset: int) -> PairSwap:
    """The row swaps of every candidate in both branches of the reference batch.

    Args:
        z: candidate embeddings ``(N, B, D)``: N views of this rank's B samples.
        reference: under DDP, all ranks' pair-(0, 1) embeddings ``((M, D), (M, D))``; None: ``z[0], z[1]`` (M = B).
        offset: the row of this rank's first sample in ``reference``.

    Returns:
        The :class:`PairSwap`, in ``z``'s dtype promoted to fp32 at least (fp64 stays: the tests).
    """
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    ref1, ref2 = (z[0], z[1]) if reference is None else (reference[0].to(z.dtype), reference[1].to(z.dtype))
    rows = torch.arange(z.shape[1], device=z.device) + offset
    cand = z.transpose(0, 1)
    return PairSwap(cand, rows, ref1, ref2, row_swap(ref1, cand, rows), row_swap(ref2, cand, rows))
