"""Optimisers: LARS."""

from __future__ import annotations

import torch
from torch import nn

from hvp_lightning.nn.optim import LARS


def test_lars_trust_ratio_only_on_matrices() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    model(torch.randn(8, 4)).pow(2).sum().backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    lr, wd, eta = 0.5, 1e-2, 1e-3
    LARS(model.parameters(), lr=lr, momentum=0.9, weight_decay=wd, eta=eta).step()
    for name, p in model.named_parameters():
        w, g = before[name], grads[name]
        assert not torch.equal(p.detach(), w), name
        if p.ndim > 1:  # Linear weight: decayed, scaled by eta * ||w|| / ||g + wd w||
            d = g + wd * w
            expected = w - lr * eta * w.norm() / d.norm() * d
        else:  # bias, BN weight/bias: plain SGD step, no decay, no trust ratio
            expected = w - lr * g
        torch.testing.assert_close(p.detach(), expected)
