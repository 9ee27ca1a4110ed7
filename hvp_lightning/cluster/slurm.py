"""SLURM launcher presets (conf/hydra/launcher/): their sizes from the trainer and data presets,
and the check that stops a sweep whose launcher and trainer disagree before anything is queued.

Lightning's DDP on SLURM starts no processes of its own: it expects one SLURM task per device,
``trainer.num_nodes`` nodes of ``trainer.devices`` tasks each, and fails (or hangs at the
rendezvous) inside the allocation when the numbers differ -- after the job waited in the queue.
:func:`check_slurm_job` therefore runs in the submitting process, on every job's config, before
any job is submitted: ``hydra_plugins.hvp_lightning_launcher.CheckedSlurmLauncher`` (the presets'
``_target_``; Hydra takes launchers from the ``hydra_plugins`` namespace only). Torch-free.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..errors import ConfigError
from ..schema import settings
from ..schema.run import TrainerSettings

GPU_ACCELERATORS = ("gpu", "cuda")


def task_count(devices: Any) -> int:
    """``hydra.launcher.tasks_per_node`` (and GPUs per node) from ``trainer.devices``: the number
    itself, or 0 for anything that is no positive count (``auto``, a device list, -1). The
    launcher's schema takes integers only, so ``auto`` would stop Hydra with a traceback while it
    builds the launcher; 0 gets through to :func:`check_slurm_job`, which names ``trainer.devices``."""
    return devices if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0 else 0


def gpus_per_node(accelerator: str, devices: Any) -> int | None:
    """``hydra.launcher.gpus_per_node`` of the ``slurm`` preset: ``trainer.devices`` GPUs on a GPU
    trainer, none (null: any partition, CPU ones included) for ``cpu`` and ``auto``."""
    return task_count(devices) if str(accelerator) in GPU_ACCELERATORS else None


AUTO_WORKERS = 4  # the loader workers a task gets CPUs for under data.num_workers=auto


def cpus_per_task(num_workers: Any) -> Any:
    """``hydra.launcher.cpus_per_task``: the training process plus its ``data.num_workers`` loader
    workers; for ``auto``, :data:`AUTO_WORKERS` of them (on the node, auto then starts one worker
    per CPU of the task but one: hvp_lightning/device.py ``auto_workers``)."""
    if num_workers == "auto":
        num_workers = AUTO_WORKERS
    return num_workers + 1 if isinstance(num_workers, int) else num_workers


def slurm_threads(environ: Mapping[str, str] = os.environ) -> int | None:
    """The intra-op thread count for a process of a SLURM job: the CPUs SLURM gave its task
    (``SLURM_CPUS_PER_TASK``), unless ``OMP_NUM_THREADS`` is set or the job asked for no CPU count.

    Without it Lightning sets ``OMP_NUM_THREADS`` to the node's CPUs // ``trainer.devices``
    (``lightning.fabric.utilities.distributed._set_num_threads_if_needed``), whatever SLURM
    allocated: 2 nodes x 1 process ran 2 threads per process on a 2-core node, 1 node x 2 processes
    1, and the thread count changes the order of float sums in CPU kernels, so the two layouts
    drifted apart by ~1e-6 per step. With the allocation's count both layouts run the same arithmetic
    (tests/test_slurm.py), and no process oversubscribes a shared node."""
    if "OMP_NUM_THREADS" in environ or not environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return None
    return max(1, int(environ["SLURM_CPUS_PER_TASK"]))


def use_slurm_threads() -> None:
    """Apply :func:`slurm_threads` to this process (before the Trainer, which then leaves it be)."""
    threads = slurm_threads()
    if threads is not None:
        import torch

        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


OmegaConf.register_new_resolver("hvp_slurm_tasks", task_count, replace=True)
OmegaConf.register_new_resolver("hvp_slurm_gpus", gpus_per_node, replace=True)
OmegaConf.register_new_resolver("hvp_slurm_cpus", cpus_per_task, replace=True)


def check_slurm_job(trainer: DictConfig | TrainerSettings, launcher: dict[str, Any]) -> None:
    """Raise :class:`ConfigError` when a job with this ``trainer`` config (a job's composed
    ``trainer`` node, validated here, or its validated section) cannot run as the SLURM
    ``launcher`` parameters (resolved, as submitit gets them) would lay it out."""
    if not isinstance(trainer, TrainerSettings):
        trainer = settings(TrainerSettings, trainer, "trainer.")
    devices, accelerator = trainer.devices, trainer.accelerator
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigError(
            f"trainer.devices={devices!r} is not allowed with a SLURM launcher: a number of devices "
            "per node (hydra.launcher.tasks_per_node starts one SLURM task per device)"
        )
    tasks = launcher.get("tasks_per_node")
    if tasks != devices:
        raise ConfigError(
            f"hydra.launcher.tasks_per_node={tasks!r} differs from trainer.devices={devices}: "
            "Lightning's DDP on SLURM runs one task per device (leave tasks_per_node to the preset)"
        )
    num_nodes, nodes = trainer.num_nodes, launcher.get("nodes", 1)
    if nodes != num_nodes:
        raise ConfigError(
            f"hydra.launcher.nodes={nodes!r} differs from trainer.num_nodes={num_nodes!r}: "
            "Lightning joins exactly trainer.num_nodes nodes (leave nodes to the preset)"
        )
    if accelerator == "cpu":
        gres = str(launcher.get("gres") or "")
        asked = {key: launcher.get(key) for key in ("gpus_per_node", "gpus_per_task") if launcher.get(key)}
        if "gpu" in gres:
            asked["gres"] = gres
        if asked:
            keys = ", ".join(f"hydra.launcher.{k}={v!r}" for k, v in asked.items())
            raise ConfigError(
                f"{keys} is not allowed with trainer.accelerator='cpu': the GPUs would sit idle "
                "(set it to null, or trainer.accelerator=gpu)"
            )


def partition_cpus(partition: str | None) -> dict[str, int] | None:
    """The CPUs of every node of ``partition`` (a name, a comma-separated list, or None: the cluster's
    default partition), as ``sinfo`` reports them; None where ``sinfo`` is missing or cannot tell
    (the check below is then skipped: SLURM itself stays the judge)."""
    if shutil.which("sinfo") is None:
        return None
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %P"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    wanted = set(partition.split(",")) if partition else None
    cpus: dict[str, int] = {}
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) != 3 or not fields[1].isdigit():
            continue
        node, count, part = fields
        if (wanted is None and part.endswith("*")) or (wanted is not None and part.rstrip("*") in wanted):
            cpus[node] = int(count)
    return cpus or None


def check_fits_partition(launcher: Mapping[str, Any], node_cpus: Mapping[str, int] | None) -> None:
    """Raise :class:`ConfigError` when no set of ``hydra.launcher.nodes`` nodes of the partition
    (``node_cpus``: :func:`partition_cpus`) has the CPUs one node of the job asks for (tasks per node
    x CPUs per task). SLURM would queue such a job and leave it pending for ever (reason
    ``PartitionConfig``), while the submitting process waits. None: not known, not checked."""
    if not node_cpus:
        return
    nodes, tasks = launcher.get("nodes") or 1, launcher.get("tasks_per_node") or 1
    per_task = launcher.get("cpus_per_task") or 1
    need = tasks * per_task
    fitting = sum(count >= need for count in node_cpus.values())
    if fitting >= nodes:
        return
    where = f"partition {launcher['partition']!r}" if launcher.get("partition") else "the default partition"
    sizes = ", ".join(f"{n} node{'s' * (n > 1)} of {c} CPUs" for c, n in sorted(Counter(node_cpus.values()).items()))
    raise ConfigError(
        f"hydra.launcher.tasks_per_node={tasks} x hydra.launcher.cpus_per_task={per_task} = {need} CPUs per node "
        f"on hydra.launcher.nodes={nodes} node(s) does not fit {where}: {fitting} of its nodes have {need} CPUs "
        f"(sinfo: {sizes}). Lower data.num_workers (CPUs per task = workers + 1) or trainer.devices, or set "
        "hydra.launcher.cpus_per_task or hydra.launcher.partition"
    )
