"""How the selection forward runs: at ``hvp.selection_precision``, in a frozen state.

``auto`` (the default) is the precision of the training step itself -- the autocast
Lightning runs the step under (bf16 for ``bf16-mixed``, fp16 for ``16-mixed``, none for
``32-true``) -- except on CPU, where it is fp32; ``fp32`` switches Lightning's autocast off
for the selection, ``bf16`` / ``fp16`` force one. The candidate tables are computed in fp32
either way (:func:`hvp_lightning.losses.exact_fp32`), so the argmax ranks the loss the method computes.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..settings.hvp import PRECISIONS

# Autocast dtype Lightning runs a training step under, per trainer.precision (the ones
# config.py allows); None = no autocast.
STEP_DTYPES: dict[str, torch.dtype | None] = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


def step_autocast_dtype(trainer_precision: str) -> torch.dtype | None:
    """The autocast dtype of a training step under ``trainer.precision`` (None: fp32)."""
    if trainer_precision not in STEP_DTYPES:
        raise ValueError(f"trainer.precision={trainer_precision!r}; allowed: {', '.join(STEP_DTYPES)}")
    return STEP_DTYPES[trainer_precision]


def ambient_autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force for ``device_type`` here (None: no autocast): inside a
    Lightning training step, the step's own precision."""
    if not torch.amp.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def resolve_selection_dtype(
    precision: str, device_type: str, step_dtype: torch.dtype | None = None
) -> torch.dtype | None:
    """Autocast dtype for the selection forward, or None for full fp32.

    ``auto`` follows the training step (``step_dtype``, see :func:`step_autocast_dtype`) so
    that the selection costs what a forward of the step costs. On CPU it is always fp32:
    bf16/fp16 autocast convolutions were measured 30-37x *slower* than fp32 there (docs/DESIGN.md);
    an explicit ``bf16``/``fp16`` falls back loudly, never silently.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"hvp.selection_precision={precision!r}; allowed: {', '.join(PRECISIONS)}")
    if precision == "fp32" or device_type == "cpu" and precision == "auto":
        return None
    if device_type == "cpu":
        warnings.warn(
            f"hvp.selection_precision={precision} is not used on CPU: low-precision autocast "
            "convolutions run 30-37x slower than fp32 there; selecting in fp32 instead.",
            stacklevel=2,
        )
        return None
    if precision == "auto":
        return step_dtype
    return torch.bfloat16 if precision == "bf16" else torch.float16


def outputs_reusable(
    scale: float, fraction: float, selection_dtype: torch.dtype | None, step_dtype: torch.dtype | None
) -> bool:
    """May the selection pass's outputs stand in for the step's own? Only on the step's own views
    (full size, whole batch) at fp32 or the step's own autocast dtype."""
    return scale == 1 and fraction == 1 and (selection_dtype is None or selection_dtype == step_dtype)


@contextmanager
def frozen_state(module: nn.Module, device: torch.device) -> Iterator[None]:
    """No gradients, BatchNorm buffers (every running statistic: :func:`running_buffers`) and
    RNG streams as they were on entry.

    BatchNorm runs exactly as in the training step (train mode, batch statistics, running
    stats tracked), on copies of its buffers (running mean/var, ``num_batches_tracked``); the
    originals are put back untouched on exit. Not written in place: a graph that saved them
    for its backward (an earlier micro-batch summed into the same loss) stays valid. Turning
    ``track_running_stats`` off instead would crash torch's SyncBatchNorm on CUDA under
    bf16/fp16 autocast (without running stats its gather kernel takes the input's dtype and
    rejects the fp32 sample counts). SyncBatchNorm (DDP) is a ``_BatchNorm`` too: candidates
    are normalised with the statistics of the global batch of their view set, as the training
    step normalises its views. Forking the RNG means dropout/drop-path in the selection
    forward cannot shift the random streams of the training step or the loader.

    Args:
        module: The host module whose forward scores the candidates.
        device: The data's device; a CUDA device's RNG is forked along with the CPU's.

    Returns:
        A context manager (generator-based); the selection forward runs inside it.
    """
    kept = [(m, running_buffers(m)) for m in module.modules()]
    kept = [(m, buffers) for m, buffers in kept if buffers]
    devices = [device] if device.type == "cuda" else []
    try:
        for m, buffers in kept:
            for n, b in buffers.items():
                setattr(m, n, b.clone())
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            yield
    finally:  # every original back, also after a failed clone
        for m, buffers in kept:
            for n, b in buffers.items():
                setattr(m, n, b)


def running_buffers(m: nn.Module) -> dict[str, torch.Tensor]:
    """The buffers a training-mode forward of ``m`` itself updates: BatchNorm's (any
    ``_BatchNorm``, timm's ``BatchNormAct2d`` included) and every other ``running_*`` statistic
    (timm's EvoNorm keeps a ``running_var``)."""
    if isinstance(m, _BatchNorm) and not m.track_running_stats:
        return {}
    return {
        n: b
        for n, b in m.named_buffers(recurse=False)
        if b is not None and (n.startswith("running_") or n == "num_batches_tracked")
    }
