"""SimCLR's NT-Xent loss per sample (Chen et al., ICML 2020, https://arxiv.org/abs/2002.05709).

Loss (official NT-Xent): every L2-normalised embedding is an anchor whose positive is the
other view of its image and whose negatives are the other 2B-2 embeddings of the batch
(of the global batch in DDP); the loss is the mean cross-entropy over all 2B anchors.
Per sample b that is the mean of its two anchor terms, so the batch mean is the official
loss. For HVP the loss of sample b on candidate pair (k, l) is the same expression with
candidate sets k and l as the two views (paper appendix "SimCLR", docs/DESIGN.md): one
similarity matrix over all N*B candidates, then per-(anchor set, key set) log-sum-exps.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .pairs import pair_index
from .precision import exact_fp32


def gather_with_grad(x: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, int]:
    """All ranks' ``x`` concatenated along ``dim`` and this rank's offset in it.

    Gradients flow back to each rank's own slice (``torch.distributed.nn`` sums the
    contributions of all ranks in backward), so with DDP's gradient averaging the result
    is the gradient of the global-batch loss. Single process: ``(x, 0)``, no distributed
    package needed. All ranks must pass the same shape (the loader drops the last batch).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return x, 0
    from torch.distributed.nn.functional import all_gather

    parts = all_gather(x.contiguous())
    return torch.cat(parts, dim=dim), dist.get_rank() * x.shape[dim]


def nt_xent_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float, gather: bool = False) -> torch.Tensor:
    """Per-sample NT-Xent ``[B]`` for views ``z1``, ``z2`` ``[B, D]``; its mean is the official loss.

    Sample b's value is the mean of the anchor terms ``z1_b -> z2_b`` and ``z2_b -> z1_b``,
    each a cross-entropy against all other 2B-1 embeddings. ``gather=True`` takes the keys
    from every rank (see :func:`gather_with_grad`), so negatives span the global batch.

    Args:
        z1: Projections of view 1, ``(B, D)``, any float dtype (computed in fp32).
        z2: Projections of view 2, ``(B, D)``.
        temperature: Softmax temperature ``tau`` (> 0).
        gather: Take negatives from all DDP ranks (every rank must pass the same ``B``).

    Returns:
        ``(B,)`` float32 on the inputs' device.
    """
    q1, q2 = F.normalize(z1.float(), dim=-1), F.normalize(z2.float(), dim=-1)
    if gather:
        k1, offset = gather_with_grad(q1)
        k2, _ = gather_with_grad(q2)
    else:
        k1, k2, offset = q1, q2, 0
    b, m = q1.shape[0], k1.shape[0]
    with torch.autocast(q1.device.type, enabled=False):  # fp32 logits under mixed precision
        logits = torch.cat([q1, q2]) @ torch.cat([k1, k2]).T / temperature  # [2B, 2M]
    own = torch.arange(b, device=logits.device) + offset  # local samples' rows among the keys
    self_col = torch.cat([own, own + m])
    pos_col = torch.cat([own + m, own])
    is_self = torch.zeros_like(logits, dtype=torch.bool)
    is_self[torch.arange(2 * b, device=logits.device), self_col] = True
    loss = F.cross_entropy(logits.masked_fill(is_self, float("-inf")), pos_col, reduction="none")
    return 0.5 * (loss[:b] + loss[b:])


def simclr_pair_table(
    z: torch.Tensor, temperature: float, keys: torch.Tensor | None = None, offset: int = 0
) -> torch.Tensor:
    """Per-sample NT-Xent of every candidate pair: ``z`` ``[N, B, D]`` -> ``[B, N(N-1)/2]``.

    Column c is pair ``(k, l) = pair_index(N)[c]``; entry (b, c) equals
    ``nt_xent_loss(z[k], z[l])[b]``: sample b's anchors in sets k and l, negatives the other
    2B-2 views of those two sets. ``keys`` ``[N, M, D]`` (all ranks' candidates, local ones
    at ``offset``) makes it equal ``nt_xent_loss(..., gather=True)`` instead.

    Why it is cheap: with ``S[a, b, c, j]`` the similarity of anchor ``z_b^a`` to key
    ``z_j^c`` (self masked), the denominator of anchor ``a`` in pair ``{a, c}`` is
    ``logaddexp(lse_j S[a,b,a,j], lse_j S[a,b,c,j])``, so one ``[N*B, N*M]`` matrix and one
    log-sum-exp per (anchor set, key set) give all pairs -- no loop over pairs or samples.

    Args:
        z: Projections of the N candidate views, ``(N, B, D)``.
        temperature: Softmax temperature ``tau`` (> 0).
        keys: Optional all-rank candidates ``(N, M, D)``, ``M = world_size * B``; ``None``: ``z`` itself.
        offset: Index of this rank's first sample in ``keys``' batch dimension.

    Returns:
        ``(B, N(N-1)/2)`` float32 on ``z``'s device, columns in ``pair_index(N)`` order.
    """
    n, b, _ = z.shape
    q = F.normalize(z.float(), dim=-1)
    k = q if keys is None else F.normalize(keys.float(), dim=-1)
    m = k.shape[1]
    with exact_fp32(q.device.type):  # rank the loss the method computes
        sim = (q.reshape(n * b, -1) @ k.reshape(n * m, -1).T / temperature).view(n, b, n, m)
    sets = torch.arange(n, device=z.device)[:, None]
    own = (torch.arange(b, device=z.device) + offset)[None, :]
    samples = torch.arange(b, device=z.device)[None, :]
    pos = sim[:, samples[0], :, own[0]].permute(1, 0, 2)  # [N, B, N]: S[a, b, c, own_b]
    sim[sets, samples, sets, own] = float("-inf")  # an anchor is not its own negative
    lse = torch.logsumexp(sim, dim=3)  # [N, B, N]
    kk, ll = pair_index(n, device=z.device).unbind(1)
    loss_k = torch.logaddexp(lse[kk, :, kk], lse[kk, :, ll]) - pos[kk, :, ll]  # [P, B]
    loss_l = torch.logaddexp(lse[ll, :, ll], lse[ll, :, kk]) - pos[ll, :, kk]
    return (0.5 * (loss_k + loss_l)).T
