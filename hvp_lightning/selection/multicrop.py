"""Multi-crop search (DINO, iBOT): per-sample candidate combinations of 2 globals + L locals.

The losses (:mod:`hvp_lightning.losses.dino`) turn network outputs into DINO's cross-entropy
table ``CE_b(g -> v)`` and assemble a combination's bracket from it
(:func:`~hvp_lightning.losses.dino.combination_loss`). This module finds each sample's
combinations: the bracket splits into a pair term and unary local terms, so for each global
pair the best locals are the top-L (hard) or bottom-L (easy) unary terms, and the exact
argmax/argmin over all ``P * C(Lc, L)`` combinations is one top-k per pair, not a loop over
subsets. :func:`dino_exact_selection` is that search on DINO's table in one call (the
reference the tests check against brute force); :func:`gather_combination_views` and
:func:`chosen_views_batch` turn a choice into the training step's views.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from ..losses.dino import combination_loss, dino_ce_table
from ..nn.sync_free import host_to_device
from .choice import choose
from .pairs import gather_view_params, global_pair_index


class CombinationTable(NamedTuple):
    """Per-sample candidate combinations: column c of sample b is global pair ``pairs[b, c]``
    (indices into the G global candidates) with locals ``locals[b, c]`` (indices into the Lc
    local candidates) and official DINO loss ``loss[b, c]``."""

    loss: torch.Tensor  # [B, C]
    pairs: torch.Tensor  # [B, C, 2]
    locals: torch.Tensor  # [B, C, L]


def _uniform_subsets(
    shape: tuple[int, ...], n: int, k: int, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """Uniformly random k-subsets of ``range(n)``, one per entry of ``shape``: ``[*shape, k]``."""
    return host_to_device(torch.rand(*shape, n, generator=generator).argsort(-1)[..., :k], device)


def dino_combination_table(
    ce: torch.Tensor,
    num_globals: int,
    num_local: int,
    mode: str = "hard",
    max_combinations: int | None = None,
    generator: torch.Generator | None = None,
    global_pairs: str = "cross",
) -> CombinationTable:
    """Candidate combinations of every sample, sized so that ``choose(table.loss, mode)``
    returns the exact optimum over all ``P * C(Lc,L)`` combinations, P the global pairs of
    ``global_pairs`` (:func:`~hvp_lightning.selection.global_pair_index`).

    Exact (``max_combinations`` None or >= the number of combinations): one column per
    global pair, holding the pair's best locals under ``mode`` -- top-L (hard), bottom-L
    (easy) or a uniform L-subset (random; with the uniform column choice this is a uniform
    combination). Non-finite local terms rank last, so a pair's column is finite whenever L
    of its local terms are. Sampled (the paper's fidelity setting): ``max_combinations``
    columns, each an independently drawn uniform combination (with replacement) per sample.

    Args:
        ce: DINO cross-entropy table ``(B, G, G + Lc)`` from :func:`~hvp_lightning.losses.dino_ce_table`.
        num_globals: G, the global candidates (>= 2).
        num_local: L, the locals kept per combination (``0 <= L <= Lc``).
        mode: ``"hard"``, ``"easy"`` or ``"random"``.
        max_combinations: Column budget; ``None`` or at least the number of combinations: exact.
        generator: CPU generator for the random draws.
        global_pairs: ``"cross"`` or ``"all"`` (see :func:`~hvp_lightning.selection.global_pair_index`).

    Returns:
        :class:`CombinationTable` with ``loss`` ``(B, C)``, ``pairs`` ``(B, C, 2)``, ``locals`` ``(B, C, L)``,
        all on ``ce``'s device.

    Raises:
        ValueError: If G < 2, L is out of range, or ``mode``/``global_pairs`` is unknown.
    """
    bsz, g, v = ce.shape
    lc = v - num_globals
    if num_globals != g or g < 2 or not 0 <= num_local <= lc:
        raise ValueError(f"need G >= 2 globals and 0 <= L <= Lc: G={g}, L={num_local}, Lc={lc}")
    pairs = global_pair_index(g, global_pairs, device=ce.device)  # [P, 2]
    total = pairs.shape[0] * math.comb(lc, num_local)
    if max_combinations is not None and max_combinations < total:
        pick = host_to_device(torch.randint(pairs.shape[0], (bsz, max_combinations), generator=generator), ce.device)
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


def gather_combination_views(
    views: list[torch.Tensor], num_globals: int, pair: torch.Tensor, locals_: torch.Tensor
) -> list[torch.Tensor]:
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


class DinoSelection(NamedTuple):
    """Each sample's chosen combination (:func:`dino_exact_selection`)."""

    pair: torch.Tensor  # [B, 2] chosen global candidates
    locals: torch.Tensor  # [B, L] chosen local candidates
    loss: torch.Tensor  # [B] official DINO loss of the chosen combination


def dino_exact_selection(
    T: torch.Tensor,
    S_glob: torch.Tensor,
    S_loc: torch.Tensor,
    L: int,
    center: torch.Tensor,
    tau_t: float,
    tau_s: float,
    mode: str = "hard",
    max_combinations: int | None = None,
    generator: torch.Generator | None = None,
    global_pairs: str = "cross",
) -> DinoSelection:
    """Per-sample choice of 2 globals + L locals from ``T``/``S_glob`` ``[G, B, K]`` (teacher /
    student logits of the global candidates) and ``S_loc`` ``[Lc, B, K]``: the argmax (hard),
    argmin (easy) or a uniform draw (random) of the DINO loss over all combinations whose
    global pair is in ``global_pairs``, or over ``max_combinations`` random ones of them.
    Vectorised over samples. DINO's per-sample loss (:func:`~hvp_lightning.losses.dino.dino_ce_table`)
    composed with this module's search and :func:`~hvp_lightning.selection.choice.choose`: the
    reference the tests check against brute force."""
    ce = dino_ce_table(T, torch.cat([S_glob, S_loc]), center, tau_t, tau_s)
    table = dino_combination_table(ce, T.shape[0], L, mode, max_combinations, generator, global_pairs)
    choice = choose(table.loss, mode, generator)
    b = torch.arange(choice.shape[0], device=choice.device)
    return DinoSelection(table.pairs[b, choice], table.locals[b, choice], table.loss[b, choice])


def chosen_views_batch(
    batch: dict[str, Any],
    views: list[torch.Tensor],
    pair: torch.Tensor,
    locs: torch.Tensor,
    num_globals: int,
    teacher_out: Any = None,
) -> dict[str, Any]:
    """``batch`` with ``views`` (each sample's chosen 2 globals + locals: global candidates
    ``pair`` ``[B, 2]``, local candidates ``locs`` ``[B, L]``) in place of its candidates, the
    selection's teacher outputs for them (None: the training step runs the teacher) and, where
    recorded, their augmentation parameters. The tail of DINO's and iBOT's ``select_views``."""
    out = dict(batch, views=views)
    out.pop("teacher_out", None)
    if teacher_out is not None:
        out["teacher_out"] = teacher_out
    if "params" in batch:  # augmentation parameters travel with their views
        out["params"] = gather_view_params(batch["params"], torch.cat([pair, num_globals + locs], dim=1))
    return out
