"""DDP correctness: a 2-process (gloo) step equals one process with the global batch (DINO's
all-reduced centre, SimSiam's synchronised BatchNorm, HVP's per-sample choice), SyncBatchNorm
conversion, learning-rate scaling with the global batch, DDP config checks, and train.py
end to end with ``trainer=ddp`` on 2 CPU processes for every method."""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel

from hvp_lightning.cluster.distributed import CpuSyncBatchNorm, SyncBatchNormPlugin, sync_batchnorm_plugins
from hvp_lightning.config import ConfigError, validate
from hvp_lightning.nn.teacher import Centering
from hvp_lightning.training.counters import RunCounters

from ._ddp import run_ranks
from .conftest import REPO, augs_of, build, images_run, make_cfg, score_and_assert_stateless, write_images

pytestmark = (
    pytest.mark.serial
)  # its slow tests start processes of their own and time them: run one at a time (.ci/run)

WORLD = 2
VIT = [
    "backbone=vit_tiny",
    "backbone.patch_size=4",
    "backbone.img_size=16",
    "backbone.depth=1",
    "backbone.drop_path_rate=0.0",
    "data.crop_size=16",
    "method.local_crop_size=8",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
]
RESNET = ["backbone.width=8", "data.crop_size=16", "method.proj_hidden_dim=64", "method.proj_dim=32"]


# --- one step: 2 processes x B == 1 process x 2B ----------------------------------------------


class _Step(nn.Module):
    """What Lightning's DDP wrapper does: the forward of the wrapped module is the training step."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.model.training_step(batch, 0)


def _shard(batch: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    """This rank's rows, as the DistributedSampler hands a contiguous share of the batch."""
    b = batch["label"].shape[0] // world
    rows = slice(rank * b, (rank + 1) * b)
    return {"views": [v[rows] for v in batch["views"]], "label": batch["label"][rows], "index": batch["index"][rows]}


def _one_step(
    cfg: DictConfig, state: dict[str, torch.Tensor], batch: dict[str, Any], rank: int, world: int
) -> dict[str, Any]:
    """One training step (selection + loss + backward + DINO's centre step) of this rank's
    share; with world > 1 the model has synchronised BatchNorm (as train.py's plugin converts
    it) and DDP averages the gradients."""
    model = build(cfg).to(batch["views"][0].dtype)  # fp64 cases: see CASES
    model.load_state_dict(state)
    model.train()
    if world > 1:
        for plugin in sync_batchnorm_plugins("auto", model):
            model = plugin.apply(model)
    step = _Step(model)
    wrapped = DistributedDataParallel(step) if world > 1 else step
    shard = _shard(batch, rank, world)
    if any(isinstance(m, _BatchNorm) for m in model.modules()):  # SyncBatchNorm: the selection stays stateless
        score_and_assert_stateless(model, shard)
    loss = wrapped(shard)
    loss.backward()
    for centering in (m for m in model.modules() if isinstance(m, Centering)):
        centering.step()  # the optimiser-step boundary (DINO.on_train_batch_end)
    return {
        "loss": loss.detach(),
        "choice": model.last_selection["choice"],
        "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        "buffers": {n: b.clone() for n, b in model.named_buffers()},
        "sync_bn": sum(isinstance(m, CpuSyncBatchNorm) for m in model.modules()),
    }


def _steps(rank: int, world: int, cases: dict[str, tuple]) -> dict[str, dict[str, Any]]:
    return {name: _one_step(*case, rank, world) for name, case in cases.items()}


