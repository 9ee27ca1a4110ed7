"""The GPU layer: every path of a run on CUDA, in a few steps with tiny models.

Kept out of the default run (``-m 'not slow and not gpu and not slurm'`` in pyproject.toml); on a GPU machine::

    python3 -m pytest -m gpu -n 0   # or: uv run pytest -m gpu -n 0 (one process on the one GPU)

Every method x HVP off/on x ``trainer.precision`` (32-true, bf16-mixed, 16-mixed) x
``hvp.selection_precision`` (auto, fp32): fit, final k-NN, summary.json, checkpoint and the
analysis logs; for HVP off and ``auto`` also resume, eval.py (k-NN, linear, fine-tune) and
export. Then one real ``train.py`` per method on one GPU and with ``trainer=ddp`` (NCCL), the
auto selection's dtype, and benchmarks/overhead.py at each precision. Logger: CSV (the GPU
machine has no wandb, no lightly, no network).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from omegaconf import OmegaConf

from hvp_lightning.data.datamodule import SSLDataModule
from hvp_lightning.evaluation import evaluate
from hvp_lightning.selection import step_autocast_dtype
from hvp_lightning.training import export
from hvp_lightning.training.checkpoint import resume_config
from hvp_lightning.training.driver import run

from .conftest import REPO, TINY, augs_of, build, eval_cfg, make_cfg

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
VIT = [
    "backbone=vit_tiny",
    "backbone.patch_size=8",
    "backbone.img_size=16",
    "backbone.depth=1",
    "method.local_crop_size=8",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
]
METHOD = {
    "simsiam": ["method=simsiam_cifar"],
    "simclr": ["method=simclr_cifar"],
    "dino": ["method=dino_cifar", *VIT],
    "ibot": ["method=ibot_cifar", *VIT],
    "byol": ["method=byol_cifar", "method.pred_hidden_dim=32"],
    "mocov3": ["method=mocov3_cifar", "method.pred_hidden_dim=32"],
    "vicreg": ["method=vicreg_cifar"],
    "barlow_twins": ["method=barlow_twins_cifar"],
}
STEPS = 64 // 16  # data.train_size / method.batch_size: steps per epoch
# (hvp, selection_precision): HVP off, and HVP at both selection precisions
HVP = [(False, None), (True, "auto"), (True, "fp32")]


def run_overrides(
    method: str, precision: str, hvp: bool, selection: str | None, *extra: str, trainer: str = "gpu"
) -> list[str]:
    over = [
        *METHOD[method],
        f"trainer={trainer}",
        f"trainer.precision={precision}",
        "logger=csv",
        "eval.every_n_epochs=1",
        "checkpoint.every_n_epochs=1",
        "analysis.log_every_n_steps=1",
        *extra,
    ]
    if hvp:
        over += ["+hvp=on", "hvp.num_views=3", f"hvp.selection_precision={selection}"]
    return over


def gpu_cfg(method: str, precision: str, hvp: bool, selection: str | None, *extra: str):
    return make_cfg(*run_overrides(method, precision, hvp, selection, *extra))


def assert_summary(summary: dict, run_dir: Path, steps: int, hvp: bool) -> None:
    assert summary["steps"] == steps and math.isfinite(summary["train_loss"])
    assert 0 <= summary["knn_top1"] <= 1 and summary["knn_history"][-1]["step"] == steps  # final k-NN
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == steps
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    cost = summary["cost"]  # FLOPs counted on the meta device; phases timed with CUDA events on a GPU
    assert cost["total_flops"] > 0 and cost["images_per_s"] > 0 and sum(cost["time_split"].values()) > 0.99
    assert cost["mfu"] is None or 0 < cost["mfu"] < 1  # None on CPU and on a GPU Lightning has no peak for
    if hvp:
        assert summary["hvp"]["selected_samples"] == 16 * steps
        assert summary["hvp"]["selection_selected_loss_mean"] >= summary["hvp"]["selection_candidate_loss_mean"] - 1e-3


@pytest.mark.parametrize(("hvp", "selection"), HVP, ids=["hvp_off", "hvp_auto", "hvp_fp32"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("method", list(METHOD))
def test_run_on_one_gpu(method: str, precision: str, hvp: bool, selection: str | None, tmp_path: Path) -> None:
    check_run(method, precision, hvp, selection, tmp_path)


def check_run(
    method: str, precision: str, hvp: bool, selection: str | None, tmp_path: Path, trainer: str = "gpu"
) -> None:
    """Fit, final k-NN, summary, checkpoint, analysis logs; then (HVP off / auto) resume,
    eval.py's three protocols at the same precision and export. (``trainer="cpu"``: the same
    checks in the default suite, so this layer cannot drift from the package unseen.)"""
    over = run_overrides(method, precision, hvp, selection, trainer=trainer)
    summary = run(make_cfg(*over), tmp_path)
    assert_summary(summary, tmp_path, STEPS, hvp)
    analysis = tmp_path / "analysis"
    assert (analysis / "steps-r0.csv").read_text().count("\n") == STEPS + 1
    assert list(analysis.glob("pairs-*.parquet")) and list(analysis.glob("views-*.parquet"))
    if selection == "fp32":  # the precision of the selection changes nothing below
        return
    resumed = run(resume_config(tmp_path, make_cfg(*over, "trainer.max_epochs=2"), ["trainer.max_epochs=2"]), tmp_path)
    assert_summary(resumed, tmp_path, 2 * STEPS, hvp)
    assert resumed["images_seen"] == 2 * summary["images_seen"]
    protocols = {
        "knn": [],
        "linear": ["protocol.epochs=1", "protocol.batch_size=32", "protocol.n_last_blocks=1"],
        "finetune": ["protocol.epochs=1", "protocol.batch_size=16", "protocol.n_last_blocks=1"],
    }
    for name, extra in protocols.items():
        res = evaluate(
            eval_cfg(f"ckpt={tmp_path}", f"protocol={name}", *extra, f"accelerator={trainer}", f"precision={precision}")
        )
        assert 0 <= res["metrics"]["top1"] <= res["metrics"]["top5"] <= 1, name
    assert export.main([str(tmp_path), str(tmp_path / "backbone.pth")]) == 0
    state = torch.load(tmp_path / "backbone.pth", weights_only=True)
    assert state and all(t.device.type == "cpu" for t in state.values())


def cuda_batch(model, cfg) -> dict:
    """One real training batch of ``model``'s views on the GPU (views, params, label, index)."""
    dm = SSLDataModule(cfg.data, augs_of(cfg), cfg.method.batch_size, 0, cfg.seed)
    dm.setup("fit")
    return move_data_to_device(next(iter(dm.train_dataloader())), torch.device("cuda"))


