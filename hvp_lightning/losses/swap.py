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
