"""Weighted k-NN (DINO protocol) against a brute-force reference."""

from __future__ import annotations

import math

import torch

from hvp_lightning.monitors.knn import knn_accuracy, knn_scores


def brute_force_knn(bank, bank_labels, queries, num_classes, k, t):
    out = torch.zeros(len(queries), num_classes)
    for qi, q in enumerate(queries):
        sims = [(float(torch.dot(q / q.norm(), b / b.norm())), int(y)) for b, y in zip(bank, bank_labels)]
        for sim, y in sorted(sims, reverse=True)[:k]:
            out[qi, y] += math.exp(sim / t)
    return out


def test_knn_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    bank, queries = torch.randn(50, 8, generator=g), torch.randn(13, 8, generator=g)
    labels = torch.randint(0, 4, (50,), generator=g)
    for k in (1, 5, 20):
        fast = knn_scores(bank, labels, queries, 4, k=k, temperature=0.07, chunk=4)
        slow = brute_force_knn(bank, labels, queries, 4, k, 0.07)
        assert torch.allclose(fast, slow, rtol=1e-4)


def test_knn_accuracy_on_separable_clusters():
    g = torch.Generator().manual_seed(1)
    centers = torch.randn(5, 16, generator=g) * 5
    labels = torch.arange(5).repeat_interleave(20)
    bank = centers[labels] + torch.randn(100, 16, generator=g) * 0.1
    queries = centers[labels] + torch.randn(100, 16, generator=g) * 0.1
    res = knn_accuracy(bank, labels, queries, labels, 5)
    assert res["top1"] == 1.0 and res["top5"] == 1.0
    res = knn_accuracy(bank, labels, queries, (labels + 1) % 5, 5)
    assert res["top1"] == 0.0
