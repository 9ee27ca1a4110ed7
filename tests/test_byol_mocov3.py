"""BYOL and MoCo v3: each loss against a loop written from the paper's pseudo-code (per sample
and as the batch mean), the candidate tables against pair-by-pair losses and the hard/easy
choice against brute force, MoCo v3's keys from every rank, one baseline step against a
hand-written official step (loss, SGD update, momentum target), the selection pass leaving
every parameter, buffer and the RNG untouched, and a tiny ``+hvp=on`` run of each."""

from __future__ import annotations

import copy
import math
from itertools import combinations
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hvp_lightning.methods import METHODS  # noqa: I001  (before losses.mocov3 until losses/simclr.py exists)
from hvp_lightning.losses.byol import byol_loss, byol_pair_table
from hvp_lightning.losses.mocov3 import mocov3_loss, mocov3_pair_table
from hvp_lightning.selection import choose, pair_index

from .conftest import make_cfg, score_and_assert_stateless

# Tiny networks for the module tests: ResNet-18 CIFAR stem at width 8, 16 px crops, small heads.
SMALL = ["backbone.width=8", "data.crop_size=16", "method.proj_hidden_dim=32", "method.proj_dim=16",
         "method.pred_hidden_dim=32"]


# --- the losses against the papers' pseudo-code ---------------------------------------------------


def byol_reference(p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor) -> list[float]:
    """BYOL eq. 2, per sample, in float64 loops: ``||p/|p| - z'/|z'| ||^2`` for (p1, z2') plus
    the symmetric term (p2, z1') (the paper's L + L~)."""
    out = []
    for b in range(p1.shape[0]):
        total = 0.0
        for p, z in ((p1[b], z2[b]), (p2[b], z1[b])):
            pn = [float(x) / math.sqrt(sum(float(y) ** 2 for y in p)) for x in p]
            zn = [float(x) / math.sqrt(sum(float(y) ** 2 for y in z)) for x in z]
            total += sum((a - c) ** 2 for a, c in zip(pn, zn))
        out.append(total)
    return out


def mocov3_reference(q1: torch.Tensor, q2: torch.Tensor, k1: torch.Tensor, k2: torch.Tensor,
                     tau: float) -> list[float]:
    """MoCo v3 Algorithm 1 (``ctr(q1, k2) + ctr(q2, k1)``, ``ctr = 2 tau CE(q k^T / tau, own)``)
    per sample, in float64 loops over the keys."""
    def unit(v: torch.Tensor) -> list[float]:
        norm = math.sqrt(sum(float(x) ** 2 for x in v))
        return [float(x) / norm for x in v]

    out = []
    for b in range(q1.shape[0]):
        total = 0.0
        for q, keys in ((q1[b], k2), (q2[b], k1)):
            qn = unit(q)
            logits = [sum(a * c for a, c in zip(qn, unit(k))) / tau for k in keys]
            total += 2 * tau * -(logits[b] - math.log(sum(math.exp(x) for x in logits)))
        out.append(total)
    return out


def _views(n: int, b: int = 5, d: int = 8, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, d, generator=g) for _ in range(n)]


