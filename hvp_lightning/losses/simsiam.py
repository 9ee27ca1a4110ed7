"""SimSiam's loss per sample (Chen & He, CVPR 2021, https://arxiv.org/abs/2011.10566).

Loss (official): L = -1/2 [cos(p1, sg(z2)) + cos(p2, sg(z1))], averaged over the batch.
Per-sample candidate loss for views (k, l) is the same expression on those views
(docs/DESIGN.md); every pair of every sample comes from one ``[B, N, N]`` cosine table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .pairs import pair_index
from .precision import exact_fp32


def simsiam_loss(p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Per-sample SimSiam loss ``[B]``; the mean over the batch is the official loss.
    In fp32 under mixed precision (cosines of bf16 vectors carry ~1e-2 error)."""
    p1, p2, z1, z2 = p1.float(), p2.float(), z1.detach().float(), z2.detach().float()
    return -0.5 * (F.cosine_similarity(p1, z2, dim=-1) + F.cosine_similarity(p2, z1, dim=-1))


def simsiam_pair_table(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Per-sample loss of every view pair: ``p``, ``z`` are ``[N, B, D]`` -> ``[B, N(N-1)/2]``.

    Column c is pair ``pair_index(N)[c]``; entry (b, c) equals ``simsiam_loss`` of sample b
    on that pair. In fp32 even under a low-precision selection autocast: the argmax must rank
    the loss the method computes.
    """
    with exact_fp32(p.device.type):
        cos = torch.einsum("kbd,lbd->bkl", F.normalize(p.float(), dim=-1), F.normalize(z.float(), dim=-1))
    k, l = pair_index(p.shape[0], device=p.device).unbind(1)
    return -0.5 * (cos[:, k, l] + cos[:, l, k])