def _case(
    cfg: DictConfig, b: int, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[DictConfig, dict[str, torch.Tensor], dict[str, Any]]:
    torch.manual_seed(seed)
    model = build(cfg).to(dtype)
    g = torch.Generator().manual_seed(seed)
    views = [torch.randn(b, 3, a.size, a.size, generator=g).to(dtype) for a in augs_of(cfg)]
    batch = {"views": views, "label": torch.zeros(b, dtype=torch.long), "index": torch.arange(b)}
    return cfg, model.state_dict(), batch


CASES = {
    # ViT, BatchNorm-free: the all-reduced centre and the reused teacher outputs.
    "dino": lambda: _case(make_cfg("method=dino_cifar", *VIT, "+hvp=on", tiny=False), b=6, seed=0),
    # ResNet + BN heads with SyncBatchNorm: the selection and the step normalise over 2B.
    "simsiam": lambda: _case(make_cfg("+hvp=on", *RESNET), b=8, seed=1),
    # NT-Xent negatives from both ranks (selection table and training loss), gradients back to
    # the local keys only; SyncBatchNorm as for SimSiam.
    "simclr": lambda: _case(make_cfg("method=simclr_cifar", "+hvp=on", *RESNET), b=8, seed=2),
    # Momentum targets with BatchNorm (synchronised too); MoCo v3's keys from both ranks.
    "byol": lambda: _case(make_cfg("method=byol_cifar", "+hvp=on", *RESNET, "method.pred_hidden_dim=32"), b=8, seed=3),
    "mocov3": lambda: _case(
        make_cfg("method=mocov3_cifar", "+hvp=on", *RESNET, "method.pred_hidden_dim=32"), b=8, seed=4
    ),
    # Batch losses: the statistics are those of the global batch of 2B on every rank. VICReg
    # gathers both ranks' embeddings (all_gather with gradient) for variance and covariance, its
    # invariance is the rank's own mean (DDP's gradient average makes it the global one); Barlow
    # Twins all-reduces the per-feature sums for the standardisation and the cross-correlation
    # sum. The leave-one-out tables score against both ranks' reference pairs. SyncBatchNorm as
    # for SimSiam. VICReg in fp64: at this random init its gradient is ill-conditioned (one
    # process with 1 vs 2 intra-op threads already differs by ~1% in fp32), which would hide a
    # real mismatch; in fp64 the comparison is tight.
    "vicreg": lambda: _case(make_cfg("method=vicreg_cifar", "+hvp=on", *RESNET), b=8, seed=3, dtype=torch.float64),
    "barlow_twins": lambda: _case(make_cfg("method=barlow_twins_cifar", "+hvp=on", *RESNET), b=8, seed=4),
}


def _close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """Equal up to float rounding relative to the tensor's scale (2B in one pass and 2 x B
    with all-reduced statistics sum in different orders; 20 BatchNorms deep that is ~1e-5)."""
    actual, expected = actual.double(), expected.double()
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-4 * float(expected.abs().max()) + 1e-7, msg=name)


@pytest.fixture(scope="module")
def ddp_vs_single() -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    cases = {name: make() for name, make in CASES.items()}
    single = _steps(0, 1, cases)
    ranks = run_ranks(_steps, (cases,), world=WORLD)
    return {name: (single[name], [r[name] for r in ranks]) for name in cases}


@pytest.mark.slow  # 2 gloo processes (forked), one step of every method: ~8 s on 2 cores
@pytest.mark.parametrize("case", list(CASES))
def test_ddp_step_equals_single_process_with_global_batch(ddp_vs_single, case: str) -> None:
    """Per-rank batch B on 2 gloo processes vs batch 2B in one: the same hard choice per
    sample, loss (mean of the ranks' means), DDP-averaged gradients, centre and BatchNorm
    statistics (SimSiam/SimCLR/BYOL/MoCo v3: SyncBatchNorm in backbone, heads and target,
    SimCLR's negatives and MoCo v3's keys from both ranks; DINO: BN-free ViT)."""
    single, ranks = ddp_vs_single[case]
    assert torch.equal(torch.cat([r["choice"] for r in ranks]), single["choice"])
    torch.testing.assert_close(torch.stack([r["loss"] for r in ranks]).mean(), single["loss"], rtol=1e-5, atol=1e-6)
    if case == "barlow_twins":  # every term is a statistic of the global batch: each rank's loss is the 2B loss
        for r in ranks:
            torch.testing.assert_close(r["loss"], single["loss"], rtol=1e-5, atol=1e-6)
    assert single["grads"].keys() == ranks[0]["grads"].keys() and single["grads"]
    for name, grad in single["grads"].items():
        for r in ranks:  # DDP leaves the same averaged gradient on every rank
            _close(r["grads"][name], grad, name)
    for name, buf in single["buffers"].items():  # BatchNorm running statistics, DINO's centre
        for r in ranks:
            _close(r["buffers"][name], buf, name)
    if case == "dino":
        assert not torch.equal(
            single["buffers"]["centering.center"], torch.zeros_like(single["buffers"]["centering.center"])
        )
        assert ranks[0]["sync_bn"] == 0
    else:
        cfg = make_cfg(f"method={case}_cifar", *RESNET)
        assert ranks[0]["sync_bn"] == sum(isinstance(m, _BatchNorm) for m in build(cfg).modules()) > 0


