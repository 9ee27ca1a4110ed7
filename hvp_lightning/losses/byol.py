"""BYOL's loss per sample (Grill et al., NeurIPS 2020, https://arxiv.org/abs/2006.07733).

Loss (official, symmetrised): with online predictions ``p`` and target projections ``z'``
(the EMA network's, no gradient), ``l_b = ||p1_b/|p1_b| - z2'_b/|z2'_b| ||^2 + (1 <-> 2)
= (2 - 2 cos(p1_b, z2'_b)) + (2 - 2 cos(p2_b, z1'_b))``; the official loss is its mean over
the batch (the paper's ``L + L~``). For HVP the loss of sample b on candidate pair (k, l) is
the same expression on those views; every pair comes from one ``[B, N, N]`` cosine table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .pairs import pair_index
from .precision import exact_fp32


def byol_loss(p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Per-sample symmetrised BYOL loss ``[B]`` of online predictions ``p1``, ``p2`` and target
    projections ``z1``, ``z2`` ``[B, D]`` (detached here); its mean is the official loss.
    In fp32 under mixed precision (cosines of bf16 vectors carry ~1e-2 error)."""
    p1, p2, z1, z2 = p1.float(), p2.float(), z1.detach().float(), z2.detach().float()
    return 4 - 2 * (F.cosine_similarity(p1, z2, dim=-1) + F.cosine_similarity(p2, z1, dim=-1))


def byol_pair_table(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Per-sample BYOL loss of every view pair: ``p`` (online predictions), ``z`` (target
    projections) ``[N, B, D]`` -> ``[B, N(N-1)/2]``.

    Column c is pair ``pair_index(N)[c]``; entry (b, c) equals ``byol_loss`` of sample b on
    that pair. In fp32 even under a low-precision selection autocast: the argmax must rank
    the loss the method computes.
    """
    with exact_fp32(p.device.type):
        cos = torch.einsum("kbd,lbd->bkl", F.normalize(p.float(), dim=-1), F.normalize(z.float(), dim=-1))
    k, l = pair_index(p.shape[0], device=p.device).unbind(1)
    return 4 - 2 * (cos[:, k, l] + cos[:, l, k])
