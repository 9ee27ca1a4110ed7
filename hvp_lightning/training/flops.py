"""Model FLOPs of whatever a function runs through a module's layers, split into named phases.

Convention (stated once, used by every ``cost`` figure of a run; docs/logging.md):

* FLOPs are the matrix products and convolutions (attention included) that torch's
  :class:`~torch.utils.flop_counter.FlopCounterMode` counts, 2 per multiply-add; element-wise
  ops (norms, activations, softmax) are not counted.
* *Model* FLOPs only: those inside a submodule's ``forward`` (backbones, heads, predictors,
  a teacher). What a step computes outside its submodules -- the loss and its tables, the
  choice, augmentation -- is not counted.
* A forward whose output requires a gradient counts 3 times (forward + backward, the backward
  taken as twice the forward, as in the usual "6N" rule); a forward without one (a teacher or
  momentum target, the selection pass, anything under ``torch.no_grad``) counts once.

Run it on the ``meta`` device: shapes are all it needs, so counting costs no memory and no time
worth mentioning (:func:`hvp_lightning.training.cost.count_step_flops`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

BACKWARD_FACTOR = 3  # forward + backward, the backward counted as two forwards


def _requires_grad(out: Any) -> bool:
    if isinstance(out, torch.Tensor):
        return out.requires_grad
    if isinstance(out, dict):
        return any(_requires_grad(v) for v in out.values())
    if isinstance(out, (list, tuple)):
        return any(_requires_grad(v) for v in out)
    return False


class MetaReads(TorchFunctionMode):
    """A read of a ``meta`` tensor's value (``bool(t)``, ``.item()``, ``.tolist()``) answers 1s:
    meta tensors have shapes, no values, and a step may check a value (HVP's choice checks that
    every sample has a finite candidate) before it goes on."""

    READS = {torch.Tensor.__bool__, torch.Tensor.item, torch.Tensor.__int__, torch.Tensor.__float__}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            if func in self.READS:
                return func(torch.ones((), dtype=args[0].dtype), *args[1:], **kwargs)
            if func is torch.Tensor.tolist:
                return torch.ones(args[0].shape, dtype=args[0].dtype).tolist()
        return func(*args, **kwargs)


class MetaAutocast(torch.autocast):
    """``torch.autocast`` that takes the ``meta`` device as the CPU (torch has no autocast state
    for meta, and a step opens autocast regions on its data's device)."""

    def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:
        super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)


class FlopMeter:
    """Counts the model FLOPs (module docstring) of what runs inside :meth:`count`, by phase.

    Example::

        meter = FlopMeter(model)
        with meter.count():
            with meter.phase("selection"):
                ...  # counted under "selection"
            loss = model(x).sum()  # counted under "step"
        meter.flops  # {"selection": ..., "step": ...}
    """

    def __init__(self, module: nn.Module, default_phase: str = "step") -> None:
        self.module = module
        self.flops: dict[str, int] = defaultdict(int)
        self._phase = default_phase
        self._depth = 0  # submodule forwards under way: only the outermost one is counted
        self._start = 0
        self._counter: FlopCounterMode | None = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count what runs inside under ``name`` (then back to the enclosing phase)."""
        outer, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = outer

    def _pre(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0:
            assert self._counter is not None
            self._start = self._counter.get_total_flops()
        self._depth += 1

    def _post(self, module: nn.Module, args: Any, out: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            assert self._counter is not None
            flops = self._counter.get_total_flops() - self._start
            self.flops[self._phase] += flops * (BACKWARD_FACTOR if _requires_grad(out) else 1)

    @contextmanager
    def count(self) -> Iterator[None]:
        """Count the model FLOPs of every submodule forward run inside. For a step on the
        ``meta`` device: values of meta tensors read as 1s (:class:`MetaReads`) and autocast on
        meta acts as on the CPU (:class:`MetaAutocast`, in place of ``torch.autocast`` until
        the count ends: a short, synchronous window before training)."""
        subs = [m for m in self.module.modules() if m is not self.module]
        handles = [m.register_forward_pre_hook(self._pre) for m in subs]
        handles += [m.register_forward_hook(self._post) for m in subs]
        self._counter = FlopCounterMode(display=False)
        try:
            with self._counter, MetaReads(), mock.patch.object(torch, "autocast", MetaAutocast):
                yield
        finally:
            for h in handles:
                h.remove()
            self._counter, self._depth = None, 0


def model_flops(module: nn.Module, fn: Callable[[], Any]) -> int:
    """The model FLOPs (module docstring) of ``fn()``, which runs ``module``'s submodules."""
    meter = FlopMeter(module)
    with meter.count():
        fn()
    return sum(meter.flops.values())
