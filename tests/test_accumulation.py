"""Gradient accumulation and mixed precision.

Accumulation: k micro-batches of B through a real Lightning Trainer against one batch of kB
(DINO, BatchNorm-free ViT: same weights, teacher, centre and loss), against a "ghost batch"
step for the BatchNorm methods (SimSiam/SimCLR normalise, and SimCLR draws negatives, within
each micro-batch, so kB is not the reference there), and every schedule counted in
optimiser steps. Precision: bf16-mixed train.py runs on CPU, fp16 + GradScaler with DINO's
clipping, fp32 selection and loss math under autocast, 16-mixed refused on CPU at start-up.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from hvp_lightning.config import ConfigError, validate
from hvp_lightning.losses import nt_xent_loss
from hvp_lightning.methods import METHODS, SSLMethod
from hvp_lightning.nn import teacher as teacher_module
from hvp_lightning.nn.optim import warmup_cosine
from hvp_lightning.nn.teacher import cosine_momentum, teacher_temperature
from hvp_lightning.training.driver import run

from .conftest import augs_of, build, counts_of, make_cfg, tiered

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*(does not have many workers|smaller than the logging interval|but have no `val_dataloader`).*"
)

# DINO on a one-block ViT at 16/8 px, SGD (linear in the gradient, so float noise stays noise:
# Adam's first step is ~sign(g)), a large lr and an active per-parameter clip so that every
# piece -- lr, weight decay, clipping, EMA (momentum 0.5), centre -- moves the weights visibly.
DINO_TINY = [
    "method=dino_cifar",
    "backbone=vit_tiny",
    "backbone.patch_size=8",
    "backbone.img_size=16",
    "backbone.depth=1",
    "backbone.drop_path_rate=0.0",
    "data.crop_size=16",
    "method.local_crop_size=8",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
    "method.optimizer.name=sgd",
    "method.optimizer.base_lr=64",
    "method.optimizer.warmup_epochs=0",
    "method.momentum_teacher=0.5",
    "method.freeze_last_layer=0",
    "method.clip_grad=0.05",
    "logger=csv",
]


class FixedViews(Dataset):
    """Fixed random views (one tensor per view position, sized as the method's augs) and, for
    iBOT, fixed masks per global view: the same data in the same order for every run."""

    def __init__(self, cfg: DictConfig, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.views = [torch.randn(n, 3, a.size, a.size, generator=g) for a in augs_of(cfg)]
        self.masks: list[torch.Tensor] = []
        if cfg.method.name == "ibot":
            side = cfg.data.crop_size // cfg.backbone.patch_size
            self.masks = [torch.rand(n, side, side, generator=g) < 0.5 for _ in range(counts_of(cfg)[0])]

    def __len__(self) -> int:
        return self.views[0].shape[0]

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = {"views": [v[i] for v in self.views], "label": 0, "index": i}
        return dict(item, masks=[m[i] for m in self.masks]) if self.masks else item


def fit(
    model: SSLMethod, data: Dataset, batch: int, k: int, epochs: int = 1, callbacks: tuple = (), **trainer_kw: Any
) -> L.Trainer:
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        accumulate_grad_batches=k,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=list(callbacks),
        **trainer_kw,
    )
    trainer.fit(model, train_dataloaders=DataLoader(data, batch_size=batch, shuffle=False))
    return trainer


def twin_models(overrides: list[str], batch: int, k: int) -> tuple[SSLMethod, SSLMethod]:
    """(accumulating model at batch ``batch``, reference at ``k * batch``), identical weights."""
    torch.manual_seed(0)
    acc = build(make_cfg(*overrides, f"method.batch_size={batch}", tiny=False))
    ref = build(make_cfg(*overrides, f"method.batch_size={k * batch}", tiny=False))
    ref.load_state_dict(acc.state_dict())
    return acc, ref


def record_losses(model: SSLMethod) -> list[float]:
    """The loss of every ``ssl_step`` call (what ``train/loss`` logs)."""
    losses: list[float] = []
    step = model.ssl_step

    def recording(batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = step(batch, batch_idx)
        losses.append(float(loss.detach()))
        return loss

    model.ssl_step = recording  # type: ignore[method-assign]
    return losses


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module, start: dict[str, torch.Tensor]) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    for key, value in sa.items():
        torch.testing.assert_close(value, sb[key], rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")
    moved = max((sa[k].float() - start[k].float()).abs().max().item() for k in sa if sa[k].is_floating_point())
    assert moved > 1e-2  # the comparison is not between two untrained models


# --- (b, c) DINO/iBOT: k x B == one batch of kB, through Lightning --------------------------------


@pytest.mark.parametrize(
    ("method", "hvp"),
    tiered(
        [("dino", False), ("dino", True), ("ibot", True)], {"dino-True"}, ids=["dino-False", "dino-True", "ibot-True"]
    ),
)
def test_dino_accumulation_equals_large_batch(method: str, hvp: bool) -> None:
    """2 optimiser steps of 2 x 4 images vs 2 of 8: student, EMA teacher and centre(s) agree,
    so clipping saw the accumulated gradient and EMA, centres, lr and weight decay moved once
    per step. With HVP the hard choice of micro-batch 2 saw the same centre as micro-batch 1.
    (iBOT gets fixed masks from the data: its own are seeded per micro-batch.)"""
    overrides = [f"method={method}_cifar", *DINO_TINY[1:]] + (["+hvp=on"] if hvp else [])
    acc, ref = twin_models(overrides, batch=4, k=2)
    start = {k: v.clone() for k, v in acc.state_dict().items()}
    data = FixedViews(make_cfg(*overrides, tiny=False), 16)
    acc_losses, ref_losses = record_losses(acc), record_losses(ref)
    t_acc, t_ref = fit(acc, data, batch=4, k=2), fit(ref, data, batch=8, k=1)
    assert t_acc.global_step == t_ref.global_step == 2
    assert_same_state(acc, ref, start)
    assert not torch.equal(acc.teacher.head.mlp[0].weight, start["teacher.head.mlp.0.weight"])
    centres = [k for k in start if k.endswith("centering.center")]  # iBOT: the patch centre too
    assert len(centres) == (2 if method == "ibot" else 1)
    assert all(not torch.equal(acc.state_dict()[k], start[k]) for k in centres)
    # The logged loss: per step the mean of its micro-batches is the big batch's loss; the epoch mean agrees.
    window_means = [sum(acc_losses[i : i + 2]) / 2 for i in (0, 2)]
    assert window_means == pytest.approx(ref_losses, rel=1e-5)
    torch.testing.assert_close(t_acc.callback_metrics["train/loss_epoch"], t_ref.callback_metrics["train/loss_epoch"])
    if hvp:  # the selection ran on every micro-batch
        assert int(acc.hvp_totals[2]) == int(ref.hvp_totals[2]) == 16


# --- (a) BatchNorm methods: k x B == one "ghost batch" step ---------------------------------------


def _half(batch: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    sl = slice(i * n, (i + 1) * n)
    return dict(batch, views=[v[sl] for v in batch["views"]], label=batch["label"][sl], index=batch["index"][sl])


@pytest.mark.parametrize("name", tiered(["simsiam", "simclr"], 1))
def test_batchnorm_methods_accumulate_like_ghost_batches(name: str) -> None:
    """SimSiam/SimCLR have BatchNorm in their heads (always: ``heads.mlp``), so no BN-free kB
    reference exists: BN statistics (and SimCLR's negatives) are per micro-batch. The exact
    reference is one optimiser step on 2B whose loss is the mean of the method's loss on its
    two halves. Accumulation must equal it -- weights, BN running statistics and the lr, which
    scales with B x k."""
    overrides = [
        f"method={name}_cifar",
        "backbone=resnet18_narrow",
        "backbone.width=4",
        "data.crop_size=16",
        "method.proj_hidden_dim=32",
        "method.proj_dim=16",
        "method.optimizer.name=sgd",
        "method.optimizer.base_lr=8",
        "method.optimizer.warmup_epochs=0",
        "+hvp=on",
        "hvp.num_views=3",
        "logger=csv",
    ]
    if name == "simsiam":
        overrides.append("method.pred_hidden_dim=8")
    cls = METHODS[name]

    def ghost_step(self: SSLMethod, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        n = batch["label"].shape[0] // 2
        return sum(cls.training_step(self, _half(batch, i, n), batch_idx) for i in range(2)) / 2

    acc, _ = twin_models(overrides, batch=4, k=2)
    ghost = build(make_cfg(*overrides, "method.batch_size=8", tiny=False))
    ghost.__class__ = type("Ghost", (cls,), {"training_step": ghost_step})  # the same module, its step in halves
    ghost.load_state_dict(acc.state_dict())
    start = {k: v.clone() for k, v in acc.state_dict().items()}
    data = FixedViews(make_cfg(*overrides, tiny=False), 16)
    fit(acc, data, batch=4, k=2)
    fit(ghost, data, batch=8, k=1)
    assert_same_state(acc, ghost, start)


# --- (d) schedules count optimiser steps ------------------------------------------------------------


class StepRecorder(L.Callback):
    """Per micro-batch: global_step and whether HVP selects; per optimiser step: lr, weight decay
    and teacher temperature as the optimiser is about to use them."""

    def __init__(self) -> None:
        self.micro: list[tuple[int, bool]] = []
        self.steps: list[tuple[int, float, float, float]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.micro.append((trainer.global_step, pl_module.hvp_active()))

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        reg = optimizer.param_groups[0]
        self.steps.append((trainer.global_step, reg["lr"], reg["weight_decay"], pl_module.teacher_temp()))


def test_schedules_advance_per_optimizer_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 micro-batches (2 epochs of 8) with k=2 are 8 optimiser steps: lr (1 warm-up epoch,
    then cosine), weight decay (cosine), EMA momentum, teacher temperature (per epoch) and
    the HVP alternation (every 2nd step) follow the step count, not the micro-batch count."""
    momenta: list[tuple[int, int]] = []

    def recording_momentum(step: int, total: int, base: float = 0.996, final: float = 1.0) -> float:
        momenta.append((step, total))
        return cosine_momentum(step, total, base, final)

    monkeypatch.setattr(teacher_module, "cosine_momentum", recording_momentum)
    cfg = make_cfg(
        *DINO_TINY,
        "method.batch_size=2",
        "method.optimizer.warmup_epochs=1",
        "method.optimizer.base_lr=0.5",
        "method.optimizer.min_lr=0.001",
        "method.warmup_teacher_temp_epochs=2",
        "method.warmup_teacher_temp=0.02",
        "+hvp=on",
        "hvp.every_n_steps=2",
        "method.momentum_teacher=0.9",
        tiny=False,
    )
    torch.manual_seed(0)
    model = build(cfg)
    recorder = StepRecorder()
    trainer = fit(model, FixedViews(cfg, 16), batch=2, k=2, epochs=2, callbacks=(recorder,))
    total, opt = 8, cfg.method.optimizer
    assert trainer.global_step == trainer.estimated_stepping_batches == total
    assert [s for s, _ in recorder.micro] == [i // 2 for i in range(16)]
    assert [a for _, a in recorder.micro] == [(i // 2) % 2 == 0 for i in range(16)]  # both micro-batches alike
    base_lr = opt.base_lr * 2 * 2 / 256  # per-device batch x accumulation
    m = cfg.method
    expected = [
        (
            i,
            base_lr * warmup_cosine(i, total, 4, opt.min_lr / base_lr),
            opt.weight_decay * warmup_cosine(i, total, 0, opt.weight_decay_end / opt.weight_decay),
            teacher_temperature(i // 4, m.teacher_temp, m.warmup_teacher_temp, m.warmup_teacher_temp_epochs),
        )
        for i in range(total)
    ]
    assert [s[0] for s in recorder.steps] == [e[0] for e in expected]
    for got, want in zip(recorder.steps, expected):
        assert got[1:] == pytest.approx(want[1:])
    assert momenta == [(i, total) for i in range(total)]  # one EMA update per optimiser step


def test_micro_batches_of_one_step_draw_different_random_choices() -> None:
    model = build(make_cfg(*DINO_TINY, "+hvp=on", "hvp.mode=random", tiny=False))
    draws = []
    for batch_idx in (0, 1):  # same global_step, two micro-batches
        model.hvp_batch_idx = batch_idx
        draws.append(
            (
                torch.rand(8, generator=model._choice_generator(batch_idx)),
                torch.rand(8, generator=model._locals_generator()),
            )
        )
    assert not torch.equal(draws[0][0], draws[1][0]) and not torch.equal(draws[0][1], draws[1][1])


# --- precision ---------------------------------------------------------------------------------------


@pytest.mark.slow  # a run each
@pytest.mark.parametrize("method", ["simsiam", "dino"])
def test_bf16_mixed_train_run_on_cpu(method: str, tmp_path: Path) -> None:
    """train.py's run() with trainer.precision=bf16-mixed, +hvp=on and accumulation: finite loss."""
    if method == "simsiam":
        cfg = make_cfg(
            "+hvp=on",
            "hvp.num_views=3",
            "backbone.width=4",
            "trainer.precision=bf16-mixed",
            "trainer.accumulate_grad_batches=2",
        )
    else:
        cfg = make_cfg(
            *DINO_TINY,
            "method.optimizer.name=adamw",
            "method.optimizer.base_lr=0.0005",
            "+hvp=on",
            "trainer.precision=bf16-mixed",
            "trainer.accumulate_grad_batches=2",
            "method.batch_size=8",
            "data.train_size=32",
            "data.test_size=16",
            "data.num_workers=0",
            "trainer.max_epochs=1",
            "eval.at_start=false",
            "+trainer.enable_progress_bar=false",
            "+trainer.enable_model_summary=false",
            tiny=False,
        )
    summary = run(cfg, tmp_path)
    assert summary["train_loss"] is not None and math.isfinite(summary["train_loss"])
    images = summary["images_seen"]
    assert summary["steps"] == images // (2 * cfg.method.batch_size) and summary["hvp"]["selected_samples"] == images
    assert summary["knn_top1"] is not None


def test_fp16_grad_scaler_clips_unscaled_gradients() -> None:
    """16-mixed with a GradScaler (forced onto CPU through the plugin; train.py refuses it
    there): DINO's per-parameter clipping runs after ``unscale_``, so one accumulated step
    moves the weights as the fp32 step does (scaled gradients would have been clipped to the
    same norm and then divided by the scale: a 256x smaller step)."""
    fp16, fp32 = twin_models(DINO_TINY, batch=4, k=1)
    start = {k: v.clone() for k, v in fp16.state_dict().items()}
    data = FixedViews(make_cfg(*DINO_TINY, tiny=False), 8)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    t16 = fit(fp16, data, batch=4, k=2, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    fit(fp32, data, batch=4, k=2)
    assert t16.global_step == 1 and scaler.get_scale() == 256.0  # the step was taken, not skipped
    for name, p16 in fp16.named_parameters():
        if not p16.requires_grad:
            continue
        d16, d32 = p16.detach() - start[name], dict(fp32.named_parameters())[name].detach() - start[name]
        assert (d16 - d32).norm() <= 0.05 * d32.norm() + 1e-6, name


def test_fp32_selection_and_losses_under_autocast() -> None:
    """hvp.selection_precision=fp32 means fp32 inside a bf16-mixed training step too, and the
    losses the methods optimise come out in fp32."""
    cfg = make_cfg(*DINO_TINY, "+hvp=on", tiny=False)
    model = build(cfg).train()
    batch = next(iter(DataLoader(FixedViews(cfg, 3), batch_size=3)))
    ref = model.score_candidates(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(model.score_candidates(batch).table, ref.table)
        assert model.ssl_step(model.select_views(batch, ref.table.argmax(1), ref.context), 0).dtype == torch.float32
    simsiam = build(make_cfg("backbone.width=4")).train()
    views = [torch.randn(4, 3, 16, 16) for _ in range(2)]
    z1, z2 = torch.randn(2, 6, 8).unbind()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert simsiam.ssl_step({"views": views}, 0).dtype == torch.float32
        amp_ntxent = nt_xent_loss(z1, z2, 0.5)
    assert torch.equal(amp_ntxent, nt_xent_loss(z1, z2, 0.5))


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-true", "64-true"])
def test_trainer_precision_is_validated(precision: str) -> None:
    """Lightning would silently turn 16-mixed into bf16-mixed on CPU; half-true precisions
    would keep the EMA teacher and centres in half precision."""
    with pytest.raises(ConfigError) as err:
        validate(make_cfg(f"trainer.precision={precision}", "trainer.accelerator=cpu"))
    assert str(err.value).startswith(f"trainer.precision='{precision}'") and "allowed" in str(err.value)
    validate(make_cfg("trainer.precision=bf16-mixed"))
    validate(make_cfg("trainer.precision=16-mixed", "trainer.accelerator=gpu"))