# --- SyncBatchNorm conversion -----------------------------------------------------------------


def test_sync_batchnorm_auto_converts_resnet_and_bn_heads_not_vit() -> None:
    """``trainer.sync_batchnorm=auto``: a plugin for a model with BatchNorm (on CPU all layers,
    backbone and heads, become :class:`CpuSyncBatchNorm` -- DDP refuses torch's SyncBatchNorm
    there; revert restores plain BatchNorm with the same tensors), none for a BN-free ViT;
    ``true``/``false`` force it."""
    resnet = build(make_cfg(*RESNET))
    n_bn = sum(isinstance(m, _BatchNorm) for m in resnet.modules())
    assert n_bn > sum(isinstance(m, _BatchNorm) for m in resnet.backbone.modules()) > 0  # heads have BN too
    (plugin,) = sync_batchnorm_plugins("auto", resnet)
    weight = resnet.backbone.trunk.bn1.weight
    converted = plugin.apply(resnet)
    assert plugin.converted == n_bn == sum(type(m) is CpuSyncBatchNorm for m in converted.modules())
    assert not any(isinstance(m, nn.SyncBatchNorm) for m in converted.modules())
    assert converted.backbone.trunk.bn1.weight is weight  # the optimiser's parameters stay the same
    reverted = plugin.revert(converted)
    assert not any(isinstance(m, (nn.SyncBatchNorm, CpuSyncBatchNorm)) for m in reverted.modules())
    assert sum(isinstance(m, _BatchNorm) for m in reverted.modules()) == n_bn
    on_gpu = build(make_cfg(*RESNET))  # a GPU strategy gets torch's SyncBatchNorm kernel
    on_gpu.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))  # type: ignore[assignment]
    converted = plugin.apply(on_gpu)
    assert plugin.converted == n_bn == sum(type(m) is nn.SyncBatchNorm for m in converted.modules())
    vit = build(make_cfg("method=dino_cifar", *VIT, tiny=False))
    assert sync_batchnorm_plugins("auto", vit) == [] and sync_batchnorm_plugins(False, resnet) == []
    assert isinstance(sync_batchnorm_plugins(True, vit)[0], SyncBatchNormPlugin)


def test_sync_batchnorm_single_process_is_batchnorm() -> None:
    """Without a process group (or with one of size 1) CpuSyncBatchNorm is plain BatchNorm."""
    torch.manual_seed(0)
    bn, sync = nn.BatchNorm2d(4), CpuSyncBatchNorm(4)
    sync.load_state_dict(bn.state_dict())
    x = torch.randn(5, 4, 3, 3)
    torch.testing.assert_close(sync(x), bn(x))
    torch.testing.assert_close(sync.running_var, bn.running_var)


# --- learning rate: base_lr x global batch / 256 --------------------------------------------------

PRESETS = [
    "simsiam",
    "simsiam_cifar",
    "simclr",
    "simclr_cifar",
    "dino",
    "dino_cifar",
    "ibot",
    "ibot_cifar",
    "byol",
    "byol_cifar",
    "mocov3",
    "mocov3_cifar",
    "mocov3_vit",
    "vicreg",
    "vicreg_cifar",
    "barlow_twins",
    "barlow_twins_cifar",
]


