"""The per-sample choice over a candidate table, and the seeds of HVP's private generators."""

from __future__ import annotations

import hashlib

import torch

from ..nn.sync_free import host_to_device
from ..settings.hvp import LOSS_MODES


def choose(table: torch.Tensor, mode: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-sample choice over candidate combinations: ``table`` is ``[B, C]`` -> LongTensor ``[B]``.

    ``hard`` = argmax of the loss (the paper's HVP), ``easy`` = argmin (the "cooperative"
    ablation), ``random`` = uniform over the same candidates (isolates the effect of the
    choice from the effect of drawing more views).

    Non-finite entries (NaN, +-inf: a diverged model, an fp16 overflow in the selection
    forward) are never chosen, in any mode -- unmasked, a NaN would win both argmax and
    argmin. A sample with no finite entry at all raises :class:`FloatingPointError`: there
    is nothing sound to train on (this check costs one host sync).

    Args:
        table: Per-sample loss of each candidate, ``(B, C)``, any float dtype and device.
        mode: ``"hard"``, ``"easy"`` or ``"random"`` (``hvp.mode``; ``min_iou`` chooses from the
            crop boxes, :func:`~hvp_lightning.selection.geometry.least_overlap`).
        generator: CPU generator for ``random`` (HVP's private stream); ignored otherwise.

    Returns:
        Column index per sample, int64 ``(B,)`` on ``table``'s device.

    Raises:
        ValueError: If ``mode`` is not one of the three.
        FloatingPointError: If a sample has no finite entry.
    """
    if mode not in LOSS_MODES:
        raise ValueError(f"hvp.mode={mode!r} chooses from no loss table; allowed here: {', '.join(LOSS_MODES)}")
    finite = torch.isfinite(table)
    if not bool(finite.any(dim=1).all()):
        bad = (~finite.any(dim=1)).nonzero().flatten().tolist()
        raise FloatingPointError(
            f"HVP selection: every candidate loss is non-finite (NaN/inf) for {len(bad)} of {table.shape[0]} "
            f"samples (batch positions {bad[:8]}); refusing to train on them. The model may have diverged "
            "(learning rate?), or hvp.selection_precision=fp16 overflowed (try bf16 or fp32)."
        )
    if mode == "hard":
        return table.masked_fill(~finite, float("-inf")).argmax(dim=1)
    if mode == "easy":
        return table.masked_fill(~finite, float("inf")).argmin(dim=1)
    # Uniform over each sample's finite entries: the argmax of i.i.d. uniform keys.
    keys = host_to_device(torch.rand(table.shape, generator=generator), table.device)
    return keys.masked_fill(~finite, -1.0).argmax(dim=1)


def stable_seed(*parts: int) -> int:
    """A 63-bit seed from integers (seed, step, rank, ...), the same in every process and
    Python session (unlike ``hash``): HVP's random draws are keyed by optimiser step,
    micro-batch and rank, and never touch the global RNG."""
    digest = hashlib.blake2b(" ".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
