"""MoCo v3's loss per sample (Chen, Xie & He, ICCV 2021, https://arxiv.org/abs/2104.02057).

Loss (official ``moco/builder.py``): queries ``q`` (base encoder + projector + predictor) and
keys ``k`` (momentum encoder + projector, no gradient), both L2-normalised; the keys of the
whole batch -- every rank's under DDP (``concat_all_gather``) -- are the candidates, the key
of the same image the positive::

    ctr(q, k) = 2 tau * CE(q k^T / tau, own index),   loss = ctr(q1, k2) + ctr(q2, k1)

with the cross-entropy averaged over this rank's queries; no entry is masked (a query meets
the keys of the *other* view only). Per sample b the value is the sum of its two terms, so
the batch mean is the official loss. For HVP the loss of sample b on candidate pair (k, l) is
the same expression with candidate sets k and l as the two views: the query of set k meets
the keys of set l (all samples, all ranks) and vice versa, as SimCLR's selection takes its
negatives from the two candidate sets (docs/DESIGN.md section 3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .pairs import pair_index
from .precision import exact_fp32
from .simclr import gather_with_grad


def mocov3_loss(
    q1: torch.Tensor, q2: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor, temperature: float, gather: bool = False
) -> torch.Tensor:
    """Per-sample symmetrised MoCo v3 loss ``[B]`` for queries ``q1``, ``q2`` and keys ``k1``,
    ``k2`` ``[B, D]`` (keys detached here); its mean is the official loss. ``gather=True``
    takes the keys of every rank (local ones at this rank's offset), as the official code.

    Args:
        q1: Queries of view 1, ``(B, D)``.
        q2: Queries of view 2, ``(B, D)``.
        k1: Momentum-encoder keys of view 1, ``(B, D)``.
        k2: Momentum-encoder keys of view 2, ``(B, D)``.
        temperature: Softmax temperature (> 0).
        gather: Keys from all DDP ranks (every rank must pass the same ``B``).

    Returns:
        ``(B,)`` float32 on the inputs' device.
    """
    q1, q2 = F.normalize(q1.float(), dim=-1), F.normalize(q2.float(), dim=-1)
    k1, k2 = F.normalize(k1.detach().float(), dim=-1), F.normalize(k2.detach().float(), dim=-1)
    offset = 0
    if gather:
        k1, offset = gather_with_grad(k1)
        k2, _ = gather_with_grad(k2)
    own = torch.arange(q1.shape[0], device=q1.device) + offset
    with torch.autocast(q1.device.type, enabled=False):  # fp32 logits under mixed precision
        ctr12 = F.cross_entropy(q1 @ k2.T / temperature, own, reduction="none")
        ctr21 = F.cross_entropy(q2 @ k1.T / temperature, own, reduction="none")
    return 2 * temperature * (ctr12 + ctr21)


def mocov3_pair_table(q: torch.Tensor, keys: torch.Tensor, temperature: float, offset: int = 0) -> torch.Tensor:
    """Per-sample MoCo v3 loss of every candidate pair: queries ``q`` ``[N, B, D]`` and keys
    ``keys`` ``[N, M, D]`` (every rank's candidates, this rank's ``B`` at ``offset``; ``M = B``
    in one process) -> ``[B, N(N-1)/2]``.

    Column c is pair ``(k, l) = pair_index(N)[c]``; entry (b, c) equals
    ``mocov3_loss(q[k], q[l], keys[k], keys[l], gather=True)[b]``. One ``[N*B, N*M]``
    similarity matrix and one log-sum-exp per (query set, key set) give all pairs.

    Args:
        q: Queries of the N candidate views, ``(N, B, D)``.
        keys: Keys of the N candidate views, ``(N, M, D)``.
        temperature: Softmax temperature (> 0).
        offset: Index of this rank's first sample in ``keys``' batch dimension.

    Returns:
        ``(B, N(N-1)/2)`` float32 on ``q``'s device, columns in ``pair_index(N)`` order.
    """
    n, b, _ = q.shape
    qn = F.normalize(q.float(), dim=-1)
    kn = F.normalize(keys.float(), dim=-1)
    m = kn.shape[1]
    with exact_fp32(q.device.type):  # rank the loss the method computes
        sim = (qn.reshape(n * b, -1) @ kn.reshape(n * m, -1).T / temperature).view(n, b, n, m)
    own = torch.arange(b, device=q.device) + offset
    pos = sim[:, torch.arange(b, device=q.device), :, own]  # [B, N, N]: S[a, b, c, own_b]
    ce = torch.logsumexp(sim, dim=3).permute(1, 0, 2) - pos  # [B, N (query set), N (key set)]
    kk, ll = pair_index(n, device=q.device).unbind(1)
    return 2 * temperature * (ce[:, kk, ll] + ce[:, ll, kk])
