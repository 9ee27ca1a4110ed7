"""BYOL and MoCo v3's shared online/target module (methods/momentum.py): the target starts as a
frozen copy and is not optimised, the selection pass leaves every parameter, buffer (target
included) and the RNG untouched, one baseline step equals a hand-written official step (loss,
SGD update, momentum target). The tiny ``+hvp=on`` runs are in test_tiny_runs.py."""

from __future__ import annotations

import copy
import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ..conftest import build, make_cfg, score_and_assert_stateless

# Tiny networks: ResNet-18 CIFAR stem at width 8, 16 px crops, small heads.
SMALL = [
    "backbone.width=8",
    "data.crop_size=16",
    "method.proj_hidden_dim=32",
    "method.proj_dim=16",
    "method.pred_hidden_dim=32",
]


def _model(method: str, *extra: str) -> tuple[nn.Module, dict]:
    cfg = make_cfg(f"method={method}_cifar", *SMALL, *extra)
    torch.manual_seed(0)
    model = build(cfg)
    g = torch.Generator().manual_seed(1)
    n = cfg.hvp.num_views if cfg.get("hvp") else 2
    views = [torch.randn(8, 3, 16, 16, generator=g) for _ in range(n)]
    return model, {"views": views, "label": torch.zeros(8, dtype=torch.long), "index": torch.arange(8)}


@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_target_starts_as_a_frozen_copy_and_is_not_optimised(method: str) -> None:
    model, _ = _model(method)
    online = {
        **{f"backbone.{k}": v for k, v in model.backbone.state_dict().items()},
        **{f"projector.{k}": v for k, v in model.projector.state_dict().items()},
    }
    target = model.target.state_dict()
    assert online.keys() == target.keys()
    assert all(torch.equal(online[k], target[k]) for k in online)
    assert not any(p.requires_grad for p in model.target.parameters())
    optimised = {id(p) for g in model.param_groups() for p in g["params"]}
    assert optimised == {id(p) for n, p in model.named_parameters() if not n.startswith("target.")}


@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_selection_leaves_parameters_buffers_target_and_rng_untouched(method: str) -> None:
    model, batch = _model(method, "+hvp=on")
    model.train()
    table = score_and_assert_stateless(model, batch).table  # target weights and BN buffers included
    assert table.shape == (8, 6) and not table.requires_grad
    # The table is the method's per-sample loss of each pair: the first column is pair (0, 1).
    with torch.no_grad():
        snapshot = {k: v.clone() for k, v in model.state_dict().items()}
        p = [model.online(v) for v in batch["views"][:2]]
        z = [model.target_out(v) for v in batch["views"][:2]]
        model.load_state_dict(snapshot)  # the BN buffers this forward moved
    torch.testing.assert_close(table[:, 0], model.pair_loss(p[0], p[1], z[0], z[1]))


class _OneBatch(torch.utils.data.Dataset):
    def __init__(self, batch: dict, steps: int) -> None:
        self.batch, self.steps = batch, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> dict:
        return self.batch


class _StopAfterFirstStep(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        trainer.should_stop = True


@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_baseline_step_equals_hand_written_official_step(method: str) -> None:
    """HVP off, one Lightning step (SGD, no warm-up, 4 steps planned so the momentum schedule is
    not at its end) against the official step written by hand from copies of the initial
    networks: the loss, the online weights after SGD, and the target moved by the official
    rule -- BYOL: ``tau_k = 1 - (1 - tau_base)(cos(pi k / K) + 1) / 2`` at k = 0 after the
    update; MoCo v3: ``m = 1 - 0.5 (1 + cos(pi t / T)) (1 - m_base)`` of the next step (t = 1/K
    of training), applied before that step's keys."""
    model, batch = _model(
        method,
        "method.optimizer.name=sgd",
        "method.optimizer.warmup_epochs=0",
        "method.optimizer.weight_decay=0.0",
        "method.optimizer.momentum=0.0",
        "method.optimizer.base_lr=0.5",
    )
    online = nn.ModuleDict({k: copy.deepcopy(getattr(model, k)) for k in ("backbone", "projector", "predictor")})
    target = nn.ModuleDict({k: copy.deepcopy(getattr(model, k)) for k in ("backbone", "projector")})
    x1, x2 = batch["views"]
    # --- the official step, by hand
    p1, p2 = (online.predictor(online.projector(online.backbone(x))) for x in (x1, x2))
    with torch.no_grad():
        z1, z2 = (target.projector(target.backbone(x)) for x in (x1, x2))
    if method == "byol":
        loss = (2 - 2 * F.cosine_similarity(p1, z2)).mean() + (2 - 2 * F.cosine_similarity(p2, z1)).mean()
    else:

        def ctr(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            logits = F.normalize(q, dim=1) @ F.normalize(k, dim=1).T / 0.2
            return F.cross_entropy(logits, torch.arange(q.shape[0])) * 2 * 0.2

        loss = ctr(p1, z2) + ctr(p2, z1)
    loss.backward()
    lr = 0.5 * model.settings.batch_size / 256  # the linear rule uses the configured batch
    with torch.no_grad():
        for p in online.parameters():
            p -= lr * p.grad
        base, total = model.settings.base_momentum, 4
        m = (
            1 - (1 - base) * (math.cos(0) + 1) / 2
            if method == "byol"
            else 1 - 0.5 * (1 + math.cos(math.pi * 1 / total)) * (1 - base)
        )
        for t, o in zip(target.parameters(), [*online.backbone.parameters(), *online.projector.parameters()]):
            t.mul_(m).add_(o, alpha=1 - m)
    # --- the LightningModule's step
    trainer = L.Trainer(
        max_steps=total,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[_StopAfterFirstStep()],
    )
    loader = torch.utils.data.DataLoader(_OneBatch(batch, total), batch_size=None)
    trainer.fit(model, train_dataloaders=loader)
    assert trainer.global_step == 1 and trainer.estimated_stepping_batches == total
    torch.testing.assert_close(trainer.callback_metrics["train/loss_step"], loss.detach())
    for name in ("backbone", "projector", "predictor"):
        for (n, got), want in zip(getattr(model, name).named_parameters(), online[name].parameters()):
            torch.testing.assert_close(got, want, msg=f"{name}.{n}")
    for name in ("backbone", "projector"):
        for (n, got), want in zip(model.target[name].named_parameters(), target[name].parameters()):
            torch.testing.assert_close(got, want, msg=f"target.{name}.{n}")
        assert not torch.equal(next(model.target[name].parameters()), next(getattr(model, name).parameters()))


def build_preset(preset: str) -> nn.Module:
    """A method preset composed, validated and built with a tiny backbone (the heads are the
    preset's own): for the per-method preset tests."""
    from hvp_lightning.config import validate

    vit = (
        ["backbone=vit_tiny", "backbone.patch_size=4", "backbone.img_size=16", "backbone.depth=1", "data.crop_size=16"]
        if preset.endswith("vit")
        else ["backbone=resnet18_narrow", "backbone.width=4"]
    )
    cfg = make_cfg(f"method={preset}", "logger=csv", "data.num_workers=0", "data.train_size=4096", *vit, tiny=False)
    validate(cfg)
    with torch.device("meta"):  # the paper's 4096-wide heads: shapes, not values
        return build(cfg)


def out_features(head: nn.Module) -> list[int]:
    return [m.out_features for m in head if isinstance(m, nn.Linear)]
