"""HVP's run totals: what the selection passes of a run did, summed on device (no sync per
step), kept in checkpoints and reported in ``summary.json``."""

from __future__ import annotations

import torch

from ..settings.hvp import HVP

# Layout of ``HardViewMixin.hvp_totals`` (sums over all HVP steps, all micro-batches).
TOTALS = (
    "selection_selected_loss_sum",
    "selection_candidate_loss_sum",
    "selection_samples",
    "trained_loss_sum",
    "trained_samples",
    "nonfinite_candidates",
)


def add_totals(
    totals: torch.Tensor | None,
    trained: torch.Tensor,
    trained_samples: int,
    selected: torch.Tensor | None = None,
    candidates: torch.Tensor | None = None,
    nonfinite: torch.Tensor | None = None,
) -> torch.Tensor:
    """``totals`` plus one HVP step: the ``trained`` loss (a scalar, the step's mean over its
    ``trained_samples``) and, from a selection pass (None: ``hvp.mode=min_iou``, none ran), the
    per-sample ``selected`` and mean ``candidates`` losses ``[k]`` of the k samples it scored and
    the count of ``nonfinite`` candidate entries; in :data:`TOTALS` order, float64, on the
    step's device."""
    n = torch.full((), float(trained_samples), dtype=trained.dtype, device=trained.device)  # no host copy
    if selected is None:
        zero = torch.zeros((), dtype=trained.dtype, device=trained.device)
        selection = [zero, zero, zero, zero]
    else:
        k = torch.full((), float(selected.shape[0]), dtype=selected.dtype, device=selected.device)
        selection = [selected.sum(), candidates.sum(), k, nonfinite]  # type: ignore[union-attr]
    sel_sum, cand_sum, k, bad = selection
    inc = torch.stack([sel_sum, cand_sum, k, trained * n, n, bad.to(sel_sum.dtype)]).double()
    if totals is not None and totals.numel() < inc.numel():  # a checkpoint from before trained/nonfinite totals
        totals = torch.cat([totals.to(inc.device), inc.new_zeros(inc.numel() - totals.numel())])
    return inc if totals is None else totals.to(inc.device) + inc


def rank_totals(saved: list[torch.Tensor | None] | torch.Tensor | None, rank: int, world: int) -> torch.Tensor | None:
    """The run totals rank ``rank`` of ``world`` resumes with, from a checkpoint's per-rank list.

    Its own entry when the run has as many ranks as the checkpoint; otherwise rank 0 takes the
    sum of all and the others zeros, so the summary's sum over the ranks still counts every
    saved step once. A checkpoint from before per-rank totals holds one tensor, the writer's
    (rank 0's): the whole run's for a single process; other ranks' were never saved.

    Args:
        saved: The checkpoint's ``hvp_totals`` (None or all-None entries: no HVP step yet).
        rank: This process's rank.
        world: The number of processes now.

    Returns:
        float64 totals in :data:`TOTALS` order on the CPU, or None when nothing was saved.
    """
    entries = [saved] if isinstance(saved, torch.Tensor) else list(saved or ())
    parts = [t for t in entries if t is not None]
    if not parts:
        return None
    mine = [entries[rank]] if len(entries) == world else entries if rank == 0 else []
    return sum((t for t in mine if t is not None), torch.zeros_like(parts[0]))


def summarise_totals(totals: torch.Tensor | None) -> dict[str, float | int | None]:
    """``summary.json``'s HVP statistics from the run totals (already summed over ranks):
    the selection pass's means (chosen and all candidates), the trained loss's mean over the
    HVP steps, the samples behind them and how many non-finite candidate entries were masked.

    ``selected_samples`` are the samples of the HVP steps (the images the run's cost counts as
    selected), ``scored_samples`` those of them a selection pass scored: fewer under
    ``hvp.selection_fraction``, none under ``hvp.mode=min_iou``. (A checkpoint from before the
    trained totals has zeros there; its HVP steps scored every sample, hence the max.)"""
    t = dict(zip(TOTALS, totals.double().tolist())) if totals is not None else {}
    sel_n, trained_n = t.get("selection_samples", 0.0), t.get("trained_samples", 0.0)
    return {
        "selection_selected_loss_mean": t["selection_selected_loss_sum"] / sel_n if sel_n else None,
        "selection_candidate_loss_mean": t["selection_candidate_loss_sum"] / sel_n if sel_n else None,
        "trained_loss_mean": t["trained_loss_sum"] / trained_n if trained_n else None,
        "selected_samples": int(max(sel_n, trained_n)),
        "scored_samples": int(sel_n),
        "nonfinite_candidates": int(t.get("nonfinite_candidates", 0)),
    }


def hvp_summary(hvp: HVP, totals: torch.Tensor | None) -> dict[str, object]:
    """``summary.json``'s ``hvp`` entry: the settings that matter for comparing runs, then
    :func:`summarise_totals`."""
    return {
        "num_views": hvp.num_views,
        "mode": hvp.mode,
        "every_n_steps": hvp.every_n_steps,
        "selection_precision": hvp.selection_precision,
        "selection_scale": hvp.selection_scale,
        "selection_fraction": hvp.selection_fraction,
        **summarise_totals(totals),
    }
