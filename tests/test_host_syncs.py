"""Host syncs of one training step, counted on the CPU (the DINO step ran at 173 images/s
on an H200 where its loader gave 745-820).

A host sync makes the Python process wait until the GPU has run everything queued before it,
so the GPU then idles while the host queues the next kernels. On a GPU that happens at a read
of a value (``.item()``, ``bool(t)``, ``.tolist()``, ``.cpu()``), an op whose output shape
depends on values (``nonzero``, boolean-mask indexing, ``unique``) and a blocking copy from
host memory (``.to(cuda)`` of a CPU tensor, ``torch.tensor(x, device=cuda)``, which
``LightningModule.log`` does with every Python number it is given).

As in tests/test_device_guard.py the model and the batch sit on the ``meta`` device, standing
in for a GPU; :class:`SyncCounter` names each such event by the innermost package function
that caused it. The step is what Lightning runs per batch: ``on_train_batch_start``,
``training_step`` (selection pass, choice, training forward, loss, logging), backward,
clipping, ``on_train_batch_end`` (counters, EMA teacher and centre) and the online analysis
callback (on by default in ``train.py``). Lightning's own per-step work is not counted (it
reads no value per step with the progress bar and loggers off; see the GPU profile,
``benchmarks/step_profile.py``, for everything on a real device).
"""

from __future__ import annotations

import collections
import numbers
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils._python_dispatch import TorchDispatchMode

from hvp_lightning.analysis.callback import HardViewAnalysis
from hvp_lightning.nn.sync_free import host_to_device
from hvp_lightning.run.epoch_metrics import EpochAggregates

from .conftest import build, make_cfg, tiered
from .test_device_guard import FAKE, METHOD_OVERRIDES, one_batch

aten = torch.ops.aten
PACKAGE = Path(__file__).resolve().parents[1] / "hvp_lightning"
SHAPE_FROM_VALUES = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.repeat_interleave.Tensor,
}

# The syncs a step keeps, each named, with why it stays:
# - choose(): one read (``bool(finite.any(1).all())``) per HVP step, so that a sample whose
#   candidate losses are all NaN/inf stops the run with a FloatingPointError naming the batch
#   positions, not after training on garbage. Deferring it (checking the previous step's flag)
#   would change when and how the error comes; kept.
CHOOSE = ("read", "selection/choice.py:choose")
EXPECTED = {
    "dino": {CHOOSE: 1},
    "dino_sampled": {CHOOSE: 1},
    "dino_random": {CHOOSE: 1},
    "ibot": {CHOOSE: 1},
    "simsiam": {CHOOSE: 1},
    "dino_off": {},
    "dino_cheaper": {CHOOSE: 1},  # the scored samples are drawn on the host, copied without a wait
    "ibot_cheaper": {CHOOSE: 1},
    "simsiam_min_iou": {},  # no loss table, nothing to check
    "dino_min_iou": {},
}
CHEAPER = ["+hvp=on", "hvp.num_views=3", "hvp.selection_scale=0.5", "hvp.selection_fraction=0.5"]
CASES = {
    "dino": ("dino", ["+hvp=on", "hvp.num_views=3", "hvp.max_combinations=null"]),
    "dino_sampled": ("dino", ["+hvp=on", "hvp.num_views=3", "hvp.max_combinations=2"]),
    "dino_random": ("dino", ["+hvp=on", "hvp.num_views=3", "hvp.max_combinations=null", "hvp.mode=random"]),
    "ibot": ("ibot", ["+hvp=on", "hvp.num_views=3"]),
    "simsiam": ("simsiam", ["+hvp=on", "hvp.num_views=3"]),
    "dino_off": ("dino", []),
    "dino_cheaper": ("dino", [*CHEAPER, "hvp.max_combinations=null"]),
    "ibot_cheaper": ("ibot", CHEAPER),
    "simsiam_min_iou": ("simsiam", ["+hvp=on", "hvp.num_views=3", "hvp.mode=min_iou"]),
    "dino_min_iou": ("dino", ["+hvp=on", "hvp.num_views=3", "hvp.mode=min_iou"]),
}


def site() -> str:
    """The innermost package function on the stack: ``folder/file.py:function``."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(PACKAGE) and path.name != "sync_free.py":
            return f"{path.relative_to(PACKAGE)}:{frame.name}"
    return "outside the package"


class SyncCounter(TorchDispatchMode):
    """Counts, by site, every op on the stand-in device that would make the host wait for a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.events: collections.Counter[tuple[str, str]] = collections.Counter()

    def note(self, kind: str) -> None:
        self.events[(kind, site())] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default and args[0].device == FAKE:
            self.note("read")  # .item(), bool(t), int(t), .tolist(): meta has no value to give
            return args[0].new_ones((), device="cpu").to(args[0].dtype).item()
        if func is aten._to_copy.default:
            src, dst = args[0].device, torch.device(kwargs.get("device") or args[0].device)
            if src == FAKE and dst != FAKE:
                self.note("copy to host")
            elif dst == FAKE and src != FAKE and not kwargs.get("non_blocking", False):
                self.note("blocking copy from host")
        if func is aten.copy_.default and args[0].device != args[1].device:
            self.note("copy to host" if args[1].device == FAKE else "blocking copy from host")
        if func in SHAPE_FROM_VALUES or (
            func is aten.index.Tensor
            and any(i is not None and i.dtype == torch.bool for i in args[1])
            and args[0].device == FAKE
        ):
            raise AssertionError(f"{func} at {site()}: an output shape read from the values (a sync on a GPU)")
        return func(*args, **kwargs)


