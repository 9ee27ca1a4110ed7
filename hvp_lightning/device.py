"""``trainer.precision: auto``, ``data.num_workers: auto`` and the start-up line that says which device
and precision a run uses.

The main job (``python train.py``) must use a GPU where there is one and still run on a
CPU-only machine without a flag: ``trainer.accelerator: auto`` leaves the device to
Lightning, and ``precision: auto`` picks bf16 mixed precision on a GPU that supports it
(fp32 master weights; losses and selection stay fp32) and fp32 everywhere else -- on CPU,
bf16 convolutions were measured 30-37x slower (docs/DESIGN.md). ``precision: auto-16-mixed`` is
the same choice with fp16 on the GPU: the HVP code's SimSiam and SimCLR runs (``--fp16 True``,
``use_fp16: true``), which Lightning cannot run on a CPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from .errors import ConfigError

if TYPE_CHECKING:
    from .schema.run import TrainerSettings

log = logging.getLogger(__name__)

AUTO_WORKERS_MAX = 8  # data.num_workers: auto never starts more loader workers per process


def runs_on_cpu(accelerator: str) -> bool:
    """Whether a Trainer with this ``accelerator`` ends up on the CPU on this machine."""
    if accelerator != "auto":
        return accelerator == "cpu"
    return not (torch.cuda.is_available() or torch.backends.mps.is_available())


def usable_cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask: a SLURM or container limit), else all."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def local_processes(trainer: TrainerSettings) -> int:
    """The training processes a ``trainer`` config section starts on this machine:
    ``trainer.devices`` of them (a list or ``"0,1"``: its length; the GPUs torch sees for ``auto``
    / -1 on a GPU), one for ``auto`` on a CPU."""
    devices = trainer.devices
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return max(1, len(devices))
    if isinstance(devices, str) and "," in devices:
        return max(1, len([d for d in devices.split(",") if d.strip()]))
    if (n := cpu_processes(devices)) is not None:
        return max(1, n)
    on_gpu = not runs_on_cpu(trainer.accelerator) and torch.cuda.is_available()
    return max(1, torch.cuda.device_count()) if on_gpu and str(devices) in ("auto", "-1") else 1


def auto_workers(processes: int = 1, environ: Mapping[str, str] = os.environ) -> tuple[int, str]:
    """``data.num_workers: auto``: (loader workers, why) -- one per CPU core of this process's share
    but one (the training process's own), at most :data:`AUTO_WORKERS_MAX`, none on a single core.
    The share is the CPUs SLURM gave the task (``SLURM_CPUS_PER_TASK``: each task is bound to its
    own), else the usable cores (:func:`usable_cpu_cores`: affinity, a container's limit) divided
    among the ``processes`` this machine runs (:func:`local_processes`). Per machine, not stored:
    a run resumed elsewhere uses that machine's."""
    cores = usable_cpu_cores()
    slurm = environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        share, why = min(int(slurm), cores), f"{slurm} CPUs per SLURM task"
    else:
        share = cores // max(1, processes)
        why = f"{cores} usable CPU core{'s' * (cores != 1)}" + (f" / {processes} processes" if processes > 1 else "")
    return max(0, min(AUTO_WORKERS_MAX, share - 1)), why


def loader_workers(requested: int | str, processes: int = 1, key: str = "data.num_workers") -> tuple[int, str]:
    """(the loader workers to start, the start-up line's words for them) for ``key`` = ``requested``:
    ``auto`` (:func:`auto_workers`), or a number capped at the usable cores -- more workers only
    compete for them (and torch warns about it for every loader) -- with one warning."""
    if requested == "auto":
        n, why = auto_workers(processes)
        return n, f"{n} loader worker{'s' * (n != 1)} ({key}=auto: {why})"
    n, cores = int(requested), usable_cpu_cores()
    if n > cores:
        from lightning.pytorch.utilities import rank_zero_only

        if rank_zero_only.rank == 0:
            log.warning(
                "%s=%d is more than the %d CPU cores this process may use: using %d loader workers",
                key,
                n,
                cores,
                cores,
            )
        n = cores
    return n, f"{n} loader worker{'s' * (n != 1)}"


def cpu_processes(devices: object) -> int | None:
    """The number of CPU processes a ``trainer.devices`` value starts (an int or its string, as
    Lightning's CPU accelerator takes), or None for values it reads otherwise (``auto``: one)."""
    if isinstance(devices, bool):
        return None
    if isinstance(devices, int):
        return devices
    return int(devices) if isinstance(devices, str) and devices.strip().isdigit() else None


def check_accelerator(key: str, accelerator: str) -> None:
    """A GPU asked for on a machine where torch finds none: one line naming the key and value
    (Lightning's own error, "No supported gpu backend found!", names neither)."""
    wants_cuda = accelerator == "cuda" or (accelerator == "gpu" and not torch.backends.mps.is_available())
    if wants_cuda and not torch.cuda.is_available():
        raise ConfigError(
            f"{key}={accelerator!r} is not allowed: cpu or auto on this machine (torch finds no CUDA GPU; "
            "trainer=gpu, ddp_8gpu and the multi-GPU commands need one)"
        )


def auto_precision(accelerator: str, value: str = "auto") -> str:
    """The precision ``value`` (``auto`` or ``auto-16-mixed``) stands for on this machine with
    this ``trainer.accelerator``: off a CUDA GPU 32-true; on one, ``auto-16-mixed`` is 16-mixed
    and ``auto`` bf16-mixed where the GPU computes bf16 natively (compute capability 8.0+:
    torch's ``is_bf16_supported()`` also says yes on a V100 or T4, where bf16 is emulated and
    runs slower than fp32), else 32-true."""
    on_cuda = accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
    if value == "auto-16-mixed":
        return "16-mixed" if on_cuda else "32-true"
    return "bf16-mixed" if on_cuda and torch.cuda.is_bf16_supported(including_emulation=False) else "32-true"


def set_matmul_precision() -> None:
    """TF32 for the networks' fp32 matmuls on GPUs, in training and in evaluation alike:
    ``eval.py``'s k-NN then computes the features and similarities the run's k-NN monitor
    computed (the same numbers, as on CPU), and ViT evaluation gets the Tensor Cores training
    had. The candidate tables opt out themselves (``selection.exact_fp32``).

    Through the legacy call, which Lightning's CUDA start-up check reads back (a TF32 flag set
    only through ``torch.backends.cuda.matmul.fp32_precision`` makes that read raise). The
    legacy "high" also lets oneDNN use TF32 on CPUs that have it; CPUs stay exact fp32, as the
    tests and the README's numbers assume."""
    torch.set_float32_matmul_precision("high")
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"


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
