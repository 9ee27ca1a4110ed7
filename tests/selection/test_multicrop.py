"""The exact multi-crop search (DINO: 2 globals + L of Lc locals) against brute force over
every combination; random and sampled draws; non-finite local terms never chosen."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
import torch

from hvp_lightning.losses import dino_loss
from hvp_lightning.selection import dino_exact_selection

from ..conftest import official_pairs
from ..losses.test_dino import _logits

VIT = [
    "backbone=vit_tiny",
    "backbone.patch_size=8",
    "backbone.img_size=32",
    "backbone.depth=1",
    "backbone.drop_path_rate=0.0",
]
TINY = [
    "method=dino_cifar",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
    "logger=csv",
    "data.num_workers=0",
]


def _brute_force(T, S_glob, S_loc, L, center, tau_t, tau_s, rule="all"):
    combos = [(p, loc) for p in official_pairs(T.shape[0], rule) for loc in combinations(range(S_loc.shape[0]), L)]
    losses = [
        dino_loss([T[g1], T[g2]], [S_glob[g1], S_glob[g2], *(S_loc[j] for j in loc)], center, tau_t, tau_s)
        for (g1, g2), loc in combos
    ]
    return torch.stack(losses, 1), combos  # [B, C(G,2) * C(Lc,L)]


def _loss_of_choice(T, S_glob, S_loc, sel, center, tau_t, tau_s):
    b = torch.arange(T.shape[1])
    g1, g2 = sel.pair.unbind(1)
    student = [S_glob[g1, b], S_glob[g2, b], *(S_loc[sel.locals[:, s], b] for s in range(sel.locals.shape[1]))]
    return dino_loss([T[g1, b], T[g2, b]], student, center, tau_t, tau_s)


@pytest.mark.parametrize("rule", ["cross", "all"])
@pytest.mark.parametrize("mode,G,Lc,L", [("hard", 4, 6, 3), ("easy", 4, 6, 3), ("hard", 4, 5, 0), ("hard", 5, 3, 1)])
def test_exact_selection_equals_brute_force(mode: str, G: int, Lc: int, L: int, rule: str) -> None:
    B, K = 7, 16
    T, S_glob, S_loc = _logits(G, B, K, seed=3), _logits(G, B, K, seed=4), _logits(Lc, B, K, seed=5)
    center, tau_t, tau_s = _logits(1, K, seed=6) * 0.1, 0.07, 0.1
    sel = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, mode, global_pairs=rule)
    brute, combos = _brute_force(T, S_glob, S_loc, L, center, tau_t, tau_s, rule)
    assert brute.shape == (B, len(official_pairs(G, rule)) * math.comb(Lc, L))
    best = brute.max(1).values if mode == "hard" else brute.min(1).values
    torch.testing.assert_close(sel.loss, best)
    # The reported loss is the official loss of the chosen crops, and the crops are valid.
    torch.testing.assert_close(_loss_of_choice(T, S_glob, S_loc, sel, center, tau_t, tau_s), sel.loss)
    assert {tuple(p) for p in sel.pair.tolist()} <= set(official_pairs(G, rule))
    assert all(len(set(row)) == L for row in sel.locals.tolist())
    # ... and they are the brute-force optimum itself (ties are measure-zero with random logits).
    arg = brute.argmax(1) if mode == "hard" else brute.argmin(1)
    for b in range(B):
        (g1, g2), loc = combos[int(arg[b])]
        assert tuple(sel.pair[b].tolist()) == (g1, g2)
        assert sorted(sel.locals[b].tolist()) == list(loc)


def test_random_and_sampled_selection() -> None:
    G, Lc, L, B, K = 4, 6, 3, 6, 16
    T, S_glob, S_loc = _logits(G, B, K, seed=7), _logits(G, B, K, seed=8), _logits(Lc, B, K, seed=9)
    center, tau_t, tau_s = torch.zeros(1, K), 0.04, 0.1
    brute, _ = _brute_force(T, S_glob, S_loc, L, center, tau_t, tau_s, "cross")
    gen = lambda: torch.Generator().manual_seed(11)  # noqa: E731
    rand = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, "random", generator=gen())
    torch.testing.assert_close(_loss_of_choice(T, S_glob, S_loc, rand, center, tau_t, tau_s), rand.loss)
    again = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, "random", generator=gen())
    assert torch.equal(rand.pair, again.pair) and torch.equal(rand.locals, again.locals)
    # K sampled combinations (the paper's setting): the best of them, never above the exact max.
    sampled = dino_exact_selection(
        T, S_glob, S_loc, L, center, tau_t, tau_s, "hard", max_combinations=8, generator=gen()
    )
    torch.testing.assert_close(_loss_of_choice(T, S_glob, S_loc, sampled, center, tau_t, tau_s), sampled.loss)
    assert (sampled.loss <= brute.max(1).values + 1e-6).all()
    # K >= all combinations is the exact search.
    full = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, "hard", max_combinations=10_000)
    torch.testing.assert_close(full.loss, brute.max(1).values)


@pytest.mark.parametrize("rule", ["cross", "all"])
@pytest.mark.parametrize("max_combinations", [None, 8])
def test_random_and_sampled_draws_stay_in_the_pair_set(rule: str, max_combinations: int | None) -> None:
    """Random mode is uniform over the chosen pair set, and the sampled mode draws from it:
    with ``cross`` no same-pipeline pair such as (0, 2) is ever trained on."""
    G, Lc, L, B, K = 6, 4, 2, 3000, 8
    T, S_glob, S_loc = _logits(G, B, K, seed=20), _logits(G, B, K, seed=21), _logits(Lc, B, K, seed=22)
    center, gen = torch.zeros(1, K), torch.Generator().manual_seed(5)
    mode = "random" if max_combinations is None else "hard"
    sel = dino_exact_selection(T, S_glob, S_loc, L, center, 0.04, 0.1, mode, max_combinations, gen, rule)
    allowed = official_pairs(G, rule)
    counts = {p: 0 for p in allowed}
    for p in map(tuple, sel.pair.tolist()):
        counts[p] += 1  # KeyError: a pair outside the set
    assert len(counts) == len(allowed)
    if mode == "random":  # uniform: each pair's count within 5 sigma of B / P
        expected = B / len(allowed)
        sigma = math.sqrt(expected * (1 - 1 / len(allowed)))
        assert all(abs(c - expected) < 5 * sigma for c in counts.values()), counts
    torch.testing.assert_close(_loss_of_choice(T, S_glob, S_loc, sel, center, 0.04, 0.1), sel.loss)


@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_nonfinite_local_terms_are_never_chosen(mode: str) -> None:
    """A NaN local candidate (say an fp16 overflow) must not make every pair's column NaN:
    the exact search picks the best combination of finite locals."""
    G, Lc, L, B, K = 4, 5, 2, 6, 16
    T, S_glob, S_loc = _logits(G, B, K, seed=23), _logits(G, B, K, seed=24), _logits(Lc, B, K, seed=25)
    S_loc[1, :2] = float("nan")
    S_loc[3, 0] = float("inf")
    center, tau_t, tau_s = torch.zeros(1, K), 0.04, 0.1
    sel = dino_exact_selection(T, S_glob, S_loc, L, center, tau_t, tau_s, mode)
    assert torch.isfinite(sel.loss).all()
    brute, combos = _brute_force(T, S_glob, S_loc, L, center, tau_t, tau_s, "cross")
    finite = brute.masked_fill(~torch.isfinite(brute), float("-inf") if mode == "hard" else float("inf"))
    torch.testing.assert_close(sel.loss, finite.max(1).values if mode == "hard" else finite.min(1).values)
    assert not (sel.locals[:2] == 1).any() and not (sel.locals[0] == 3).any()