def test_byol_loss_matches_the_papers_formula_per_sample_and_mean() -> None:
    p1, p2, z1, z2 = _views(4)
    per_sample = byol_loss(p1, p2, z1, z2)
    want = torch.tensor(byol_reference(p1, p2, z1, z2))
    torch.testing.assert_close(per_sample, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(per_sample.mean(), want.mean(), rtol=1e-5, atol=1e-5)


def test_byol_loss_matches_lightly() -> None:
    """lightly's BYOL recipe: ``0.5 (NegCos(p1, z2) + NegCos(p2, z1))`` = (loss - 4) / 4."""
    lightly_loss = pytest.importorskip("lightly.loss")
    p1, p2, z1, z2 = _views(4, seed=1)
    crit = lightly_loss.NegativeCosineSimilarity()
    torch.testing.assert_close(byol_loss(p1, p2, z1, z2).mean(), 4 + 4 * 0.5 * (crit(p1, z2) + crit(p2, z1)))


@pytest.mark.parametrize("tau", [0.2, 1.0])
def test_mocov3_loss_matches_the_papers_algorithm_per_sample_and_mean(tau: float) -> None:
    q1, q2, k1, k2 = _views(4, seed=2)
    per_sample = mocov3_loss(q1, q2, k1, k2, tau)
    want = torch.tensor(mocov3_reference(q1, q2, k1, k2, tau))
    torch.testing.assert_close(per_sample, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(per_sample.mean(), want.mean(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mocov3_loss(q1, q2, k1, k2, tau, gather=True), per_sample)  # no process group


def test_mocov3_keys_get_no_gradient() -> None:
    q1, q2, k1, k2 = (v.requires_grad_(True) for v in _views(4, seed=3))
    mocov3_loss(q1, q2, k1, k2, 0.2).sum().backward()
    assert q1.grad is not None and k1.grad is None and k2.grad is None


# --- candidate tables and the choice --------------------------------------------------------------


def _table_and_pair_loss(method: str, n: int = 4, b: int = 5, seed: int = 4):
    p, z = torch.stack(_views(n, b, seed=seed)), torch.stack(_views(n, b, seed=seed + 100))
    if method == "byol":
        return byol_pair_table(p, z), lambda k, l: byol_loss(p[k], p[l], z[k], z[l])
    return mocov3_pair_table(p, z, 0.2), lambda k, l: mocov3_loss(p[k], p[l], z[k], z[l], 0.2)


@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_pair_table_equals_pairwise_loss(method: str) -> None:
    table, pair_loss = _table_and_pair_loss(method)
    assert table.shape == (5, 6)
    for c, (k, l) in enumerate(pair_index(4).tolist()):
        torch.testing.assert_close(table[:, c], pair_loss(k, l))


@pytest.mark.parametrize("method", ["byol", "mocov3"])
@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_selection_equals_brute_force(method: str, mode: str) -> None:
    table, pair_loss = _table_and_pair_loss(method, seed=5)
    choice = choose(table, mode)
    pairs = list(combinations(range(4), 2))
    for b in range(5):
        losses = [float(pair_loss(k, l)[b]) for k, l in pairs]
        best = max(losses) if mode == "hard" else min(losses)
        assert pairs[int(choice[b])] == pairs[losses.index(best)]


def test_mocov3_table_with_gathered_keys_equals_global_rows() -> None:
    """The DDP form: a rank's rows scored against all ranks' keys (local ones at the offset)
    are the rows of the global batch's table."""
    q, k = torch.stack(_views(3, 6, seed=6)), torch.stack(_views(3, 6, seed=7))
    full = mocov3_pair_table(q, k, 0.2)
    for rank in range(2):
        rows = slice(3 * rank, 3 * (rank + 1))
        torch.testing.assert_close(mocov3_pair_table(q[:, rows], k, 0.2, offset=3 * rank), full[rows])


def test_mocov3_gathered_loss_matches_global_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2 (collectives faked): its queries meet rank 0's keys too, positives at the offset."""
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_fn

    q1, q2, k1, k2 = _views(4, 6, seed=8)
    other = [F.normalize(k1[:3], dim=1), F.normalize(k2[:3], dim=1)]  # rank 0's normalised keys
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist_fn, "all_gather", lambda x, group=None: (other.pop(0), x))
    local = mocov3_loss(q1[3:], q2[3:], k1[3:], k2[3:], 0.2, gather=True)
    monkeypatch.undo()
    torch.testing.assert_close(local, mocov3_loss(q1, q2, k1, k2, 0.2)[3:])


# --- the LightningModules ---------------------------------------------------------------------------


def _model(method: str, *extra: str) -> tuple[nn.Module, dict]:
    cfg = make_cfg(f"method={method}_cifar", *SMALL, *extra)
    torch.manual_seed(0)
    model = METHODS[method](cfg)
    g = torch.Generator().manual_seed(1)
    n = cfg.hvp.num_views if cfg.get("hvp") else 2
    views = [torch.randn(8, 3, 16, 16, generator=g) for _ in range(n)]
    return model, {"views": views, "label": torch.zeros(8, dtype=torch.long), "index": torch.arange(8)}


@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_target_starts_as_a_frozen_copy_and_is_not_optimised(method: str) -> None:
    model, _ = _model(method)
    online = {**{f"backbone.{k}": v for k, v in model.backbone.state_dict().items()},
              **{f"projector.{k}": v for k, v in model.projector.state_dict().items()}}
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
    table = score_and_assert_stateless(model, batch)  # target weights and BN buffers included
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
    model, batch = _model(method, "method.optimizer.name=sgd", "method.optimizer.warmup_epochs=0",
                          "method.optimizer.weight_decay=0.0", "method.optimizer.momentum=0.0",
                          "method.optimizer.base_lr=0.5")
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
    lr = 0.5 * model.cfg.method.batch_size / 256  # the linear rule uses the configured batch
    with torch.no_grad():
        for p in online.parameters():
            p -= lr * p.grad
        base, total = model.cfg.method.base_momentum, 4
        m = (1 - (1 - base) * (math.cos(0) + 1) / 2 if method == "byol"
             else 1 - 0.5 * (1 + math.cos(math.pi * 1 / total)) * (1 - base))
        for t, o in zip(target.parameters(), [*online.backbone.parameters(), *online.projector.parameters()]):
            t.mul_(m).add_(o, alpha=1 - m)
    # --- the LightningModule's step
    trainer = L.Trainer(max_steps=total, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        limit_val_batches=0, callbacks=[_StopAfterFirstStep()])
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


@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_tiny_train_with_hvp(method: str, tmp_path: Path) -> None:
    """``+hvp=on`` on the built-in data for one epoch; the hard choice's loss is at least the
    candidates' mean; the target moved and is in the checkpoint."""
    from hvp_lightning.train import run

    summary = run(make_cfg(f"method={method}_cifar", "+hvp=on", "data.image_size=16", "method.pred_hidden_dim=32"),
                  tmp_path)
    assert summary["method"] == method and summary["hvp_enabled"] is True and summary["steps"] == 4
    assert summary["train_loss"] is not None and math.isfinite(summary["train_loss"])
    assert summary["hvp"]["selected_samples"] == 64
    assert summary["hvp"]["selection_selected_loss_mean"] >= summary["hvp"]["selection_candidate_loss_mean"]
    assert summary["knn_top1"] is not None
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    w, t = state["projector.0.weight"], state["target.projector.0.weight"]
    assert w.shape == t.shape and not torch.equal(w, t)


@pytest.mark.parametrize("preset,proj,pred,last_bn", [
    ("byol", [4096, 256], [4096, 256], False), ("byol_cifar", [2048, 256], [2048, 256], False),
    ("mocov3", [4096, 256], [4096, 256], True), ("mocov3_cifar", [2048, 256], [2048, 256], True),
    ("mocov3_vit", [4096, 4096, 256], [4096, 256], True),
])
def test_presets_build(preset: str, proj: list[int], pred: list[int], last_bn: bool) -> None:
    """Every preset composes, validates and builds its paper's heads (MoCo v3: the projector
    ends in BN without affine parameters, and so does the ViT predictor)."""
    from hvp_lightning.config import validate

    vit = ["backbone=vit_tiny", "backbone.patch_size=4", "backbone.img_size=16", "+backbone.depth=1",
           "data.crop_size=16"] if preset.endswith("vit") else ["backbone=resnet18_narrow", "backbone.width=4"]
    cfg = make_cfg(f"method={preset}", "logger=csv", "data.num_workers=0", *vit, tiny=False)
    validate(cfg)
    model = METHODS[cfg.method.name](cfg)
    assert [m.out_features for m in model.projector if isinstance(m, nn.Linear)] == proj
    assert [m.out_features for m in model.predictor if isinstance(m, nn.Linear)] == pred
    for head, bn in ((model.projector, last_bn), (model.predictor, preset.endswith("vit"))):
        assert isinstance(head[-1], nn.BatchNorm1d if bn else nn.Linear)
        assert not bn or not head[-1].affine


@pytest.mark.parametrize("override,key", [
    ("method=byol_cifar method.base_momentum=1.5", "method.base_momentum=1.5"),
    ("method=mocov3_cifar method.temperature=0", "method.temperature=0"),
    ("method=mocov3_cifar method.proj_last_bn=maybe", "method.proj_last_bn='maybe'"),
])
def test_config_errors_name_key_value_and_allowed(override: str, key: str) -> None:
    from hvp_lightning.config import ConfigError, validate

    with pytest.raises(ConfigError) as err:
        validate(make_cfg(*override.split()))
    assert str(err.value).startswith(key) and "allowed" in str(err.value)