def _small(preset: str) -> list[str]:
    """The preset with a tiny network: the schedule does not depend on it."""
    if preset.startswith(("dino", "ibot")):
        return [*VIT, "method.num_local_crops=2", *(["method.patch_out_dim=64"] if preset.startswith("ibot") else [])]
    if preset.endswith("vit"):
        return VIT[:6]  # backbone and crop size only (no multi-crop head)
    return ["backbone=resnet18_narrow", "backbone.width=4"]


@pytest.mark.parametrize(
    "preset",
    # the CIFAR presets in the default suite (one per method, and MoCo v3's ViT); the rest run the
    # same code with the other values of their method: slow
    [p if p.endswith(("_cifar", "_vit")) else pytest.param(p, marks=pytest.mark.slow) for p in PRESETS],
)
def test_lr_scales_with_global_batch(preset: str) -> None:
    """Every preset: peak lr = base_lr x (batch_size x world_size x accumulate_grad_batches) / 256
    for every parameter group (the papers' linear rule); the cosine ends at the absolute
    min_lr for DINO/iBOT (their min_lr=1e-6 at any batch) and at final_lr_ratio x peak else."""
    cfg = validate(make_cfg(f"method={preset}", *_small(preset), "data.train_size=4096", tiny=False))
    model = build(cfg)
    model.trainer = SimpleNamespace(
        world_size=8, accumulate_grad_batches=2, estimated_stepping_batches=1000, max_epochs=100
    )  # type: ignore[assignment]
    out = model.configure_optimizers()
    o = cfg.method.optimizer
    peak = o.base_lr * cfg.method.batch_size * 16 / 256
    assert model.global_batch_size == cfg.method.batch_size * 16
    end = o.min_lr if o.min_lr is not None else o.final_lr_ratio * peak
    assert (o.min_lr is not None) == preset.startswith(("dino", "ibot"))
    groups, lambdas = out["optimizer"].param_groups, out["lr_scheduler"]["scheduler"].lr_lambdas
    scales = [1.0, o.base_lr_biases / o.base_lr] if preset.startswith("barlow_twins") else [1.0] * len(groups)
    assert len(groups) == len(scales)
    for group, schedule, scale in zip(groups, lambdas, scales):  # Barlow Twins: biases/BN at their own lr
        assert group["initial_lr"] == pytest.approx(peak * scale)
        fixed = group.get("fixed_lr", False)  # SimSiam's predictor (fix_pred_lr) keeps the peak lr
        assert schedule(1000) * peak == pytest.approx(peak if fixed else end, abs=1e-12)


