"""Tensors a training step makes for its device without a host sync.

On a GPU the host queues kernels ahead of the device; anything that makes the host wait for
that queue to drain (a read of a value, a copy from pageable host memory) leaves the GPU idle
while the host catches up. Two such copies happened on every step: draws of HVP's private CPU
generators moved to the GPU, and the Python numbers the step logs, which
``LightningModule.log`` turns into tensors with ``torch.tensor(value, device=...)``.
tests/test_host_syncs.py counts what is left.
"""

from __future__ import annotations

import torch


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (drawn on the host, e.g. by HVP's private CPU generators) on ``device`` without
    waiting for the device's queue: a plain ``.to(cuda)`` of pageable memory blocks the host
    until the GPU has run every kernel queued before it. From pinned memory the copy is queued
    like a kernel, and torch's pinned-memory cache keeps the buffer until the copy has run.
    Contiguous first: a strided source would be made contiguous in pageable memory by the copy
    itself. The values are the same either way."""
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.contiguous().pin_memory()
    return t.to(device, non_blocking=True)


def device_number(value: float, device: torch.device) -> torch.Tensor:
    """A Python number as the 0-dim tensor of the default float dtype that
    ``LightningModule.log`` would make of it, filled on ``device`` (a kernel, no copy), so
    logging it costs no host-to-device copy that waits for the GPU's queue."""
    return torch.full((), float(value), device=device)
