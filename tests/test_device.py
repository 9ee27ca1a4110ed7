"""The main job's device choice (trainer=auto, precision auto) and its start-up and final lines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import hvp_lightning.device
from hvp_lightning.config import validate
from hvp_lightning.device import auto_precision, device_line
from hvp_lightning.errors import ConfigError
from hvp_lightning.training.driver import final_line, monitor_summary

from .conftest import augs_of, build, make_cfg, make_settings

VIT = ["backbone=vit_tiny", "backbone.patch_size=8", "backbone.img_size=16"]


@pytest.mark.parametrize(
    ("cuda", "bf16", "accelerator", "expected"),
    [
        (False, False, "auto", "32-true"),  # CPU-only machine: fp32, no flag needed
        (True, True, "auto", "bf16-mixed"),  # a bf16-capable GPU
        (True, False, "auto", "32-true"),  # an older GPU: fp32 rather than an fp16 surprise
        (True, True, "cpu", "32-true"),  # CPU asked for on a GPU machine: still fp32
    ],
)
def test_auto_precision(monkeypatch, cuda, bf16, accelerator, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert auto_precision(accelerator) == expected


@pytest.mark.parametrize(
    ("cuda", "accelerator", "expected"),
    [(True, "gpu", "16-mixed"), (True, "auto", "16-mixed"), (True, "cpu", "32-true"), (False, "auto", "32-true")],
)
def test_auto_16_mixed_is_fp16_on_a_gpu_and_fp32_on_the_cpu(monkeypatch, cuda, accelerator, expected):
    """The SimSiam and SimCLR presets' ``auto-16-mixed``: the HVP code's fp16 on any GPU (no
    bf16 needed), 32-true on a CPU, where Lightning has no fp16 AMP; validate resolves it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert auto_precision(accelerator, "auto-16-mixed") == expected
    if not cuda:
        cfg = make_cfg("trainer.precision=auto-16-mixed", "trainer.accelerator=cpu")
        cfg = validate(cfg)
        assert cfg.trainer.precision == "32-true"


def test_auto_precision_is_fp32_on_a_gpu_that_only_emulates_bf16(monkeypatch):
    """A V100 (compute capability 7.0) through torch's own ``is_bf16_supported``: it answers yes
    there (a bf16 tensor can be made: emulation), yet bf16 runs slower than fp32 on it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(major=7, minor=0))
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)  # allocation works
    monkeypatch.setattr(torch.version, "hip", None)
    assert torch.cuda.is_bf16_supported()  # the emulated answer the choice must not follow
    assert auto_precision("auto") == "32-true"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(major=8, minor=0))
    assert auto_precision("auto") == "bf16-mixed"  # an A100 / H100


def test_default_trainer_is_auto_and_validate_resolves_precision():
    cfg = make_cfg(tiny=False)
    assert cfg.trainer.accelerator == "auto" and cfg.trainer.precision == "auto"
    cfg = make_cfg("trainer=auto", "trainer.accelerator=cpu")
    cfg = validate(cfg)
    assert cfg.trainer.precision == "32-true"


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        ([], None),  # a ResNet: its global average pooling is a mean, deterministic on CUDA
        (["method=dino_cifar", *VIT, "method.local_crop_size=8"], "8 px crops"),  # the ViT resizes for locals
        (["method=simclr_cifar", *VIT], None),  # a ViT at its own size: nothing resized
    ],
)
def test_deterministic_true_is_refused_where_a_gpu_run_would_raise(monkeypatch, overrides, refused):
    """``trainer.deterministic=true`` passes on CPU (the resume tests use it) but makes torch
    raise at a GPU run's first backward through an op without a deterministic CUDA kernel:
    refused at start-up there, naming the op; ``warn`` stays allowed."""
    validate(make_cfg(*overrides, "+trainer.deterministic=true"))  # CPU kernels are deterministic
    monkeypatch.setattr(hvp_lightning.device, "runs_on_cpu", lambda accelerator: False)  # a GPU run
    validate(make_cfg(*overrides, "+trainer.deterministic=warn"))
    cfg = make_cfg(*overrides, "+trainer.deterministic=true")
    if refused is None:
        validate(cfg)
    else:
        with pytest.raises(ConfigError, match=rf"trainer\.deterministic.*{refused}"):
            validate(cfg)


# Backward ops whose CUDA kernels call ``alertNotDeterministic`` (torch's
# ``use_deterministic_algorithms`` list: pooling, interpolation, padding, sampling).
CUDA_NONDETERMINISTIC_BACKWARD = (
    "_adaptive_avg_pool2d_backward",
    "adaptive_max_pool2d_backward",
    "avg_pool3d_backward",
    "upsample_linear1d_backward",
    "upsample_bilinear2d_backward",
    "_upsample_bilinear2d_aa_backward",
    "upsample_bicubic2d_backward",
    "_upsample_bicubic2d_aa_backward",
    "upsample_trilinear3d_backward",
    "reflection_pad1d_backward",
    "reflection_pad2d_backward",
    "grid_sampler_2d_backward",
)


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # ResNet
        ["method=dino_cifar", *VIT, "method.local_crop_size=8"],  # ViT with local crops
        ["method=simclr_cifar", *VIT],  # ViT at its own size
    ],
)
def test_deterministic_rule_matches_the_ops_the_network_runs(overrides):
    """The start-up rule (refuse ``deterministic=true`` on a GPU) against the aten ops one
    forward/backward of the run's backbone at every view size really dispatches on CPU
    (the same composite decisions as on CUDA, e.g. a 1x1 adaptive pool becomes a mean)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hvp_lightning.config import nondeterministic_cuda_backward

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    cfg = make_settings(*overrides)
    model = build(cfg)
    with Ops() as ops:
        for aug in augs_of(cfg):
            model.backbone(torch.randn(2, 3, aug.size, aug.size)).float().sum().backward()
    hits = sorted(ops.names & set(CUDA_NONDETERMINISTIC_BACKWARD))
    assert bool(hits) == (nondeterministic_cuda_backward(cfg) is not None), hits


