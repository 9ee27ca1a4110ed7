"""LARS (You et al., 2017) as SimCLR uses it: large-batch SGD with a layer-wise trust ratio.

Why: SimCLR trains with batches of 4096 and linearly scaled learning rates (0.3 x 4096/256 =
4.8); plain SGD diverges there. LARS rescales each weight tensor's step by
``eta * ||w|| / ||g + wd * w||`` so that no layer's update is large relative to its weights.
As in the SimCLR code, biases and BatchNorm parameters (every parameter with ``ndim <= 1``)
get neither weight decay nor the trust ratio: their norms say nothing about a layer's scale.

Also the optimisers by name (their settings: :mod:`hvp_lightning.settings.optim`) and the warm-up +
cosine schedule that pretraining (learning rate, DINO's weight decay) and the evaluation heads share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from ..settings.optim import OPTIMIZERS


class LARS(torch.optim.Optimizer):
    """SGD with (heavy-ball) momentum and layer-wise adaptive rate scaling.

    Per parameter ``w`` with gradient ``g``, for tensors with ``ndim > 1``::

        d     = g + weight_decay * w
        trust = eta * ||w|| / ||d||      (1 where either norm is 0)
        v     = momentum * v + lr * trust * d
        w     = w - v

    and for 1-D tensors (biases, norm layers) ``d = g`` and ``trust = 1``. The learning rate
    sits inside the momentum buffer, as in the SimCLR reference implementation. Set
    ``exclude_1d=False`` in a param group to adapt and decay its 1-D tensors too.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 1e-3,
        exclude_1d: bool = True,
    ) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0 or eta <= 0:
            raise ValueError(f"LARS: invalid lr={lr}, momentum={momentum}, weight_decay={weight_decay}, eta={eta}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta, exclude_1d=exclude_1d)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum, wd, eta = group["lr"], group["momentum"], group["weight_decay"], group["eta"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                if not (group["exclude_1d"] and p.ndim <= 1):
                    if wd:
                        d = d.add(p, alpha=wd)
                    w_norm = torch.linalg.vector_norm(p)
                    d_norm = torch.linalg.vector_norm(d)
                    # torch.where keeps this on device (no host sync per tensor).
                    trust = torch.where((w_norm > 0) & (d_norm > 0), eta * w_norm / d_norm, torch.ones_like(w_norm))
                    d = d * trust
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = torch.zeros_like(p)
                buf.mul_(momentum).add_(d, alpha=lr)
                p.sub_(buf)
        return loss


def make_optimizer(
    name: str, groups: list[dict[str, Any]], lr: float, weight_decay: float, momentum: float, eta: float = 1e-3
) -> torch.optim.Optimizer:
    """The optimisers the recipes use, by name (pretraining and evaluation share this)."""
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    if name == "lars":  # no decay/adaptation for biases and norm params
        return LARS(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta)
    raise ValueError(f"optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")


def split_weight_decay(
    named_params: Iterable[tuple[str, torch.nn.Parameter]],
) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """(decayed, not decayed) trainable parameters: biases and norm weights (1-D) go without
    weight decay, as in DINO/iBOT and their evaluation heads."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in named_params:
        if p.requires_grad:
            (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
    return decay, no_decay


def warmup_cosine(step: int, total: int, warmup: int, final_ratio: float = 0.0) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine to ``final_ratio``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
