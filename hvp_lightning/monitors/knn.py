"""Weighted k-NN classifier on frozen features (the DINO evaluation protocol).

Features are L2-normalised, similarity is cosine, the k nearest bank samples vote for
their class with weight ``exp(sim / T)``; defaults k=20, T=0.07 as in DINO.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def knn_scores(
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    queries: torch.Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
    chunk: int = 1024,
) -> torch.Tensor:
    """Class scores ``[Q, num_classes]`` for ``queries`` against a labelled ``bank``.

    Inputs need not be normalised; it is done here. Queries go in chunks so a
    1.28M-image bank never meets a full ``Q x N`` similarity matrix.
    """
    bank = F.normalize(bank.float(), dim=1)
    queries = F.normalize(queries.float(), dim=1)
    k = min(k, bank.shape[0])
    out = []
    for q in queries.split(chunk):
        sim, idx = (q @ bank.T).topk(k, dim=1)
        weights = (sim / temperature).exp()
        votes = torch.zeros(q.shape[0], num_classes, device=q.device, dtype=weights.dtype)
        votes.scatter_add_(1, bank_labels[idx], weights)
        out.append(votes)
    return torch.cat(out)


def knn_accuracy(
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    queries: torch.Tensor,
    query_labels: torch.Tensor,
    num_classes: int,
    k: int = 20,
    temperature: float = 0.07,
) -> dict[str, float]:
    """Top-1 and top-5 accuracy (fractions in [0, 1]) for one k."""
    return knn_accuracies(bank, bank_labels, queries, query_labels, num_classes, (k,), temperature)[k]


def knn_accuracies(
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    queries: torch.Tensor,
    query_labels: torch.Tensor,
    num_classes: int,
    ks: Sequence[int] = (10, 20, 100, 200),
    temperature: float = 0.07,
    chunk: int = 1024,
) -> dict[int, dict[str, float]]:
    """Top-1/top-5 accuracy for several k at once: ``{k: {"top1", "top5"}}``.

    One similarity pass per query chunk: the ``max(ks)`` nearest neighbours come sorted by
    similarity, so each k votes with the first k of them (the same result as
    :func:`knn_accuracy` per k, at the cost of one).
    """
    bank = F.normalize(bank.float(), dim=1)
    queries = F.normalize(queries.float(), dim=1)
    wanted = {int(k): min(int(k), bank.shape[0]) for k in ks}
    kmax = max(wanted.values())
    top = min(5, num_classes)
    hits = {k: torch.zeros(2, dtype=torch.long, device=queries.device) for k in wanted}
    for q, y in zip(queries.split(chunk), query_labels.split(chunk)):
        sim, idx = (q @ bank.T).topk(kmax, dim=1)  # sorted, largest first
        weights, labels = (sim / temperature).exp(), bank_labels[idx]
        for k, kk in wanted.items():
            votes = torch.zeros(q.shape[0], num_classes, device=q.device, dtype=weights.dtype)
            votes.scatter_add_(1, labels[:, :kk], weights[:, :kk])
            hit = votes.topk(top, dim=1).indices == y[:, None]
            hits[k] += torch.stack([hit[:, 0].sum(), hit.any(1).sum()])
    n = max(1, queries.shape[0])
    return {k: {"top1": h[0].item() / n, "top5": h[1].item() / n} for k, h in hits.items()}