def test_matmul_precision_is_tf32_on_gpus_and_exact_on_cpus(matmul_precision_restored):
    """train.py/eval.py's setting: TF32 for cuBLAS, readable through the legacy getter
    (Lightning's CUDA start-up check reads it) and through ``allow_tf32`` (torch's check that
    both APIs agree), while oneDNN keeps plain fp32 on CPUs."""
    from hvp_lightning.device import set_matmul_precision

    set_matmul_precision()
    assert torch.get_float32_matmul_precision() == "high"
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.mkldnn.matmul.fp32_precision == "ieee"


def test_device_line_names_device_and_precision():
    line = device_line(torch.device("cpu"), "32-true")
    assert line == f"device: cpu ({torch.get_num_threads()} threads) | precision: 32-true"
    assert "x 2 processes" in device_line(torch.device("cpu"), "bf16-mixed", world_size=2)


def test_final_line_is_one_line_with_init_chance_run_dir_and_hvp_gap():
    summary = {"knn_top1": 0.5, "knn_top1_init": 0.125, "knn_chance": 0.1, "run_dir": "runs/x"}
    assert final_line(summary) == "k-NN top-1: 50.00% (at init 12.50%, chance 10.0%) | run dir: runs/x"
    hvp = dict(summary, hvp={"selection_selected_loss_mean": 5.25, "selection_candidate_loss_mean": 5.0})
    line = final_line(hvp)
    assert "\n" not in line and "| HVP selected - candidate loss: +0.2500 |" in line
    assert line.endswith("| run dir: runs/x")
    assert "at init" not in final_line(dict(summary, knn_top1_init=None))
    # with HVP, what the selection cost: its share of the run's model FLOPs, an HVP step's over a baseline step's
    cost = {
        "train_flops_per_image": 6,
        "selection_flops_per_image": 4,
        "baseline_flops_per_image": 6,
        "selection_flops_share": 0.4,
    }
    line = final_line(dict(hvp, hvp_enabled=True, cost=cost))
    assert "| HVP cost: selection 40% of model FLOPs, step 1.67x the baseline's | run dir: runs/x" in line
    # every run with a FLOP count ends with its model FLOPs (budget.flops' unit), with or without HVP
    total = dict(cost, total_flops=2.1638e13)
    assert final_line(dict(hvp, hvp_enabled=True, cost=total)).endswith(
        "step 1.67x the baseline's | model FLOPs: 2.16e+13 | run dir: runs/x"
    )
    assert final_line(dict(summary, cost={"total_flops": 1.0374e13})).endswith(
        "| model FLOPs: 1.04e+13 | run dir: runs/x"
    )
    no_count = dict(cost, selection_flops_share=None, baseline_flops_per_image=None)
    assert "HVP cost" not in final_line(dict(hvp, hvp_enabled=True, cost=no_count))


def test_final_line_without_labels_gives_the_monitors_and_says_when_they_signalled_collapse():
    """No k-NN (data=images without data.eval_root): RankMe out of min(n, d) and the feature std
    in units of 1/sqrt(d), each against its random-init value, and the sample; the epoch of a
    signalled collapse is added to either kind of line."""
    summary = {
        "knn_top1": None,
        "monitor_rankme": 45.25,
        "monitor_rankme_init": 13.8,
        "monitor_feature_std": 0.5 / 8,
        "monitor_feature_std_init": 0.1 / 8,
        "monitor_images": 512,
        "monitor_dim": 64,
        "monitor_source": "monitor",
        "monitor_collapse_epoch": None,
        "run_dir": "runs/x",
    }
    assert final_line(summary) == (
        "RankMe 45.2 of 64 (at init 13.8), feature std 0.500/sqrt(d) (at init 0.100/sqrt(d)) "
        "on 512 held-out images | run dir: runs/x"
    )
    no_init = dict(summary, monitor_rankme_init=None, monitor_feature_std_init=None, monitor_collapse_epoch=3.0)
    assert final_line(no_init) == (
        "RankMe 45.2 of 64, feature std 0.500/sqrt(d) on 512 held-out images "
        "| collapse signalled at epoch 3 | run dir: runs/x"
    )
    knn = {"knn_top1": 0.5, "knn_chance": 0.1, "monitor_collapse_epoch": 2.5, "run_dir": "runs/x"}
    assert final_line(knn) == "k-NN top-1: 50.00% (chance 10.0%) | collapse signalled at epoch 2.5 | run dir: runs/x"


