"""Weighted k-NN classifier on frozen features (the DINO evaluation protocol).

Features are L2-normalised, similarity is cosine, the k nearest bank samples vote for
their class with weight ``exp(sim / T)``; defaults k=20, T=0.07 as in DINO.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def knn_scores(bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor, num_classes: int,
               k: int = 20, temperature: float = 0.07, chunk: int = 1024) -> torch.Tensor:
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


def knn_accuracy(bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor,
                 query_labels: torch.Tensor, num_classes: int, k: int = 20,
                 temperature: float = 0.07) -> dict[str, float]:
    """Top-1 and top-5 accuracy (fractions in [0, 1])."""
    scores = knn_scores(bank, bank_labels, queries, num_classes, k, temperature)
    top = scores.topk(min(5, num_classes), dim=1).indices
    hit = top == query_labels[:, None]
    return {"top1": hit[:, 0].float().mean().item(), "top5": hit.any(1).float().mean().item()}