# --- config checks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.sync_batchnorm=maybe", "trainer.sync_batchnorm='maybe'"),
        ("trainer=ddp trainer.num_nodes=0", "trainer.num_nodes=0"),
        ("method=dino_cifar method.optimizer.min_lr=-1", "method.optimizer.min_lr=-1"),
        ("method=dino_cifar method.optimizer.final_lr_ratio=0.1", "method.optimizer.min_lr=1e-06"),
        ("method.optimizer.final_lr_ratio=2", "method.optimizer.final_lr_ratio=2"),
    ],
)
def test_ddp_config_errors_name_key_value_and_allowed(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(make_cfg(*override.split()))
    assert str(err.value).startswith(key) and "allowed" in str(err.value)


@pytest.mark.parametrize("preset", ["ddp", "ddp_8gpu"])
def test_ddp_presets_are_trainer_arguments(preset: str) -> None:
    cfg = make_cfg(f"trainer={preset}", tiny=False)
    validate(cfg)  # every key is a lightning.Trainer argument (sync_batchnorm: resolved by train.py)
    assert cfg.trainer.strategy == "ddp" and cfg.trainer.num_nodes == 1 and cfg.trainer.sync_batchnorm == "auto"
    if preset == "ddp_8gpu":
        assert cfg.trainer.devices == 8 and cfg.trainer.precision == "bf16-mixed" and cfg.trainer.accelerator == "gpu"


# --- per-rank run state in checkpoints -------------------------------------------------------


def _rank_totals(rank: int) -> torch.Tensor:
    return torch.arange(6, dtype=torch.float64) + 10 * rank


def _method_in_ddp(rank: int, world: int, cfg: DictConfig) -> Any:
    """The method attached, as ``fit`` attaches it, to a DDP trainer of ``world`` CPU processes
    in which it is rank ``rank`` (run_ranks' process group): the mixin gathers its run totals
    through Lightning. One process: no trainer (a checkpoint read for evaluation)."""
    model = build(cfg)
    if world > 1:
        os.environ["LOCAL_RANK"] = str(rank)  # this forked process's rank, as torchrun would say
        model.trainer = L.Trainer(
            accelerator="cpu",
            devices=world,
            strategy="ddp",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        assert (model.global_rank, model.trainer.world_size) == (rank, world)
    return model


def _save_run_state(rank: int, world: int, cfg: DictConfig) -> dict[str, Any]:
    """The checkpoint dict each rank dumps (rank 0's is the file) of a module whose run totals,
    and run counters whose skipped files, differ per rank."""
    model, counters = _method_in_ddp(rank, world, cfg), RunCounters()
    model.hvp_totals, counters.skipped_files = _rank_totals(rank), {f"bad{rank}.jpg"}
    ckpt: dict[str, Any] = {}
    model.on_save_checkpoint(ckpt)  # the module's HVP totals
    counters.on_save_checkpoint(None, model, ckpt)  # the run counters (a callback; no trainer used): skipped files
    return ckpt


def _load_run_state(rank: int, world: int, cfg: DictConfig, ckpt: dict[str, Any]) -> tuple[torch.Tensor, set[str]]:
    model, counters = _method_in_ddp(rank, world, cfg), RunCounters()
    model.on_load_checkpoint(ckpt)
    counters.on_load_checkpoint(None, model, ckpt)
    return model.hvp_totals, counters.skipped_files


def _roundtrip(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint as rank 0 writes it and a resumed run reads it (``weights_only=True``)."""
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.slow  # 2 gloo processes (forked) with a Lightning DDP trainer each
def test_run_totals_and_skipped_files_are_kept_per_rank() -> None:
    """HVP's run totals and the skipped files are saved for every rank, not rank 0's alone:
    each of 2 ranks resumes its own (the summary sums / unites them); a single process
    resuming a 2-rank run takes the sum and the union; a checkpoint from before per-rank
    state (one tensor, one list: the writer's) resumes on rank 0, the other rank at zero."""
    cfg = make_cfg("+hvp=on")
    ckpt = _roundtrip(run_ranks(_save_run_state, (cfg,), world=WORLD)[0])
    both = [_rank_totals(r) for r in range(WORLD)]
    for rank, (totals, skipped) in enumerate(run_ranks(_load_run_state, (cfg, ckpt), world=WORLD)):
        assert torch.equal(totals, both[rank]) and skipped == {f"bad{rank}.jpg"}
    totals, skipped = _load_run_state(0, 1, cfg, ckpt)
    assert torch.equal(totals, sum(both)) and skipped == {"bad0.jpg", "bad1.jpg"}

    old = {"hvp_lightning": {**ckpt["hvp_lightning"], "hvp_totals": both[0], "skipped_files": ["bad0.jpg"]}}
    (t0, s0), (t1, s1) = run_ranks(_load_run_state, (cfg, _roundtrip(old)), world=WORLD)
    assert torch.equal(t0, both[0]) and s0 == {"bad0.jpg"}
    assert torch.equal(t1, torch.zeros(6, dtype=torch.float64)) and s1 == set()


# --- train.py end to end: trainer=ddp on 2 CPU processes ------------------------------------------

COMMON = [
    "trainer=ddp",
    "trainer.accelerator=cpu",
    f"trainer.devices={WORLD}",
    "logger=csv",
    "+hvp=on",
    "data.train_size=64",
    "data.test_size=33",
    "data.num_workers=0",
    "method.batch_size=16",
    "trainer.max_epochs=1",
    "eval.every_n_epochs=1",
    "trainer.log_every_n_steps=1",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
]
METHOD_OVERRIDES = {
    "simsiam": ["method=simsiam_cifar", *RESNET, "method.pred_hidden_dim=16"],
    "simclr": ["method=simclr_cifar", *RESNET],
    "dino": ["method=dino_cifar", *VIT],
    "ibot": ["method=ibot_cifar", *VIT, "method.patch_out_dim=64"],
    "byol": ["method=byol_cifar", *RESNET, "method.pred_hidden_dim=16"],
    "mocov3": ["method=mocov3_cifar", *RESNET, "method.pred_hidden_dim=16"],
    "vicreg": ["method=vicreg_cifar", *RESNET],
    "barlow_twins": ["method=barlow_twins_cifar", *RESNET],
}


def _ddp_run(method: str, tmp_path: Path, *extra: str, data: str = "synthetic") -> tuple[dict[str, Any], str]:
    """A 2-process run; ``data="images"``: on 71 generated JPEGs, 7 held out for the monitors (64
    train, as the textures), with a labelled ``data.eval_root`` of 2 x 10 bank and 17 + 16 test images."""
    overrides = [*COMMON, *METHOD_OVERRIDES[method], *extra]
    if data == "images":
        write_images(tmp_path.parent / "images", 71)
        for split, sizes in (("train", (10, 10)), ("test", (17, 16))):
            for c, n in enumerate(sizes):
                write_images(tmp_path.parent / "eval" / split / f"c{c}", n)
        overrides = [
            *images_run(overrides, tmp_path.parent / "images", 7),
            f"data.eval_root={tmp_path.parent / 'eval'}",
        ]
    proc = subprocess.run(
        [sys.executable, "train.py", *overrides, f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (tmp_path / "stderr.txt").write_text(proc.stderr)
    return json.loads((tmp_path / "summary.json").read_text()), proc.stdout


def _check_world_size_two(method: str, summary: dict[str, Any], stdout: str) -> None:
    """64 images, per-rank batch 16 on 2 ranks: 2 steps of a global batch of 32; every sample
    selected once; the k-NN scores each of the 33 test images once (the DistributedSampler
    pads one duplicate, the gather drops it); only rank 0 prints the final line."""
    assert summary["method"] == method and summary["epochs"] == 1
    assert summary["steps"] == 64 // (16 * WORLD) == 2
    assert summary["images_seen"] == 64 == WORLD * 2 * 16  # 2 x the per-rank images
    assert summary["hvp"]["selected_samples"] == 64
    assert summary["hvp"]["selection_selected_loss_mean"] >= summary["hvp"]["selection_candidate_loss_mean"]
    assert summary["knn_queries"] == 33 and 0 <= summary["knn_top1"] <= 1
    assert math.isclose(summary["knn_top1"] * 33, round(summary["knn_top1"] * 33), abs_tol=1e-6)
    assert summary["train_loss"] is not None and math.isfinite(summary["train_loss"])
    assert stdout.count("k-NN top-1:") == 1


def _bn_layers(method: str) -> int:
    cfg = make_cfg(*(o for o in METHOD_OVERRIDES[method]), "+hvp=on", tiny=False)
    return sum(isinstance(m, _BatchNorm) for m in build(cfg).modules())


@pytest.mark.slow  # train.py on 2 processes: ~25 s on 2 cores
@pytest.mark.parametrize("data", ["synthetic", "images"])
def test_ddp_train_simsiam_resnet_sync_batchnorm(tmp_path: Path, data: str) -> None:
    """The DDP run: SimSiam, ResNet, every BatchNorm synchronised, k-NN at
    init (validate before fit: Lightning launches the second process once). The label-free
    monitors see each image once: the 33 test images, or data=images's 7 held-out ones (each
    rank embeds its padded half, the gather drops the duplicate)."""
    summary, stdout = _ddp_run("simsiam", tmp_path / "run", "eval.at_start=true", data=data)
    tmp_path = tmp_path / "run"
    _check_world_size_two("simsiam", summary, stdout)
    assert summary["monitor_images"] == (7 if data == "images" else 33)
    assert [h["images_seen"] for h in summary["monitor_history"]] == [0, 64]
    # Quiet: no warning from hvp_lightning's code, none of the known ones it silences.
    log = (tmp_path / "stderr.txt").read_text()
    warned = re.findall(r"^\S+\.py:\d+: .*$", log, re.M)
    assert not [w for w in warned if "hvp_lightning" in w or "sync_dist=True" in w or "LeafSpec" in w], warned
    assert summary["sync_batchnorm_layers"] == _bn_layers("simsiam") > 0
    assert summary["knn_top1_init"] is not None
    config = OmegaConf.load(tmp_path / "config.yaml")
    assert config.trainer.strategy == "ddp" and config.trainer.devices == WORLD


@pytest.mark.slow
@pytest.mark.parametrize("method", ["simclr", "dino", "ibot", "byol", "mocov3", "vicreg", "barlow_twins"])
def test_ddp_train_every_method(method: str, tmp_path: Path) -> None:
    """SimCLR (ResNet, synchronised BatchNorm, negatives from both ranks), DINO and iBOT (ViT:
    nothing to synchronise, all-reduced centres), BYOL and MoCo v3 (ResNet, target included in
    the synchronised BatchNorm; MoCo v3's keys from both ranks), VICReg and Barlow Twins (ResNet,
    synchronised BatchNorm, batch statistics over both ranks)."""
    summary, stdout = _ddp_run(method, tmp_path, "eval.at_start=false")
    _check_world_size_two(method, summary, stdout)
    vit = method in ("dino", "ibot")
    assert summary["sync_batchnorm_layers"] == (0 if vit else _bn_layers(method))
    if vit:
        state = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
        assert state["centering.center"].abs().sum() > 0


@pytest.mark.slow  # ~45 s on 2 cores; .ci/run runs it
def test_ddp_train_with_resident_images(tmp_path: Path) -> None:
    """``data.on_device=true`` under DDP: Lightning's distributed sampler splits the index
    batches (2 steps of 2 x 16, every image once), each rank holds the images and cuts its own
    views with its own draws, and the run ends as the loader-fed one does."""
    import pyarrow.parquet as pq

    summary, stdout = _ddp_run(
        "simclr", tmp_path, "eval.at_start=false", "data.on_device=true", "analysis.log_every_n_steps=1"
    )
    _check_world_size_two("simclr", summary, stdout)
    assert OmegaConf.load(tmp_path / "config.yaml").data.on_device is True
    views = {
        rank: pq.read_table(sorted((tmp_path / "analysis").glob(f"views-r{rank}-*.parquet"))[0]).to_pydict()
        for rank in range(WORLD)
    }
    assert views[0]["crop_x"] and views[0]["sample"] == views[1]["sample"]
    assert views[0]["crop_x"] != views[1]["crop_x"]  # sample b of a step: other draws on each rank


HVP_STATS = (
    "selection_selected_loss_mean",
    "selection_candidate_loss_mean",
    "trained_loss_mean",
    "nonfinite_candidates",
    "selected_samples",
)


@pytest.mark.slow  # two DDP runs of 2 processes: ~100 s on a small machine
def test_ddp_resume_keeps_every_ranks_hvp_totals(tmp_path: Path) -> None:
    """A 2-process run restarted from its epoch-1 checkpoint ends with the straight 2-epoch
    run's HVP statistics: each rank resumes its own run totals, which the summary sums over
    the ranks (rank 0's on every rank would count rank 0's first epoch twice)."""
    extra = ("eval.at_start=false", "trainer.max_epochs=2", "eval.every_n_epochs=2", "checkpoint.every_n_epochs=1")
    straight, _ = _ddp_run("simsiam", tmp_path / "straight", *extra)
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    (tmp_path / "resumed" / "checkpoints" / "last.ckpt").write_bytes(
        (tmp_path / "straight" / "checkpoints" / "epoch=001.ckpt").read_bytes()
    )
    resumed, _ = _ddp_run("simsiam", tmp_path / "resumed", *extra)
    assert resumed["steps"] == straight["steps"] == 4 and resumed["hvp"]["selected_samples"] == 2 * 64
    for key in HVP_STATS:
        assert resumed["hvp"][key] == pytest.approx(straight["hvp"][key], rel=1e-6, abs=1e-9), key
