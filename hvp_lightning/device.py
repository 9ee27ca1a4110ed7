"""``trainer.precision: auto`` and the start-up line that says which device and precision a run uses.

The main job (``python train.py``) must use a GPU where there is one and still run on a
CPU-only machine without a flag: ``trainer.accelerator: auto`` leaves the device to
Lightning, and ``precision: auto`` picks bf16 mixed precision on a GPU that supports it
(fp32 master weights; losses and selection stay fp32) and fp32 everywhere else -- on CPU,
bf16 convolutions were measured 30-37x slower (docs/DESIGN.md).
"""

from __future__ import annotations

import torch

from .errors import ConfigError

def runs_on_cpu(accelerator: str) -> bool:
    """Whether a Trainer with this ``accelerator`` ends up on the CPU on this machine."""
    if accelerator != "auto":
        return accelerator == "cpu"
    return not (torch.cuda.is_available() or torch.backends.mps.is_available())


def check_accelerator(key: str, accelerator: str) -> None:
    """A GPU asked for on a machine where torch finds none: one line naming the key and value
    (Lightning's own error, "No supported gpu backend found!", names neither)."""
    wants_cuda = accelerator == "cuda" or (accelerator == "gpu" and not torch.backends.mps.is_available())
    if wants_cuda and not torch.cuda.is_available():
        raise ConfigError(f"{key}={accelerator!r} is not allowed: cpu or auto on this machine (torch finds no CUDA GPU; "
                          "trainer=gpu, ddp_8gpu and the multi-GPU commands need one)")


def auto_precision(accelerator: str) -> str:
    """The precision ``auto`` stands for on this machine with this ``trainer.accelerator``."""
    on_cuda = accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
    return "bf16-mixed" if on_cuda and torch.cuda.is_bf16_supported() else "32-true"


def device_line(device: torch.device, precision: str, world_size: int = 1) -> str:
    """One start-up line, e.g. ``device: cuda:0 (NVIDIA H100 80GB HBM3) | precision: bf16-mixed``."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        name = f"{torch.get_num_threads()} threads"
    else:
        name = device.type
    procs = f" x {world_size} processes" if world_size > 1 else ""
    return f"device: {device} ({name}){procs} | precision: {precision}"