def test_final_line_shows_the_run_dir_as_the_readme_does(tmp_path, monkeypatch):
    """Under the working directory, relative, whether Hydra gave it absolute (a fresh run) or
    the user typed it relative (resume=); elsewhere absolute."""
    monkeypatch.chdir(tmp_path)
    summary = {"knn_top1": 0.5, "knn_chance": 0.1}
    for given in (str(tmp_path / "runs" / "x"), "runs/x", "./runs/x"):
        assert final_line(dict(summary, run_dir=given)).endswith("| run dir: runs/x"), given
    outside = tmp_path.parent / "elsewhere"
    assert final_line(dict(summary, run_dir=str(outside))).endswith(f"| run dir: {outside.resolve()}")


def test_a_gpu_accelerator_without_a_gpu_is_one_line_naming_the_key(monkeypatch) -> None:
    """trainer=gpu (or eval's accelerator=gpu) on a machine without CUDA: the key and value,
    not Lightning's "No supported gpu backend found!"."""
    import torch

    from hvp_lightning.device import check_accelerator
    from hvp_lightning.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for accelerator in ("gpu", "cuda"):
        with pytest.raises(ConfigError, match=rf"^trainer.accelerator='{accelerator}' is not allowed: cpu or auto"):
            check_accelerator("trainer.accelerator", accelerator)
    for accelerator in ("cpu", "auto"):
        check_accelerator("trainer.accelerator", accelerator)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_accelerator("accelerator", "gpu")


def test_a_low_reading_at_random_init_is_not_a_collapse_of_the_run():
    """An untrained network can span few directions (a timm ResNet-10: RankMe 1.4 on a few images);
    the summary's collapse epoch is the first *trained* pass below the thresholds."""
    low, healthy = {"rankme": 1.4, "feature_std": 0.05}, {"rankme": 9.0, "feature_std": 0.05}
    history = [{"step": 0, "epoch": 0.0, **low}, {"step": 8, "epoch": 1.0, **healthy}]
    last = {"dim": 64, "images": 16, "source": "monitor", **healthy}
    assert monitor_summary(last, low, history)["monitor_collapse_epoch"] is None
    history.append({"step": 16, "epoch": 2.0, **low})
    assert monitor_summary(last, low, history)["monitor_collapse_epoch"] == 2.0


@pytest.mark.parametrize(
    ("cores", "processes", "slurm", "expected"),
    [
        (2, 1, None, (1, "2 usable CPU cores")),  # the 2-core machine: one worker beside the training process
        (1, 1, None, (0, "1 usable CPU core")),  # one core: the training process loads
        (64, 1, None, (8, "64 usable CPU cores")),  # at most 8 per process
        (32, 8, None, (3, "32 usable CPU cores / 8 processes")),  # DDP on one machine: each rank its share
        (64, 8, "5", (4, "5 CPUs per SLURM task")),  # a SLURM task: its own CPUs (cpus_per_task 5 under auto)
        (3, 1, "5", (2, "5 CPUs per SLURM task")),  # ... but never more than the process may use
    ],
)
def test_auto_loader_workers_are_the_cores_of_this_process_but_one(monkeypatch, cores, processes, slurm, expected):
    monkeypatch.setattr(hvp_lightning.device, "usable_cpu_cores", lambda: cores)
    environ = {"SLURM_CPUS_PER_TASK": slurm} if slurm else {}
    assert hvp_lightning.device.auto_workers(processes, environ) == expected


def test_loader_workers_auto_and_numbers(monkeypatch, caplog):
    from hvp_lightning.cluster.slurm import cpus_per_task
    from hvp_lightning.device import loader_workers, local_processes
    from hvp_lightning.schema.run import TrainerSettings

    def trainer(devices, accelerator="auto"):
        return TrainerSettings(devices=devices, accelerator=accelerator, precision="32-true", max_epochs=1)

    monkeypatch.setattr(hvp_lightning.device, "usable_cpu_cores", lambda: 4)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    assert loader_workers("auto") == (3, "3 loader workers (data.num_workers=auto: 4 usable CPU cores)")
    assert loader_workers(2) == (2, "2 loader workers") and not caplog.records  # a number below the cores: as given
    assert loader_workers(6)[0] == 4 and "data.num_workers=6 is more than the 4 CPU cores" in caplog.text
    assert [local_processes(t) for t in (trainer(2, "cpu"), trainer([0, 1]), trainer("0,1"))] == [2, 2, 2]
    assert local_processes(trainer("auto", "cpu")) == 1
    assert (cpus_per_task("auto"), cpus_per_task(3)) == (5, 4)  # SLURM: auto's 4 workers + the training process
    with pytest.raises(ConfigError, match=r"^data.num_workers='many' is not allowed: .*auto"):
        from hvp_lightning.config import check_options

        check_options(make_cfg("data.num_workers=many"))
