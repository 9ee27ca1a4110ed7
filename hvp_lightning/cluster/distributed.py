"""DDP helpers: synchronised BatchNorm on GPUs and on CPUs (gloo), and per-rank state in
checkpoints.

Synchronised BatchNorm. Why: SimSiam and SimCLR normalise with the statistics of the *global* batch when they train
on several GPUs (SyncBatchNorm, in the backbone and in the heads), and DINO converts every
BatchNorm of a ResNet student and teacher the same way. HVP's selection pass then normalises
each candidate view set over the global batch too, exactly as the training step does.

``trainer.sync_batchnorm`` (``auto`` by default) picks it: ``auto`` converts whenever the
model has a BatchNorm layer (ResNet backbones, BN heads; DINO's ``has_batchnorms`` rule), so
BN-free ViT DINO/iBOT are untouched. Lightning applies the conversion only in DDP strategies
while fitting, so single-device runs and evaluation never see it.

On GPUs the layers become torch's ``nn.SyncBatchNorm``. torch synchronises GPU inputs only
(and DDP refuses ``nn.SyncBatchNorm`` in CPU modules), so on CPUs they become
:class:`CpuSyncBatchNorm` (two differentiable all-reduces per layer): CPU DDP runs -- the
multi-process runs the tests can afford -- normalise as GPU runs do.

Per-rank state. Each rank has its own RNG streams, HVP run totals and skipped files, but only
rank 0 writes the checkpoint: :func:`gather_per_rank` saves one entry per rank and
:func:`rank_entries` hands each rank its own back on resume.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from lightning.pytorch.plugins.layer_sync import TorchSyncBatchNorm, _BatchNormXd
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import ConfigError
from ..nn.teacher import has_batchnorm

T = TypeVar("T")


class CpuSyncBatchNorm(_BatchNorm):
    """BatchNorm over the samples of all processes for CPU tensors (any input rank >= 2).

    Training mode with a process group of more than one process: mean and (biased) variance
    of the global batch, two passes, gradients through the all-reduces (each rank's samples
    get the gradient of every rank's loss, as torch's GPU kernel does); running statistics
    updated as BatchNorm would with the global batch. Otherwise plain BatchNorm.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training or _world_size(self.process_group) == 1:
            return super().forward(input)
        return self._synced_forward(input)

    def _synced_forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self.process_group or dist.group.WORLD
        c = x.shape[1]
        dims = [0, *range(2, x.dim())]
        shape = (1, c) + (1,) * (x.dim() - 2)
        xf = x.float()
        sums = AllReduceSum.apply(torch.cat([xf.sum(dims), xf.new_tensor([x.numel() / c])]), group)
        n = sums[-1]
        mean = sums[:c] / n
        centred = xf - mean.view(shape)
        var = AllReduceSum.apply(centred.square().sum(dims), group) / n  # two passes: no cancellation
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), float(n.detach()))
        y = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y.to(x.dtype)

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, n: float) -> None:
        """BatchNorm's update with the global batch: momentum (or cumulative) average of the
        mean and of the unbiased variance."""
        self.num_batches_tracked.add_(1)  # type: ignore[union-attr,operator]
        factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)  # type: ignore[arg-type]
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)  # type: ignore[union-attr]
        self.running_var.lerp_((var * n / max(n - 1.0, 1.0)).to(self.running_var.dtype), factor)  # type: ignore[union-attr]


class AllReduceSum(torch.autograd.Function):
    """Differentiable sum over the processes of ``group``: the gradient of each input is the
    sum of every process's output gradient. (``torch.distributed.nn.functional.all_reduce``
    does the same and warns that it is deprecated; its successor is private.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _world_size(group: dist.ProcessGroup | None) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group or dist.group.WORLD)


def _replace_batchnorms(module: nn.Module, convert: Callable[[_BatchNorm], nn.Module | None]) -> nn.Module:
    """``module`` with every BatchNorm ``m`` replaced by ``convert(m)`` (None: kept as is)."""
    out = convert(module) if isinstance(module, _BatchNorm) else None
    out = module if out is None else out
    for name, child in module.named_children():
        out.add_module(name, _replace_batchnorms(child, convert))
    return out


def _same_state(src: _BatchNorm, dst: _BatchNorm) -> _BatchNorm:
    """``dst`` holding ``src``'s parameters and statistics (the same tensors) and mode."""
    if src.affine:
        dst.weight, dst.bias = src.weight, src.bias
    dst.running_mean, dst.running_var = src.running_mean, src.running_var
    dst.num_batches_tracked = src.num_batches_tracked
    return dst.train(src.training)


def _args(m: _BatchNorm) -> tuple:
    return m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats


class SyncBatchNormPlugin(TorchSyncBatchNorm):
    """Lightning's ``sync_batchnorm`` on GPUs (``nn.SyncBatchNorm``) and CPUs
    (:class:`CpuSyncBatchNorm`). ``converted`` counts the layers of the last conversion (the
    run summary's ``sync_batchnorm_layers``)."""

    converted: int = 0

    def apply(self, model: nn.Module) -> nn.Module:
        if _root_device(model).type != "cpu":
            model = super().apply(model)
        else:

            def to_cpu_sync(m: _BatchNorm) -> nn.Module | None:
                return None if isinstance(m, CpuSyncBatchNorm) else _same_state(m, CpuSyncBatchNorm(*_args(m)))

            model = _replace_batchnorms(model, to_cpu_sync)
        self.converted = sum(isinstance(m, (nn.SyncBatchNorm, CpuSyncBatchNorm)) for m in model.modules())
        return model

    def revert(self, model: nn.Module) -> nn.Module:
        def to_plain(m: _BatchNorm) -> nn.Module | None:
            return _same_state(m, _BatchNormXd(*_args(m))) if isinstance(m, CpuSyncBatchNorm) else None

        return super().revert(_replace_batchnorms(model, to_plain))


