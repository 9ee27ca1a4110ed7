"""Candidate pair order shared by every pair table and the selection that reads its columns."""

from __future__ import annotations

import torch


def pair_index(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """All unordered pairs ``(k, l)``, ``k < l``, of ``n`` views: LongTensor ``[n(n-1)/2, 2]``.

    The order is row-major (``(0,1), (0,2), ..., (n-2,n-1)``), so with ``n == 2`` the only
    pair is ``(0, 1)`` -- the baseline's pair. Inside a step pass ``device``: that of the
    choice or table it meets (a CPU pair table indexed by a GPU choice fails on GPU).
    """
    return torch.triu_indices(n, n, offset=1, device=device).T.contiguous()
