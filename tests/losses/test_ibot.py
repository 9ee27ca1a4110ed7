"""iBOT's per-sample loss against the official loop, and its global-pair table against
brute force (the same choice under hard and easy)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hvp_lightning.losses import dino_ce_table, ibot_loss, ibot_pair_table, ibot_patch_loss
from hvp_lightning.selection import choose, global_pair_index

from ..conftest import official_pairs


def reference_ibot_loss(
    student_cls,
    student_patch,
    teacher_cls,
    teacher_patch,
    student_mask,
    center,
    center2,
    tau_t,
    tau_t2,
    tau_s,
    ngcrops,
    ncrops,
    lambda1,
    lambda2,
):
    """The official iBOT loss in its loop form: crops concatenated along the batch, chunked,
    CLS terms for q != v, patch terms for q == v, each averaged over its number of terms."""
    s_cls = (student_cls / tau_s).chunk(ncrops)
    s_patch = (student_patch / tau_s).chunk(ngcrops)
    t_cls = F.softmax((teacher_cls - center) / tau_t, dim=-1).chunk(ngcrops)
    t_patch = F.softmax((teacher_patch - center2) / tau_t2, dim=-1).chunk(ngcrops)
    total1, n1, total2, n2 = 0.0, 0, 0.0, 0
    for q in range(len(t_cls)):
        for v in range(len(s_cls)):
            if v == q:
                loss2 = torch.sum(-t_patch[q] * F.log_softmax(s_patch[v], dim=-1), dim=-1)
                mask = student_mask[v].flatten(-2, -1)
                loss2 = torch.sum(loss2 * mask.float(), dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
                total2 += loss2.mean()
                n2 += 1
            else:
                loss1 = torch.sum(-t_cls[q] * F.log_softmax(s_cls[v], dim=-1), dim=-1)
                total1 += loss1.mean()
                n1 += 1
    return total1 / n1 * lambda1 + total2 / n2 * lambda2


def _logits(*shape: int, seed: int) -> torch.Tensor:
    return 3 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _masks(*shape: int, seed: int, p: float = 0.4) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < p


@pytest.mark.parametrize("num_local,lambdas", [(0, (1.0, 1.0)), (3, (0.7, 1.6))])
def test_ibot_loss_matches_official_loop(num_local: int, lambdas: tuple[float, float]) -> None:
    b, n, k, k2 = 5, 6, 12, 10
    t_cls, s_cls = _logits(2, b, k, seed=0), _logits(2 + num_local, b, k, seed=1)
    t_patch, s_patch = _logits(2, b, n, k2, seed=2), _logits(2, b, n, k2, seed=3)
    masks = _masks(2, b, 2, 3, seed=4)
    masks[0, 1] = False  # an unmasked image: its patch term is 0 (sum / clamp(0, 1))
    c, c2 = _logits(1, k, seed=5) * 0.1, _logits(1, k2, seed=6) * 0.1
    per_sample = ibot_loss(
        list(t_cls), list(s_cls), list(t_patch), list(s_patch), list(masks), c, c2, 0.04, 0.07, 0.1, *lambdas
    )
    assert per_sample.shape == (b,)
    expected = reference_ibot_loss(
        s_cls.flatten(0, 1),
        s_patch.flatten(0, 1),
        t_cls.flatten(0, 1),
        t_patch.flatten(0, 1),
        list(masks),
        c,
        c2[None],
        0.04,
        0.07,
        0.1,
        2,
        2 + num_local,
        *lambdas,
    )
    torch.testing.assert_close(per_sample.mean(), expected)
    # The patch term of one view: masked-token mean of the token cross-entropies.
    m = ibot_patch_loss(t_patch[1], s_patch[1], masks[1], c2, 0.07, 0.1)
    ce = -(F.softmax((t_patch[1] - c2) / 0.07, -1) * F.log_softmax(s_patch[1] / 0.1, -1)).sum(-1)
    w = masks[1].flatten(1).float()
    torch.testing.assert_close(m, (ce * w).sum(1) / w.sum(1))
    assert ibot_patch_loss(t_patch[0], s_patch[0], masks[0], c2, 0.07, 0.1)[1] == 0


@pytest.mark.parametrize("rule", ["cross", "all"])
@pytest.mark.parametrize("mode,G,L", [("hard", 4, 3), ("easy", 4, 0), ("hard", 5, 1)])
def test_pair_table_equals_brute_force(mode: str, G: int, L: int, rule: str) -> None:
    B, N, K, K2 = 6, 5, 12, 9
    T, S = _logits(G, B, K, seed=10), _logits(G, B, K, seed=11)
    S_loc = _logits(L, B, K, seed=12)
    TP, SP = _logits(G, B, N, K2, seed=13), _logits(G, B, N, K2, seed=14)
    M = _masks(G, B, N, seed=15)
    c, c2 = _logits(1, K, seed=16) * 0.1, _logits(1, K2, seed=17) * 0.1
    tau_t, tau_t2, tau_s, l1, l2 = 0.04, 0.07, 0.1, 0.8, 1.3
    patch = torch.stack([ibot_patch_loss(TP[g], SP[g], M[g], c2, tau_t2, tau_s) for g in range(G)], 1)
    pairs = global_pair_index(G, rule)
    table = ibot_pair_table(dino_ce_table(T, torch.cat([S, S_loc]), c, tau_t, tau_s), patch, pairs, l1, l2)
    brute = torch.stack(
        [
            ibot_loss(
                [T[a], T[b]],
                [S[a], S[b], *S_loc],
                [TP[a], TP[b]],
                [SP[a], SP[b]],
                [M[a], M[b]],
                c,
                c2,
                tau_t,
                tau_t2,
                tau_s,
                l1,
                l2,
            )
            for a, b in official_pairs(G, rule)
        ],
        1,
    )
    assert table.shape == (B, len(official_pairs(G, rule)))
    torch.testing.assert_close(table, brute)
    assert torch.equal(choose(table, mode), choose(brute, mode))