def _root_device(model: nn.Module) -> torch.device:
    """Where Lightning will run ``model`` (it converts before moving it there)."""
    try:
        return model.trainer.strategy.root_device  # type: ignore[union-attr,return-value]
    except (AttributeError, RuntimeError):  # no Trainer attached: where the model is now
        return next(model.parameters()).device


def sync_batchnorm_plugins(setting: str | bool, model: nn.Module) -> list[SyncBatchNormPlugin]:
    """The Trainer plugin for ``trainer.sync_batchnorm`` (``auto``: iff ``model`` has BatchNorm
    and none of it is fused with more, see :func:`fused_batchnorms`)."""
    fused = fused_batchnorms(model)
    if setting == "auto":
        setting = has_batchnorm(model) and not fused
    elif not isinstance(setting, bool):
        raise ValueError(f"trainer.sync_batchnorm={setting!r}; allowed: auto, true, false")
    if setting and fused:
        raise ConfigError(
            f"trainer.sync_batchnorm=True is not allowed for this backbone: its {fused[0]} layers fuse BatchNorm "
            "with an activation, which the conversion to synchronised BatchNorm would drop; set "
            "trainer.sync_batchnorm=false (or auto) for per-process BatchNorm"
        )
    return [SyncBatchNormPlugin()] if setting else []


def fused_batchnorms(model: nn.Module) -> list[str]:
    """Class names of BatchNorm subclasses that do more in their forward (timm's
    ``BatchNormAct2d``: norm + activation + dropout, in EfficientNet and others). torch's and
    Lightning's conversion rebuild every ``_BatchNorm`` as a plain ``SyncBatchNorm``, dropping
    the rest, so such a model keeps per-process BatchNorm."""
    plain = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm, CpuSyncBatchNorm, _BatchNormXd)
    return sorted({type(m).__name__ for m in model.modules() if isinstance(m, _BatchNorm) and type(m) not in plain})


# --- per-rank state in checkpoints ------------------------------------------------------------
def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes ((0, 1) without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_per_rank(value: T) -> list[T]:
    """Every rank's ``value`` (picklable; tensors on the CPU), in rank order: ``[value]`` in a
    single process. A collective: every rank must call it, as every rank dumps a checkpoint."""
    world = rank_and_world()[1]
    if world == 1:
        return [value]
    values: list[Any] = [None] * world
    dist.all_gather_object(values, value)
    return values


def rank_entries(saved: list[T]) -> list[T]:
    """The entries of per-rank state (from :func:`gather_per_rank`) this rank takes back: its
    own when the run has as many processes as the checkpoint; otherwise all of them on rank 0
    (to merge) and none elsewhere, so a sum or union over the ranks at the end stays whole."""
    rank, world = rank_and_world()
    if len(saved) == world:
        return [saved[rank]]
    return list(saved) if rank == 0 else []


def attempt_store(timeout: timedelta, env: Mapping[str, str] | None = None) -> dist.Store | None:
    """Under a torchrun that shares its rendezvous store with its workers (torch's default,
    ``TORCHELASTIC_USE_AGENT_STORE=True``), a view of that store for this restart attempt alone:
    torchrun's store under the prefix ``hvp_lightning/attempt_<TORCHELASTIC_RESTART_COUNT>/``;
    else None (the process group's own rendezvous is used).

    Without it a restarted rank reads the addresses its peers left in the shared store during the
    previous attempt and fails to connect, or waits, in ``init_process_group`` (pytorch#135712;
    benchmarks/RESULTS.md, "torchrun restarts on a shared store": 5 of 5 restarts failed without a
    prefix, with one they join; the script that showed it: ``git show 00970a2:benchmarks/torchrun_restart_race.py``)."""
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    agent = dist.TCPStore(
        env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"hvp_lightning/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", agent)


class AttemptStoreDDP(DDPStrategy):
    """Lightning's ``DDPStrategy`` whose process group, under a torchrun sharing its store, joins
    through :func:`attempt_store`: torchrun's restarts then connect (no
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE`` needed). Elsewhere it is ``DDPStrategy`` unchanged."""

    def setup_distributed(self) -> None:
        timeout = self._timeout if self._timeout is not None else timedelta(minutes=30)
        store = None if dist.is_initialized() else attempt_store(timeout)
        if store is not None:
            self.set_world_ranks()
            self._process_group_backend = self._get_process_group_backend()
            device = self.root_device if self.root_device.type != "cpu" else None
            dist.init_process_group(
                self._process_group_backend,
                store=store,
                rank=self.global_rank,
                world_size=self.world_size,
                timeout=timeout,
                device_id=device,
            )
        super().setup_distributed()  # finds the group made above (if any) and goes on as Lightning does