@pytest.mark.parametrize(
    ("precision", "expected"), [("32-true", torch.float32), ("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16)]
)
@pytest.mark.parametrize("method", list(METHOD))
def test_auto_selection_runs_at_the_step_precision(method: str, precision: str, expected: torch.dtype) -> None:
    """``auto``: the selection's forwards run in the training step's dtype; ``fp32``: in fp32;
    the candidate table is fp32 either way."""
    for selection, want in (("auto", expected), ("fp32", torch.float32)):
        cfg = gpu_cfg(method, precision, True, selection)
        model = build(cfg).cuda().train()
        batch = cuda_batch(model, cfg)
        seen: list[torch.dtype] = []
        stem = next(m for m in model.backbone.modules() if isinstance(m, torch.nn.Conv2d))  # conv1 / patch_embed
        hook = stem.register_forward_hook(lambda m, i, out, seen=seen: seen.append(out.dtype))
        dtype = step_autocast_dtype(precision)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            table = model.score_candidates(batch).table  # iBOT draws its masks itself
        hook.remove()
        assert seen and set(seen) == {want}, (selection, seen)
        assert table.dtype == torch.float32 and torch.isfinite(table).all()


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
@pytest.mark.parametrize("method", ["dino", "ibot"])
def test_teacher_reuse_at_the_step_precision(method: str, precision: str) -> None:
    """With ``auto`` the selection runs at the step's precision, so the ViT teacher's selection
    outputs are reused; the step's loss equals the one with a second teacher forward."""
    torch.manual_seed(0)
    cfg = gpu_cfg(method, precision, True, "auto", "backbone.drop_path_rate=0.0")
    model = build(cfg).cuda().train()
    batch = cuda_batch(model, cfg)
    step, reused, losses = model.ssl_step, [], []

    def recording(b: dict, batch_idx: int) -> torch.Tensor:
        reused.append("teacher_out" in b)
        return step(b, batch_idx)

    model.ssl_step = recording  # type: ignore[method-assign]
    for reuse in (True, False):
        model.teacher_reuse = reuse
        with torch.autocast("cuda", dtype=step_autocast_dtype(precision)):
            losses.append(model.training_step(batch, 0).detach().float())
    assert reused == [True, False]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-3, atol=1e-3)


def cli_overrides(method: str) -> list[str]:
    """The tiny run of :func:`make_cfg` as ``train.py`` arguments: the method's overrides and
    conftest's TINY entries whose keys its config has."""
    cfg = make_cfg(*METHOD[method], tiny=False)
    tiny = [o for o in TINY if o.startswith("+") or OmegaConf.select(cfg, o.split("=", 1)[0]) is not None]
    return [*METHOD[method], "logger=csv", *tiny]


def run_script(args: list[str], run_dir: Path, timeout: int = 600) -> dict:
    env = dict(os.environ, WANDB_MODE="disabled")
    proc = subprocess.run(
        [sys.executable, "train.py", *args, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.parametrize("method", list(METHOD))
def test_train_py_on_one_gpu(method: str, tmp_path: Path) -> None:
    """``python train.py trainer=gpu +hvp=on`` as a user runs it (bf16-mixed, the preset's)."""
    summary = run_script([*cli_overrides(method), "trainer=gpu", "+hvp=on"], tmp_path)
    assert summary["steps"] == STEPS and summary["hvp"]["selected_samples"] == 16 * STEPS


@pytest.mark.parametrize("method", list(METHOD))
def test_train_py_ddp_nccl_one_gpu(method: str, tmp_path: Path) -> None:
    """``trainer=ddp trainer.devices=1`` on a GPU (NCCL, bf16-mixed): it trains, all-reduces the
    loss and HVP totals after fit and writes summary.json."""
    summary = run_script(
        [
            *cli_overrides(method),
            "trainer=ddp",
            "trainer.devices=1",
            "trainer.accelerator=gpu",
            "trainer.precision=bf16-mixed",
            "+hvp=on",
        ],
        tmp_path,
    )
    assert summary["steps"] == STEPS and math.isfinite(summary["train_loss"])
    assert summary["hvp"]["selected_samples"] == 16 * STEPS


@pytest.mark.parametrize("precision", PRECISIONS)
def test_overhead_benchmark_on_gpu(precision: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/overhead.py",
            "--method",
            "simsiam",
            "--width",
            "8",
            "--batch-size",
            "16",
            "--crop",
            "16",
            "--iters",
            "2",
            "--warmup",
            "1",
            "--device",
            "cuda",
            "--precision",
            precision,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    peaks = [line for line in proc.stdout.splitlines() if "peak GPU memory" in line]
    assert len(peaks) == 2 and all("MiB" in line for line in peaks), proc.stdout[-2000:]


def test_resident_crops_on_gpu_match_the_cpu() -> None:
    """``data.on_device``'s crops cut on the GPU equal the CPU's for the same parameters (one
    level at most: float64 sums in another order may round differently at a boundary)."""
    from hvp_lightning.data.augment import UNIFORMS, ViewAug, draw_params
    from hvp_lightning.data.resident import crop_flip_batch

    g = torch.Generator().manual_seed(0)
    imgs = torch.randint(0, 256, (64, 3, 40, 36), generator=g, dtype=torch.uint8)
    params = draw_params(torch.rand(64, UNIFORMS, dtype=torch.float64, device="cuda"), 40, 36, ViewAug(size=24))
    gpu = crop_flip_batch(imgs.cuda(), params, 24)
    cpu = crop_flip_batch(imgs, {k: v.cpu() for k, v in params.items()}, 24)
    assert gpu.device.type == "cuda" and (gpu.cpu().int() - cpu.int()).abs().max() <= 1


def test_resident_views_make_one_host_sync() -> None:
    """After the first batch (images moved, generator made), cutting a resident batch on the GPU
    never waits for the device (no sync under sync-debug mode "error"), and colouring it once:
    the batch's op counts (:func:`.batched.plan_colour`), counted under mode "warn"."""
    from hvp_lightning.data.augment import ViewAug
    from hvp_lightning.data.batched import finish_views
    from hvp_lightning.data.resident import ResidentImages

    from .data.test_batched_aug import cuda_syncs

    g = torch.Generator().manual_seed(0)
    imgs = torch.randint(0, 256, (32, 3, 40, 36), generator=g, dtype=torch.uint8)
    augs = (ViewAug(size=24, blur_p=0.5, solarize_p=0.3),) * 2 + (ViewAug(size=12, scale=(0.05, 0.4)),) * 2
    res = ResidentImages(imgs, torch.arange(32), augs, seed=0)
    index = torch.randperm(32, generator=g)[:8].cuda()
    res.views(index)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch = res.views(index)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out, syncs = cuda_syncs(lambda: finish_views(batch["views"], batch["params"], augs))
    assert syncs == 1
    assert [v.shape for v in out] == [(8, 3, 24, 24)] * 2 + [(8, 3, 12, 12)] * 2 and out[0].is_cuda


@pytest.mark.parametrize("method", ["simclr", "dino"])
def test_run_with_resident_images_on_one_gpu(method: str, tmp_path: Path) -> None:
    """``data.on_device=true`` on a GPU: images held there, views cut and coloured there, HVP on."""
    summary = run(gpu_cfg(method, "bf16-mixed", True, "auto", "data.on_device=true"), tmp_path)
    assert_summary(summary, tmp_path, STEPS, True)
    assert summary["cost"]["time_split"]["augment"] > 0  # the views made there: a phase of their own


@pytest.mark.parametrize("method", ["simsiam", "dino", "ibot"])
def test_compiled_hvp_steps_on_gpu(method: str) -> None:
    """``method.compile=true`` with HVP under bf16 autocast on CUDA: the compiled step gives the
    eager step's loss, and once warm (selection and training graphs made) further steps
    compile nothing new (no recompiles that would end in an eager fallback)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    extra = ["backbone.drop_path_rate=0.0"] if method in ("dino", "ibot") else []
    cfg = gpu_cfg(method, "bf16-mixed", True, "auto", "method.compile=true", *extra)
    torch.manual_seed(0)
    eager = build(cfg).cuda().train()
    compiled = build(cfg).cuda().train()
    compiled.load_state_dict(eager.state_dict())
    compiled.configure_model()
    batch = cuda_batch(eager, cfg)
    graphs = []
    for step in range(4):
        losses = []
        for model in (eager, compiled):
            model.load_state_dict(eager.state_dict())  # same weights and BatchNorm statistics
            with (
                torch.autocast("cuda", dtype=torch.bfloat16),
                torch._dynamo.config.patch(fail_on_recompile_limit_hit=True),
            ):  # no silent eager fallback
                losses.append(model.training_step(batch, step).detach().float())
        torch.testing.assert_close(losses[1], losses[0], rtol=5e-2, atol=5e-2)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] > 0 and graphs[-1] == graphs[1], graphs


@pytest.mark.parametrize("api", ["legacy", "new"])
def test_candidate_tables_skip_tf32_on_gpu(api: str, matmul_precision_restored) -> None:
    """Under train.py's ``set_float32_matmul_precision("high")``, or TF32 allowed through the
    newer ``torch.backends.cuda.matmul.fp32_precision``, the DINO table is still plain fp32 on
    the GPU (it matches a float64 reference where a TF32 einsum does not) and cuBLAS accepts the
    settings."""
    from hvp_lightning.losses import dino_ce_table, student_log_probs, teacher_probs

    g = torch.Generator().manual_seed(0)
    t, s = torch.randn(2, 8, 4096, generator=g).cuda(), torch.randn(5, 8, 4096, generator=g).cuda()
    center = torch.zeros(4096, device="cuda")
    q, logp = teacher_probs(t, center, 0.04), student_log_probs(s, 0.1)
    want = -torch.einsum("gbk,vbk->bgv", q.double(), logp.double())
    if api == "legacy":
        torch.set_float32_matmul_precision("high")
    else:  # from torch's default, as in a fresh process
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    table = dino_ce_table(t, s, center, 0.04, 0.1)
    tf32 = -torch.einsum("gbk,vbk->bgv", q, logp)
    torch.testing.assert_close(table.double(), want, rtol=1e-5, atol=1e-4)
    if torch.cuda.get_device_capability() >= (8, 0):  # TF32 exists: the check can tell
        assert (tf32.double() - want).abs().max() > 1e-3


def test_torchvision9_blur_on_gpu_matches_the_cpu() -> None:
    """``blur_kind=torchvision9`` (the HVP code's GaussianBlur(9, ...), SimSiam/DINO presets): the
    batched convolution on the GPU against the CPU's view-by-view torchvision call, same sigmas;
    one level at most (the device's float sums may round the other way at a boundary)."""
    import dataclasses

    from hvp_lightning.data.augment import PARAM_NAMES, ViewAug
    from hvp_lightning.data.batched import colour

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (32, 3, 40, 36), generator=g, dtype=torch.uint8)
    aug = dataclasses.replace(ViewAug(size=40), blur_kind="torchvision9")
    params = {k: torch.zeros(32) for k in PARAM_NAMES} | {"jitter_order": torch.full((32, 4), -1)}
    params["blur_sigma"] = torch.rand(32, generator=g) * 1.9 + 0.1
    cpu = colour(x, params, aug, sync_free=False)
    gpu = colour(x.cuda(), {k: v.cuda() for k, v in params.items()}, aug)
    assert gpu.is_cuda and (gpu.cpu() - cpu).abs().max() <= 1


def test_timm_backbone_from_a_file_on_unlabelled_images_on_one_gpu(tmp_path: Path) -> None:
    """Your own images on a GPU: ``backbone=timm`` started from a weights file, ``data=images`` with the
    label-free monitors, SimSiam at ``trainer.precision=auto-16-mixed`` (fp16 on a GPU) with HVP,
    then the export folder timm loads."""
    import timm

    from .conftest import images_run, write_images

    weights = tmp_path / "resnet10t.pth"
    torch.save(timm.create_model("resnet10t", num_classes=0).state_dict(), weights)
    write_images(tmp_path / "images", 40)
    over = images_run(
        [
            "trainer=gpu",
            "trainer.precision=auto-16-mixed",
            "backbone=timm",
            "backbone.name=resnet10t",
            f"backbone.init={weights}",
            "+hvp=on",
            "hvp.num_views=3",
        ],
        tmp_path / "images",
        monitor_size=8,
    )
    run_dir = tmp_path / "run"
    summary = run(make_cfg(*over), run_dir)
    assert summary["steps"] == 2 and summary["hvp_enabled"] and math.isfinite(summary["train_loss"])
    assert summary["monitor_source"] == "monitor" and math.isfinite(summary["monitor_rankme"])
    assert export.main([str(run_dir), str(tmp_path / "exported")]) == 0
    model = timm.create_model(f"local-dir:{tmp_path / 'exported'}", pretrained=True)
    assert sum(p.numel() for p in model.parameters()) > 0
