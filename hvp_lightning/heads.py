"""Projection/prediction MLPs shared by the methods (written once, sized by config)."""

from __future__ import annotations

from torch import nn


def mlp(in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, last_bn: bool = True,
        last_bn_affine: bool = True) -> nn.Sequential:
    """``num_layers`` Linear layers with BN+ReLU between them (SimSiam/SimCLR/BYOL style).

    ``last_bn`` appends a BatchNorm after the output layer (SimSiam's projector ends in BN
    without affine parameters in the official code; its predictor does not).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    layers: list[nn.Module] = []
    dim = in_dim
    for _ in range(num_layers - 1):
        layers += [nn.Linear(dim, hidden_dim, bias=False), nn.BatchNorm1d(hidden_dim), nn.ReLU(inplace=True)]
        dim = hidden_dim
    layers.append(nn.Linear(dim, out_dim, bias=not last_bn))
    if last_bn:
        layers.append(nn.BatchNorm1d(out_dim, affine=last_bn_affine))
    return nn.Sequential(*layers)
