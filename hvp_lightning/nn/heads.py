"""Projection/prediction MLPs shared by the methods (written once, sized by config)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def mlp(
    in_dim: int,
    hidden_dim: int,
    out_dim: int,
    num_layers: int,
    last_bn: bool = True,
    last_bn_affine: bool = True,
    last_bias: bool | None = None,
) -> nn.Sequential:
    """``num_layers`` Linear layers with BN+ReLU between them (SimSiam/SimCLR/BYOL style).

    ``last_bn`` appends a BatchNorm after the output layer (SimSiam's projector ends in BN
    without affine parameters in the official code; its predictor does not). The output layer
    has a bias unless it is followed by BN or ``last_bias=False`` (VICReg and Barlow Twins,
    whose losses centre the embeddings: a bias there would get no gradient).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    layers: list[nn.Module] = []
    dim = in_dim
    for _ in range(num_layers - 1):
        layers += [nn.Linear(dim, hidden_dim, bias=False), nn.BatchNorm1d(hidden_dim), nn.ReLU(inplace=True)]
        dim = hidden_dim
    layers.append(nn.Linear(dim, out_dim, bias=not last_bn if last_bias is None else last_bias))
    if last_bn:
        layers.append(nn.BatchNorm1d(out_dim, affine=last_bn_affine))
    return nn.Sequential(*layers)


class WeightNormLinear(nn.Module):
    """Bias-free linear layer with weight ``g * v / ||v||`` (one norm per output unit).

    Written out rather than using torch's weight-norm parametrisation so that the teacher
    can be a plain ``deepcopy`` and the EMA walks ordinary parameters. ``fix_norm`` freezes
    ``g`` at 1 (DINO's ``norm_last_layer``, which the authors found stabilises training).
    """

    def __init__(self, in_dim: int, out_dim: int, fix_norm: bool = True) -> None:
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(out_dim, in_dim))
        nn.init.kaiming_uniform_(self.weight_v, a=math.sqrt(5))  # nn.Linear's default init
        self.weight_g = nn.Parameter(torch.ones(out_dim), requires_grad=not fix_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight_g[:, None] * F.normalize(self.weight_v, dim=1))


class DINOHead(nn.Module):
    """DINO projection head: MLP (GELU) -> bottleneck -> L2-normalise -> weight-normed layer.

    Parameters of the output layer live under ``last_layer`` so the method can find them by
    name (DINO freezes them during the first epoch(s)).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        num_layers: int = 3,
        use_bn: bool = False,
        norm_last_layer: bool = True,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        layers: list[nn.Module] = []
        dim = in_dim
        for _ in range(num_layers - 1):
            layers.append(nn.Linear(dim, hidden_dim))
            if use_bn:
                layers.append(nn.BatchNorm1d(hidden_dim))
            layers.append(nn.GELU())
            dim = hidden_dim
        layers.append(nn.Linear(dim, bottleneck_dim))
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim, fix_norm=norm_last_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(self.mlp(x), dim=-1))


class IBOTHead(DINOHead):
    """iBOT's head: DINO's MLP over the CLS *and* patch tokens, with the patch tokens sent
    to their own weight-normed output layer ``last_layer2`` unless ``shared`` (then both
    use ``last_layer``). The MLP is always shared, as in the official iBOT head; naming
    the separate layer ``last_layer2`` keeps it under DINO's "last_layer" freeze rule.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        patch_out_dim: int,
        shared: bool = True,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        num_layers: int = 3,
        use_bn: bool = False,
        norm_last_layer: bool = True,
    ) -> None:
        super().__init__(in_dim, out_dim, hidden_dim, bottleneck_dim, num_layers, use_bn, norm_last_layer)
        if shared and patch_out_dim != out_dim:
            raise ValueError(f"a shared head needs patch_out_dim == out_dim, got {patch_out_dim} != {out_dim}")
        self.last_layer2 = None if shared else WeightNormLinear(bottleneck_dim, patch_out_dim, fix_norm=norm_last_layer)

    def forward_tokens(self, cls: torch.Tensor, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cls [B, D]``, ``patches [B, N, D]`` -> CLS logits ``[B, K]``, patch logits ``[B, N, K2]``.

        One MLP pass over all tokens (flattened), so a BatchNorm head normalises over every
        token of the batch, as the official head does."""
        tokens = torch.cat([cls[:, None], patches], dim=1)
        z = F.normalize(self.mlp(tokens.flatten(0, 1)), dim=-1).unflatten(0, tokens.shape[:2])
        patch_layer = self.last_layer if self.last_layer2 is None else self.last_layer2
        return self.last_layer(z[:, 0]), patch_layer(z[:, 1:])