@pytest.fixture
def counter(meta_autocast: None, monkeypatch: pytest.MonkeyPatch) -> SyncCounter:
    """The counter, with ``torch.tensor``/``torch.as_tensor`` of host data onto the stand-in
    device counted too (they copy below the dispatcher, where no mode sees them)."""
    counting = SyncCounter()
    for name in ("tensor", "as_tensor"):
        real = getattr(torch, name)

        def made(data: Any, *args: Any, _real: Any = real, **kwargs: Any) -> torch.Tensor:
            device = kwargs.get("device")
            if device is not None and torch.device(device) == FAKE and not isinstance(data, torch.Tensor):
                counting.note("blocking copy from host")
            return _real(data, *args, **kwargs)

        monkeypatch.setattr(torch, name, made)
    return counting


def logged_like_lightning(module: Any, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
    """``LightningModule.log`` without a Trainer: a Python number becomes
    ``torch.tensor(value, device=module.device)``, as Lightning's ``__to_tensor`` makes it
    (patched on the class, so that a method's own ``log`` runs on top of it)."""
    if isinstance(value, numbers.Number):
        torch.tensor(value, device=module.device, dtype=torch.get_default_dtype())


def one_step(model: Any, batch: dict[str, Any], trainer: SimpleNamespace) -> None:
    """What Lightning calls for one batch of automatic optimisation (the optimiser aside: torch's
    AdamW/SGD read no device value), plus the online analysis callback."""
    analysis = HardViewAnalysis(Path("unused"), None, True)
    analysis.on_train_batch_start(trainer, model, batch, 0)
    model.on_train_batch_start(batch, 0)
    loss = model.training_step(batch, 0)
    loss.backward()
    if hasattr(model, "clip_and_freeze_gradients"):
        model.clip_and_freeze_gradients()
    trainer.global_step += 1  # the optimiser stepped: the EMA teacher and centre move now
    model.on_train_batch_end(loss, batch, 0)
    analysis.on_train_batch_end(trainer, model, loss, batch, 0)


@pytest.mark.parametrize("case", tiered(CASES, {"dino", "dino_sampled", "simsiam", "ibot_cheaper"}, ids=list(CASES)))
def test_a_training_step_syncs_only_where_stated(
    case: str, counter: SyncCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every host sync of one step is listed in EXPECTED with its reason (module comments);
    a new one fails here with its site."""
    method, hvp = CASES[case]
    cfg = make_cfg(*METHOD_OVERRIDES[method], *hvp, "method.batch_size=4", "data.train_size=8", "data.crop_size=16")
    model = build(cfg).to(FAKE).train()
    batch = move_data_to_device(one_batch(cfg), FAKE)
    aggregates = EpochAggregates()  # a run's: the epoch values of the step's logs go through it
    trainer = SimpleNamespace(
        global_step=0,
        current_epoch=0,
        global_rank=0,
        world_size=1,
        accumulate_grad_batches=1,
        estimated_stepping_batches=10,
        training=True,
        callbacks=[aggregates],
    )
    aggregates.on_train_epoch_start(trainer, model)  # type: ignore[arg-type]
    model.trainer = trainer  # type: ignore[assignment]
    optimizer = SimpleNamespace(param_groups=[{"lr": 0.1, "weight_decay": 0.04, "wd_schedule": True}])
    monkeypatch.setattr(model, "optimizers", lambda: optimizer)
    monkeypatch.setattr(L.LightningModule, "log", logged_like_lightning)
    model.on_train_start()
    with counter:
        one_step(model, batch, trainer)
    assert dict(counter.events) == EXPECTED[case]
    assert "train/loss_epoch" in aggregates.running  # the epoch aggregates were kept on that path


def test_counter_sees_each_kind_of_sync(counter: SyncCounter) -> None:
    """The counter is no tautology: each kind of sync is seen, and the sync-free forms are not."""
    x = torch.zeros(3, device=FAKE)
    with counter:
        bool(x.sum() > 0)
        with pytest.raises(RuntimeError, match="meta"):
            x.cpu()  # counted, then meta has no data to copy out
        torch.zeros(3).to(FAKE)
        torch.tensor(0.5, device=FAKE)
        host_to_device(torch.zeros(3), FAKE)  # non-blocking: not a sync
        torch.full((), 0.5, device=FAKE)  # a fill kernel: not a sync
        x * torch.tensor(2.0)  # a CPU scalar operand: a kernel argument, not a copy
        with pytest.raises(AssertionError, match="shape read from the values"):
            x[x > 0]
    here = "outside the package"
    assert dict(counter.events) == {("read", here): 1, ("copy to host", here): 1, ("blocking copy from host", here): 2}
