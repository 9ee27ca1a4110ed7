"""``hvp.selection_fraction``: the selection pass scores a random part of each micro-batch.

Of a micro-batch of B samples, ``k = ceil(fraction * B)`` (at least 2, as BatchNorm needs two
samples; at most B) are drawn without replacement, by HVP's private generator seeded with
(seed, optimiser step, micro-batch, rank), and kept in batch order. The selection pass is the
method's own on the batch of those k samples, as if it were the whole batch: BatchNorm
statistics, SimCLR's negatives, MoCo v3's keys and the VICReg/Barlow Twins reference are over
the k scored samples (of every rank under DDP, each rank drawing k of its B). The scored samples
train on their chosen candidates, the others on their first combination (the views a step
without selection trains on: candidates 0 and 1; DINO's first L locals), all in one ordinary
training step over the whole batch. The selection costs about ``k / B`` of a full one.

A batch is cut and put back by its per-sample entries: ``views`` (a list of ``[B, ...]``),
``params`` (``{name: [B, ...]}``) and the host's ``hvp_sample_keys`` (iBOT: ``masks``, a list of
``[B, h, w]``); every other entry passes through whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from ..nn.sync_free import host_to_device


def scored_count(batch_size: int, fraction: float) -> int:
    """k, the samples a selection pass scores of a batch of ``batch_size`` (module docstring)."""
    return min(batch_size, max(2, math.ceil(fraction * batch_size - 1e-9)))


def scored_samples(batch_size: int, fraction: float, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """The sorted indices ``[k]`` (int64, on ``device``) of the samples scored this step."""
    k = scored_count(batch_size, fraction)
    drawn = torch.randperm(batch_size, generator=generator)[:k].sort().values
    return host_to_device(drawn, device)


def _cut(value: Any, index: torch.Tensor) -> Any:
    if isinstance(value, torch.Tensor):
        return value.index_select(0, index.to(value.device))
    if isinstance(value, dict):
        return {k: _cut(v, index) for k, v in value.items()}
    return [_cut(v, index) for v in value]


def _put(whole: Any, index: torch.Tensor, part: Any) -> Any:
    if isinstance(whole, torch.Tensor):
        return whole.index_copy(0, index.to(whole.device), part.to(whole.dtype))
    if isinstance(whole, dict):
        return {k: _put(v, index, part[k]) for k, v in whole.items()}
    return [_put(w, index, p) for w, p in zip(whole, part, strict=True)]


def sample_subset(batch: dict[str, Any], index: torch.Tensor, keys: Iterable[str] = ()) -> dict[str, Any]:
    """``batch`` with its per-sample entries (``views``, ``params``, ``keys``) cut to the samples
    ``index``; the other entries whole."""
    names = ("views", "params", *keys)
    return dict(batch, **{k: _cut(batch[k], index) for k in names if batch.get(k) is not None})


def merge_samples(
    whole: dict[str, Any], index: torch.Tensor, part: dict[str, Any], keys: Iterable[str] = ()
) -> dict[str, Any]:
    """``whole`` with the per-sample entries of samples ``index`` taken from ``part`` (a batch of
    those samples only, in that order). Out of place: nothing of ``whole`` is written."""
    names = ("views", "params", *keys)
    return dict(whole, **{k: _put(whole[k], index, part[k]) for k in names if whole.get(k) is not None})
