"""Candidate pairs and the gathers that turn a choice into views.

Every index built here takes the device of the tensors it indexes (``pair_index(n,
device=...)``), so a gather never sends a CPU index into a GPU batch or a GPU index into a
CPU table (tests/test_device_guard.py checks each method's step for that).
"""

from __future__ import annotations

import torch

from ..losses.pairs import pair_index
from ..settings.hvp import GLOBAL_PAIRS


def global_pair_index(g: int, rule: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """The global-candidate pairs a multi-crop method scores: LongTensor ``[P, 2]``.

    Global candidates alternate DINO's two asymmetric pipelines (even positions: pipeline 1,
    odd: pipeline 2). ``cross`` keeps that asymmetry in every pair, as the official HVP code
    does (``itertools.product(range(0, G, 2), range(1, G, 2))``, in that order: pipeline-1
    crop first); ``all`` is :func:`pair_index`. Either way column 0 is ``(0, 1)``, the
    baseline's pair.

    Args:
        g: Number of global candidates G.
        rule: ``"cross"`` or ``"all"`` (``hvp.global_pairs``).
        device: Device of the result.

    Returns:
        int64 ``(P, 2)`` on ``device``: ``P = ceil(G/2) * floor(G/2)`` (cross) or ``G(G-1)/2`` (all).

    Raises:
        ValueError: If ``rule`` is not ``cross`` or ``all``.
    """
    if rule == "all":
        return pair_index(g, device)
    if rule != "cross":
        raise ValueError(f"hvp.global_pairs={rule!r}; allowed: {', '.join(GLOBAL_PAIRS)}")
    first = torch.arange(0, g, 2, device=device)
    second = torch.arange(1, g, 2, device=device)
    return torch.cartesian_prod(first, second).reshape(-1, 2)


def gather_pairs(views: torch.Tensor, pairs: torch.Tensor, choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick each sample's chosen pair from stacked candidates ``views`` ``[N, B, ...]``.

    Vectorised, no loop over samples.

    Args:
        views: Stacked candidate views ``(N, B, ...)`` (images or embeddings).
        pairs: Candidate pairs ``(C, 2)``, e.g. :func:`pair_index`; moved to ``views``' device.
        choice: Chosen column per sample, int64 ``(B,)`` (from :func:`choose`).

    Returns:
        The two chosen view batches, each ``(B, ...)``, on ``views``' device.
    """
    b = torch.arange(views.shape[1], device=views.device)
    k, l = pairs[choice].to(views.device).unbind(1)
    return views[k, b], views[l, b]


def gather_pair_params(
    params: dict[str, torch.Tensor], pairs: torch.Tensor, choice: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Keep the augmentation parameters of the chosen views: ``[B, N, ...]`` -> ``[B, 2, ...]``."""
    return gather_view_params(params, pairs[choice])  # the pair's two view positions


def gather_view_params(params: dict[str, torch.Tensor], positions: torch.Tensor) -> dict[str, torch.Tensor]:
    """Augmentation parameters of the views each sample trains on (multi-crop methods):
    ``positions`` ``[B, V]`` are view positions in the loader's layout; ``[B, N, ...]`` ->
    ``[B, V, ...]``."""
    b = torch.arange(positions.shape[0], device=positions.device)
    return {k: p[b.to(p.device)[:, None], positions.to(p.device)] for k, p in params.items()}
