"""Multi-crop search (DINO, iBOT): per-sample candidate combinations of 2 globals + L locals.

Where the line to the losses runs: the methods' modules turn network outputs into
per-sample loss terms (DINO's cross-entropy table ``CE_b(g -> v)``, iBOT's masked-patch
terms). This module takes such a table and finds each sample's combinations: DINO's bracket
``[CE(g1->g2) + CE(g2->g1) + sum_{j in S} (CE(g1->j) + CE(g2->j))] / (2L + 2)`` splits into a
pair term and unary local terms, so for each global pair the best locals are the top-L
(hard) or bottom-L (easy) unary terms, and the exact argmax/argmin over all
``P * C(Lc, L)`` combinations is one top-k per pair, not a loop over subsets. The bracket's
assembly from a CE table (:func:`combination_loss`) lives here because the search relies
on that decomposition.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .pairs import global_pair_index


class CombinationTable(NamedTuple):
    """Per-sample candidate combinations: column c of sample b is global pair ``pairs[b, c]``
    (indices into the G global candidates) with locals ``locals[b, c]`` (indices into the Lc
    local candidates) and official DINO loss ``loss[b, c]``."""

    loss: torch.Tensor  # [B, C]
    pairs: torch.Tensor  # [B, C, 2]
    locals: torch.Tensor  # [B, C, L]


def combination_loss(ce: torch.Tensor, pairs: torch.Tensor, locals_: torch.Tensor, num_globals: int) -> torch.Tensor:
    """Loss of combinations ``pairs [B, C, 2]`` + ``locals [B, C, L]`` from a CE table ``[B, G, V]``."""
    b = torch.arange(ce.shape[0], device=ce.device)[:, None]
    g1, g2 = pairs.unbind(-1)
    pair_terms = ce[b, g1, g2] + ce[b, g2, g1]
    j = num_globals + locals_
    local_terms = ce[b[..., None], g1[..., None], j] + ce[b[..., None], g2[..., None], j]
    return (pair_terms + local_terms.sum(-1)) / (2 * locals_.shape[-1] + 2)


def _uniform_subsets(shape: tuple[int, ...], n: int, k: int, generator: torch.Generator | None,
                    device: torch.device) -> torch.Tensor:
    """Uniformly random k-subsets of ``range(n)``, one per entry of ``shape``: ``[*shape, k]``."""
    return torch.rand(*shape, n, generator=generator).argsort(-1)[..., :k].to(device)


def dino_combination_table(ce: torch.Tensor, num_globals: int, num_local: int, mode: str = "hard",
                           max_combinations: int | None = None, generator: torch.Generator | None = None,
                           global_pairs: str = "cross") -> CombinationTable:
    """Candidate combinations of every sample, sized so that ``choose(table.loss, mode)``
    returns the exact optimum over all ``P * C(Lc,L)`` combinations, P the global pairs of
    ``global_pairs`` (:func:`~hvp_lightning.selection.global_pair_index`).

    Exact (``max_combinations`` None or >= the number of combinations): one column per
    global pair, holding the pair's best locals under ``mode`` -- top-L (hard), bottom-L
    (easy) or a uniform L-subset (random; with the uniform column choice this is a uniform
    combination). Non-finite local terms rank last, so a pair's column is finite whenever L
    of its local terms are. Sampled (the paper's fidelity setting): ``max_combinations``
    columns, each an independently drawn uniform combination (with replacement) per sample.
    """
    bsz, g, v = ce.shape
    lc = v - num_globals
    if num_globals != g or g < 2 or not 0 <= num_local <= lc:
        raise ValueError(f"need G >= 2 globals and 0 <= L <= Lc: G={g}, L={num_local}, Lc={lc}")
    pairs = global_pair_index(g, global_pairs, device=ce.device)  # [P, 2]
    total = pairs.shape[0] * math.comb(lc, num_local)
    if max_combinations is not None and max_combinations < total:
        pick = torch.randint(pairs.shape[0], (bsz, max_combinations), generator=generator).to(ce.device)
        cpairs = pairs[pick]
        clocals = _uniform_subsets((bsz, max_combinations), lc, num_local, generator, ce.device)
        return CombinationTable(combination_loss(ce, cpairs, clocals, g), cpairs, clocals)
    g1, g2 = pairs.unbind(1)
    pair_terms = ce[:, g1, g2] + ce[:, g2, g1]  # [B, P]
    local_terms = ce[:, g1, g:] + ce[:, g2, g:]  # [B, P, Lc]
    if mode in ("hard", "easy"):
        worst = float("-inf") if mode == "hard" else float("inf")
        ranked = local_terms.masked_fill(~torch.isfinite(local_terms), worst)
        idx = ranked.topk(num_local, dim=-1, largest=mode == "hard").indices
        vals = local_terms.gather(-1, idx)
    elif mode == "random":
        idx = _uniform_subsets(tuple(local_terms.shape[:2]), lc, num_local, generator, ce.device)
        vals = local_terms.gather(-1, idx)
    else:
        raise ValueError(f"mode={mode!r}; allowed: hard, easy, random")
    loss = (pair_terms + vals.sum(-1)) / (2 * num_local + 2)
    return CombinationTable(loss, pairs.expand(bsz, -1, -1), idx)


def gather_combination_views(views: list[torch.Tensor], num_globals: int, pair: torch.Tensor,
                             locals_: torch.Tensor) -> list[torch.Tensor]:
    """Each sample's chosen globals ``pair`` ``[B, 2]`` and locals ``locals_`` ``[B, L]`` from
    the loader's ``[G global candidates, Lc local candidates]``, in the baseline's layout
    ``[global1, global2, local_1..local_L]``."""
    b = torch.arange(pair.shape[0], device=pair.device)
    glob = torch.stack(list(views[:num_globals]))
    out = [glob[pair[:, 0], b], glob[pair[:, 1], b]]
    if locals_.shape[1]:
        loc = torch.stack(list(views[num_globals:]))
        out += [loc[locals_[:, s], b] for s in range(locals_.shape[1])]
    return out
