"""eval.py (k-NN, linear probe, fine-tuning) and the backbone export, on tiny checkpoints."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.utils.data import DataLoader, TensorDataset

from hvp_lightning.cli import evaluate_main, train, transfer_main
from hvp_lightning.config import ConfigError
from hvp_lightning.errors import CheckpointError
from hvp_lightning.evaluation import evaluate
from hvp_lightning.evaluation.features import FeatureNet, eval_precision
from hvp_lightning.evaluation.probe import (
    Classifier,
    HeadRecipe,
    fit_classifier,
    lars_growth_bound,
    warn_if_lars_cannot_fit,
)
from hvp_lightning.monitors.knn import knn_accuracies, knn_accuracy
from hvp_lightning.nn.backbones import build_resnet, build_vit
from hvp_lightning.run.directory import eval_variant
from hvp_lightning.training import export
from hvp_lightning.training.checkpoint import pretrained_for
from hvp_lightning.training.driver import run

from .conftest import (
    REPO,
    SUBPROCESS_TIMEOUT_S,
    build,
    eval_cfg,
    eval_settings,
    help_groups,
    make_cfg,
    make_settings,
    run_cli,
    tiered,
    write_images,
)

DINO = [
    "method=dino_cifar",
    "backbone=vit_tiny",
    "backbone.patch_size=8",
    "backbone.img_size=32",
    "backbone.depth=2",
    "data.crop_size=32",
    "data.train_size=32",
    "method.local_crop_size=16",
    "method.out_dim=256",
    "method.head_hidden_dim=64",
    "method.bottleneck_dim=32",
]


@pytest.fixture(scope="module")
def dino_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("dino")
    run(make_cfg(*DINO), run_dir)
    return run_dir


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_evaluation_runs_at_the_training_matmul_precision(simsiam_run, monkeypatch, matmul_precision_restored):
    """eval.py computes features under train.py's float32 matmul precision (TF32 on GPUs), so
    its k-NN repeats the run's monitor there too; a fresh eval process starts at "highest"."""
    run_dir, _ = simsiam_run
    seen: list[str] = []

    def spy(cfg, backbone, data, settings, logger):
        seen.append(torch.get_float32_matmul_precision())
        return {"top1": 0.0, "top5": 0.0, "k_for_top1": 20}

    monkeypatch.setattr("hvp_lightning.evaluation.run.run_knn", spy)
    torch.set_float32_matmul_precision("highest")  # torch's default, as in a new eval.py process
    evaluate(eval_cfg(f"ckpt={run_dir}", "protocol=knn", f"out_dir={run_dir / 'eval_precision'}"))
    assert seen == ["high"]


# --- k-NN and the linear classifier on toy features -------------------------------------------
def _brute_force_knn(bank, bank_y, query, query_y, num_classes, k, t):
    bank, query = F.normalize(bank, dim=1), F.normalize(query, dim=1)
    top1 = top5 = 0
    for q, y in zip(query, query_y):
        sim = bank @ q
        order = sorted(range(len(bank)), key=lambda i: -float(sim[i]))[:k]
        votes = torch.zeros(num_classes, dtype=torch.float64)
        for i in order:
            votes[bank_y[i]] += float(torch.exp(sim[i].double() / t))
        ranked = sorted(range(num_classes), key=lambda c: -float(votes[c]))
        top1 += int(ranked[0] == y)
        top5 += int(y in ranked[:5])
    return top1 / len(query), top5 / len(query)


def test_knn_matches_brute_force_for_several_k():
    g = torch.Generator().manual_seed(0)
    bank, query = torch.randn(150, 12, generator=g), torch.randn(40, 12, generator=g)
    bank_y, query_y = torch.randint(0, 12, (150,), generator=g), torch.randint(0, 12, (40,), generator=g)
    # k >= 10 of 12 classes: at least 5 classes get votes, so top-5 has no ties to break.
    res = knn_accuracies(bank, bank_y, query, query_y, 12, ks=(10, 20, 100, 200), temperature=0.07, chunk=16)
    assert set(res) == {10, 20, 100, 200}
    for k, r in res.items():
        top1, top5 = _brute_force_knn(bank, bank_y, query, query_y, 12, min(k, 150), 0.07)
        assert r["top1"] == pytest.approx(top1) and r["top5"] == pytest.approx(top5), k
        assert r == pytest.approx(knn_accuracy(bank, bank_y, query, query_y, 12, k, 0.07))  # the online monitor's


def _cpu() -> DictConfig:
    return OmegaConf.create({"accelerator": "cpu", "devices": 1, "precision": "32-true", "progress_bar": False})


def test_linear_probe_separates_linearly_separable_features():
    g = torch.Generator().manual_seed(0)
    centres = 4 * torch.randn(5, 16, generator=g)

    def blobs(n):
        y = torch.randint(0, 5, (n,), generator=g)
        return centres[y] + torch.randn(n, 16, generator=g), y

    (x_train, y_train), (x_test, y_test) = blobs(500), blobs(200)
    model = Classifier(
        None, 16, 5, HeadRecipe("sgd", lr=0.5, weight_decay=0.0, momentum=0.9, warmup_epochs=0, epochs=10)
    )
    res = fit_classifier(
        _cpu(),
        model,
        DataLoader(TensorDataset(x_train, y_train), batch_size=50, shuffle=True),
        DataLoader(TensorDataset(x_test, y_test), batch_size=100),
        epochs=10,
    )
    assert res["top1"] >= 0.99 and res["top5"] == 1.0 and res["train_loss"] < 0.1
    # scored after every epoch, as the official eval_linear.py (val_freq 1): the best and the last
    assert len(res["top1_per_epoch"]) == 10 and res["top1"] == res["top1_per_epoch"][-1]
    assert res["best_top1"] == max(res["top1_per_epoch"]) == res["top1_per_epoch"][res["best_epoch"] - 1]


def test_classifier_decays_every_parameter():
    """One optimiser group with the weight decay, biases and norm weights included, as the
    official AdamW / SGD of eval_linear.py (automl/hvp dino:eval_linear.py lines 129-139); the
    frozen backbone of a linear probe is not optimised."""
    net = build_resnet("resnet18", width=8, cifar_stem=True)
    recipe = HeadRecipe("adamw", lr=1e-3, weight_decay=0.05, momentum=0.9, warmup_epochs=0, epochs=1)
    for finetune in (True, False):
        model = Classifier(FeatureNet(net), 64, 3, recipe, finetune=finetune)
        (group,) = model.optimizer().param_groups
        trained = list(model.parameters()) if finetune else list(model.head.parameters())
        assert group["weight_decay"] == 0.05 and {id(p) for p in group["params"]} == {id(p) for p in trained}
        assert any(p.ndim == 1 for p in group["params"])  # biases (and BatchNorm weights) decay too


def test_auto_precision_is_fp16_for_vit_classifiers_on_a_gpu_only():
    """``precision: auto``: fp16 autocast with loss scaling (Lightning's 16-mixed) where the
    official code uses it, a ViT's linear probe or fine-tuning on a GPU (automl/hvp dino:eval_linear.py
    lines 145 and 238); fp32 for ResNets (main:eval_linear.py), k-NN and every CPU run. A value
    the user gives is kept. The GPU path itself runs in tests/test_gpu.py's machines only."""
    import warnings

    from lightning.pytorch.plugins.precision import MixedPrecision

    for protocol in ("linear", "finetune"):
        assert eval_precision("auto", protocol, vit=True, on_gpu=True) == "16-mixed"
        assert eval_precision("auto", protocol, vit=True, on_gpu=False) == "32-true"
        assert eval_precision("auto", protocol, vit=False, on_gpu=True) == "32-true"
    assert eval_precision("auto", "knn", vit=True, on_gpu=True) == "32-true"
    assert eval_precision("bf16-mixed", "finetune", vit=True, on_gpu=True) == "bf16-mixed"
    # What Lightning makes of "16-mixed" on a GPU: fp16 autocast (not bf16) with a GradScaler.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*CUDA is not available.*")  # this CPU machine
        plugin = MixedPrecision("16-mixed", "cuda", scaler=torch.amp.GradScaler("cuda", enabled=False))
        assert plugin.autocast_context_manager().fast_dtype == torch.float16


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_eval_views_resize_with_the_protocols_interpolation(interpolation):
    """The classifier's test views are torchvision's Resize + CenterCrop + Normalize with the
    protocol's interpolation (bicubic for DINO/iBOT/SimCLR: automl/hvp dino:data/__init__.py line 117)."""
    from torchvision.transforms import v2

    from hvp_lightning.data.augment import EvalTransform

    img = torch.randint(0, 256, (3, 45, 38), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    mean, std = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)
    mode = v2.InterpolationMode[interpolation.upper()]
    official = v2.Compose(
        [
            v2.Resize(32, interpolation=mode, antialias=True),
            v2.CenterCrop(28),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ]
    )
    ours = EvalTransform(28, 28 / 32, mean, std, interpolation)(img)
    torch.testing.assert_close(ours, official(img), atol=1e-5, rtol=0)
    other = "bicubic" if interpolation == "bilinear" else "bilinear"
    assert not torch.allclose(ours, EvalTransform(28, 28 / 32, mean, std, other)(img))


def test_vit_features_concatenate_cls_of_last_blocks():
    vit = build_vit("vit_tiny", img_size=32, patch_size=8, depth=3).eval()
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(FeatureNet(vit)(x), vit(x))  # n=1: the backbone's own output (final CLS)
    net = FeatureNet(vit, n_last_blocks=2, avgpool_patchtokens=True)
    feats = net(x)
    assert net.feature_dim == feats.shape[1] == 3 * 192
    torch.testing.assert_close(feats[:, 192:384], vit(x))  # the last block's CLS is the second chunk
    res = FeatureNet(build_resnet("resnet18", width=8, cifar_stem=True), n_last_blocks=4)
    assert res.n == 1 and res.feature_dim == 64  # ResNets: pooled features whatever n says


# --- eval.py end to end ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "protocol",
    [
        pytest.param(["protocol=knn"], id="knn"),
        pytest.param(  # whole probes: a Lightning fit each
            ["protocol=linear", "protocol.epochs=2", "protocol.batch_size=32", "protocol.augment=true"],
            id="linear",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["protocol=linear", "protocol.epochs=2", "protocol.batch_size=32", "protocol.augment=false"],
            id="linear-precomputed",
            marks=pytest.mark.slow,
        ),
        pytest.param(  # defaults: batch sized to the data, augment auto
            ["protocol=linear", "protocol.epochs=2"], id="linear-defaults"
        ),
        pytest.param(
            ["protocol=finetune", "protocol.epochs=1", "protocol.batch_size=16", "protocol.base_lr=0.01"],
            id="finetune",
            marks=pytest.mark.slow,
        ),
    ],
)
@pytest.mark.slow  # an evaluation end to end on a run
def test_eval_protocols_end_to_end(simsiam_run, protocol, caplog):
    run_dir, train_summary = simsiam_run
    with caplog.at_level("INFO", logger="hvp_lightning.evaluation.run"):
        summary = evaluate(eval_cfg(f"ckpt={run_dir}", *protocol))
    name = protocol[0].split("=")[1]
    out = run_dir / "eval" / name
    on_disk = json.loads((out / "eval_summary.json").read_text())
    assert on_disk["protocol"] == name and on_disk["checkpoint"] == str(
        (run_dir / "checkpoints" / "last.ckpt").resolve()
    )
    assert on_disk["dataset"] == {
        "name": "synthetic",
        "train_images": 64,
        "test_images": 32,
        "num_classes": 10,
        "crop_size": 16,
        "mean": list(make_cfg().data.mean),
        "std": list(make_cfg().data.std),
    }
    m = on_disk["metrics"]
    assert 0 <= m["top1"] <= m["top5"] <= 1 and on_disk["features"] == "backbone"
    assert (on_disk["pretrain_epochs"], on_disk["pretrain_batches"]) == (1, 0)
    assert summary["metrics"] == m
    header = (out / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    if name == "knn":
        assert set(m) >= {"k10", "k20", "k100", "k200"}
        # Same features, bank and protocol as the training run's final k-NN monitor (k=20, T=0.07).
        assert (m["k20"]["top1"], m["k20"]["top5"]) == (train_summary["knn_top1"], train_summary["knn_top5"])
        assert "eval/knn_k200_top1" in header
    else:
        assert {"eval/top1", "train/loss_step"} <= set(header) and m["train_loss"] is not None
        s = on_disk["settings"]
        # SimSiam recipes; both scale lr = base_lr * batch / 256 as the official eval_linear.py
        # (automl/hvp main:eval_linear.py line 127, dino:eval_linear.py line 128)
        want = ("lars", 0.1, 256) if name == "linear" else ("adamw", 0.01, 256)
        if name == "finetune":  # synthetic data is not in the table: the row auto took is said
            assert "table, row cifar10, as synthetic is not in it; protocol.table_row= picks another" in caplog.text
        assert (s["optimizer"], s["base_lr"], s["lr_ref_batch"]) == want
        assert s["lr"] == pytest.approx(s["base_lr"] * s["batch_size"] / 256)
        assert s["interpolation"] == "bilinear" and on_disk["precision"] == "32-true"  # SimSiam: main:data.py
        assert len(m["top1_per_epoch"]) == s["epochs"] and m["best_top1"] == max(m["top1_per_epoch"])
        if protocol == ["protocol=linear", "protocol.epochs=2"]:
            # the recipe's batch, not one sized to the 64 images: one step an epoch (the official
            # DataLoader's), the lr of batch 4,096 (paper appendix: SimSiam linear, batch 4096, lr 0.1)
            assert (s["batch_size"], s["steps_per_epoch"], s["lr"]) == (4096, 1, pytest.approx(0.1 * 4096 / 256))
            assert s["augment"] is False  # CPU: cached features


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_data_keys_without_a_data_set_change_the_checkpoints_data(simsiam_run, tmp_path):
    """``+data.test_subset=N`` (conf/eval.yaml has no ``data`` without ``data=<name>``) subsamples
    the pretraining data; it used to be taken for a whole data preset and fail validation."""
    run_dir, _ = simsiam_run
    cfg = eval_cfg(f"ckpt={run_dir}", "protocol=knn", "+data.test_subset=5", f"out_dir={tmp_path}")
    summary = evaluate(cfg)
    assert summary["dataset"]["name"] == "synthetic" and summary["dataset"]["test_images"] == 5


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_other_checkpoint_files_and_data_sets_keep_their_own_eval_folder(simsiam_run, tmp_path):
    """An evaluation of another checkpoint file, or on another data set, used to replace the run's
    own ``eval/<protocol>/eval_summary.json``; each now has its ``eval/<variant>/<protocol>/``."""
    run_dir, _ = simsiam_run
    kept = tmp_path / "run" / "checkpoints" / "epoch=1.ckpt"
    kept.parent.mkdir(parents=True)
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", kept)
    summary = evaluate(eval_cfg(f"ckpt='{kept}'", "protocol=knn"))
    assert Path(summary["out_dir"]) == tmp_path / "run" / "eval" / "epoch=1" / "knn"
    assert (tmp_path / "run" / "eval" / "epoch=1" / "knn" / "eval_summary.json").is_file()
    assert eval_variant(run_dir / "checkpoints" / "last.ckpt", None) is None
    assert eval_variant(run_dir / "checkpoints" / "last.ckpt", "food101") == "food101"
    assert eval_variant(kept, "food101") == "epoch=1_food101"
    # data= naming the run's own data set is the run's own evaluation: its folder
    own = evaluate(
        eval_cfg(f"ckpt={run_dir}", "protocol=knn", "data=synthetic", "data.train_size=64", "data.test_size=32")
    )
    assert Path(own["out_dir"]) == run_dir / "eval" / "knn"


def test_pretrained_for_counts_only_finished_epochs():
    """A checkpoint saved inside an epoch (checkpoint.every_n_steps, a pre-emption) was counted as
    ``epoch + 1`` epochs; it is the finished epochs and the batches into the next."""

    def ckpt(epoch: int, step: int, done: int, last: bool) -> dict:
        progress = {"current": {"completed": done}, "is_last_batch": last}
        return {"epoch": epoch, "global_step": step, "loops": {"fit_loop": {"epoch_loop.batch_progress": progress}}}

    assert pretrained_for(ckpt(0, 3, 3, last=False)) == {"epochs": 0, "batches": 3, "steps": 3}
    assert pretrained_for(ckpt(1, 16, 8, last=True)) == {"epochs": 2, "batches": 0, "steps": 16}
    assert pretrained_for({"epoch": 4, "global_step": 50}) == {"epochs": 5, "batches": 0, "steps": 50}


@pytest.mark.parametrize("lr", [0.05, 2.0])
def test_lars_growth_bound_holds_and_is_nearly_reached(lr):
    """LARS on a linear head whose gradient always points outwards (the worst case): the
    weight norm grows by no more than the bound, and by most of it -- a bound without momentum's
    1/(1 - momentum) would be exceeded."""
    from hvp_lightning.nn.optim import make_optimizer, warmup_cosine

    torch.manual_seed(0)
    head = torch.nn.Linear(32, 4, bias=False)
    torch.nn.init.normal_(head.weight, std=0.01)
    w0 = head.weight.detach().clone()
    opt = make_optimizer("lars", [{"params": [head.weight]}], lr, 0.0, 0.9)
    total, warmup = 300, 30
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: warmup_cosine(t, total, warmup))
    for _ in range(total):
        opt.zero_grad()
        (-(head.weight * w0).sum()).backward()  # gradient -w0: every step outwards, the same way
        opt.step()
        sched.step()
    bound = lars_growth_bound(lr, total, warmup, 0.9)
    w = head.weight.detach()
    growth = float(w.norm() / w0.norm())
    assert growth <= bound * (1 + 1e-4)
    assert float((w - w0).norm() / w0.norm()) <= bound - 1 + 1e-4
    assert growth > bound**0.8  # nearly reached: the bound is the right one, not just a loose one


def test_lars_probe_warns_where_it_cannot_fit_the_head(caplog):
    """The SimSiam recipe (LARS, base lr 0.1 per 256) scaled to a few thousand images cannot
    move the head off its init: a warning. Its own scale, or a CIFAR GPU run, or SGD: none."""
    import logging

    def settings(optimizer: str, batch: int) -> HeadRecipe:
        return HeadRecipe(optimizer, lr=0.1 * batch / 256, weight_decay=0.0, momentum=0.9, warmup_epochs=0, epochs=90)

    assert lars_growth_bound(1.6, 90 * 312, 0, 0.9) > math.exp(200)  # ImageNet, batch 4,096
    with caplog.at_level(logging.WARNING, logger="hvp_lightning.evaluation.probe"):
        warn_if_lars_cannot_fit(settings("lars", 4096), 4096, 312)
        warn_if_lars_cannot_fit(settings("lars", 512), 512, 98)  # CIFAR-10's 50k images
        warn_if_lars_cannot_fit(settings("sgd", 128), 128, 24)
        assert not caplog.records
        warn_if_lars_cannot_fit(settings("lars", 128), 128, 24)  # 3,072 images (the demo)
    assert len(caplog.records) == 1 and "protocol.optimizer=sgd" in caplog.records[0].getMessage()


@pytest.mark.slow  # a linear probe and a k-NN pass on the DINO run
def test_eval_dino_uses_the_teacher_and_last_blocks(dino_run):
    summary = evaluate(
        eval_cfg(
            f"ckpt={dino_run}",
            "protocol=linear",
            "protocol.epochs=1",
            "protocol.batch_size=32",
            "protocol.n_last_blocks=2",
            "protocol.augment=false",
        )
    )
    s = summary["settings"]
    assert summary["features"] == "teacher backbone" and s["recipe"] == "dino" and s["optimizer"] == "sgd"
    assert s["n_last_blocks"] == 2 and s["base_lr"] == 0.00075
    student = evaluate(eval_cfg(f"ckpt={dino_run}", "protocol=knn", "student=true", "out_dir=" + str(dino_run / "s")))
    assert student["features"] == "student backbone" and (dino_run / "s" / "eval_summary.json").is_file()
    with pytest.raises(
        ConfigError, match=r"protocol.n_last_blocks=4 is not allowed: at most the backbone's depth \(2\)"
    ):
        evaluate(eval_cfg(f"ckpt={dino_run}", "protocol=linear", "protocol.batch_size=32", "protocol.epochs=1"))


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_eval_config_errors(simsiam_run, tmp_path):
    run_dir, _ = simsiam_run
    write_images(tmp_path / "images", 3)
    unlabelled = ["data=images", f"data.root={tmp_path / 'images'}", "data.monitor_size=1"]
    cases = [
        ([f"ckpt={run_dir}", *unlabelled], r"data.eval_root=None is not allowed: a labelled ImageNet-layout folder"),
        ([], r"ckpt is not set .*add ckpt=\.\.\. to the command"),
        ([f"ckpt={tmp_path}"], r"ckpt='.*' is not allowed: a run dir with checkpoints/last.ckpt or a .ckpt file"),
        ([f"ckpt={run_dir}", "protocol=linear", "protocol.epochs=0"], r"protocol.epochs=0 is not allowed"),
        (
            [f"ckpt={run_dir}", "protocol=linear", "protocol.optimizer=adam"],
            r"protocol.optimizer='adam' is not allowed",
        ),
        ([f"ckpt={run_dir}", "protocol=knn", "protocol.ks=[0,20]"], r"protocol.ks=\[0, 20\] is not allowed"),
        ([f"ckpt={run_dir}", "protocol=finetune", "protocol.table_row=imagenet"], r"protocol.table_row='imagenet'"),
        ([f"ckpt={run_dir}", "data=cifar10", "data.root=/nonexistent"], r"data.root='/nonexistent' is not allowed"),
        ([f"ckpt={run_dir}", "precision=bf16"], r"precision='bf16' is not allowed: one of auto, 32-true, bf16-mixed"),
        (
            [f"ckpt={run_dir}", "protocol=finetune", "protocol.interpolation=nearest"],
            r"protocol.interpolation='nearest'",
        ),
        ([f"ckpt={run_dir}", "accelerator=cpu", "precision=16-mixed"], r"precision='16-mixed' is not allowed: on CPU"),
        ([f"ckpt={run_dir}", "accelerator=tpu"], r"accelerator='tpu' is not allowed: one of auto, cpu, gpu, cuda, mps"),
        ([f"ckpt={run_dir}", "+data.subset=5"], r"data.subset=5 is not allowed: a key of the checkpoint's data \("),
    ]
    for overrides, match in cases:
        with pytest.raises(ConfigError, match=match):
            evaluate(eval_cfg(*overrides))


def test_eval_takes_data_eval_root_as_the_docs_write_it(tmp_path):
    """``eval.py protocol=knn ckpt=RUN data.eval_root=DIR``, no '+': a data=images run is evaluated on
    DIR; without it the run's own data.eval_root stays (conf/eval.yaml's null is no change), and a
    run whose data has no such key, or a data=<preset>, is answered as before."""
    from PIL import Image

    from hvp_lightning.evaluation.data import eval_data_cfg

    write_images(tmp_path / "images", 6)
    labelled = tmp_path / "labelled"
    for split in ("train", "val"):
        for c in ("cat", "dog"):
            (labelled / split / c).mkdir(parents=True)
            Image.new("RGB", (20, 20), (40, 90, 200)).save(labelled / split / c / "0.png")
    unlabelled_overrides = ["data=images", f"data.root={tmp_path / 'images'}", "data.monitor_size=2"]
    unlabelled = make_settings(*unlabelled_overrides)
    given = eval_data_cfg(eval_settings("ckpt=RUN", f"data.eval_root={labelled}"), unlabelled)
    assert given.eval_root == str(labelled) and given.root == str(tmp_path / "images")
    with pytest.raises(ConfigError, match=r"^data.eval_root=None is not allowed: a labelled ImageNet-layout folder"):
        eval_data_cfg(eval_settings("ckpt=RUN"), unlabelled)
    with_own = make_settings(*unlabelled_overrides, f"data.eval_root={labelled}")
    assert eval_data_cfg(eval_settings("ckpt=RUN"), with_own).eval_root == str(labelled)
    with pytest.raises(ConfigError, match=r"^data.eval_root='.*' is not allowed: a key of the checkpoint's data \("):
        eval_data_cfg(eval_settings("ckpt=RUN", f"data.eval_root={labelled}"), make_settings())  # the built-in textures
    assert eval_data_cfg(eval_settings("ckpt=RUN", "data=synthetic"), unlabelled).name == "synthetic"


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_eval_command_prints_its_line_and_writes_its_summary(simsiam_run, tmp_path):
    """``eval.py protocol=knn ckpt=<run>/checkpoints/last.ckpt``, in this process: exit 0, the last
    line (k-NN top-1 and where the summary is) and the summary's k's."""
    run_dir, _ = simsiam_run
    code, out, err = run_cli(
        evaluate_main,
        "protocol=knn",
        f"ckpt={run_dir}/checkpoints/last.ckpt",
        "progress_bar=false",
        "protocol.ks=[5,20]",
        f"out_dir={tmp_path}",
    )
    assert code == 0, err[-2000:]
    assert out.splitlines()[-1].startswith("knn top-1:") and f"{tmp_path}/eval_summary.json" in out
    assert set(json.loads((tmp_path / "eval_summary.json").read_text())["metrics"]) >= {"k5", "k20"}


@pytest.mark.slow  # a fresh interpreter: ~10-25 s on 2 cores
def test_eval_cli(simsiam_run):
    run_dir, _ = simsiam_run
    proc = subprocess.run(
        [
            sys.executable,
            "eval.py",
            "protocol=knn",
            f"ckpt={run_dir}/checkpoints/last.ckpt",
            "progress_bar=false",
            "protocol.ks=[5,20]",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "knn top-1:" in proc.stdout and "eval_summary.json" in proc.stdout
    assert set(json.loads((run_dir / "eval" / "knn" / "eval_summary.json").read_text())["metrics"]) >= {"k5", "k20"}


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_knn_with_k_above_the_bank_says_the_k_that_voted(simsiam_run):
    """protocol.ks=[1000] on a 64-image bank: all 64 vote, and the summary and line say so
    (the line used to read k=1000)."""
    from hvp_lightning.cli import eval_line

    run_dir, _ = simsiam_run
    summary = evaluate(
        eval_cfg(f"ckpt={run_dir}", "protocol=knn", "protocol.ks=[1000]", f"out_dir={run_dir / 'k1000'}")
    )
    m = summary["metrics"]
    assert summary["dataset"]["train_images"] == 64 and m["k_for_top1"] == 64 and m["top1"] == m["k1000"]["top1"]
    assert "(k=64; protocol.ks [1000] above the 64 training images count all of them)" in eval_line(summary)


@pytest.mark.slow  # python <script> --help: ~3 s of CPU (Hydra lists the groups)
def test_eval_help_lists_only_the_groups_eval_takes():
    """Hydra listed every group under conf/, method= among them, which eval.py refuses."""
    assert help_groups("eval.py") == {"protocol", "data", "logger"}


@pytest.mark.slow  # a probe started in a subprocess, then stopped: ~25 s
def test_eval_stopped_by_sigterm_exits_143_and_leaves_no_old_summary(simsiam_run, tmp_path):
    """Lightning ends a SIGTERM with a code-less SystemExit (status 0); eval.py says it stopped and
    exits 143, and the previous evaluation's summary is not left beside the new log."""
    run_dir, _ = simsiam_run
    out = tmp_path / "out"
    (out / "csv").mkdir(parents=True)
    (out / "eval_summary.json").write_text("{}")
    (out / "eval_config.yaml").write_text("{}")
    cmd = [sys.executable, "eval.py", "protocol=linear", f"ckpt={run_dir}", f"out_dir={out}", "progress_bar=false"]
    cmd += ["protocol.augment=true", "protocol.epochs=1000", "protocol.batch_size=8", "accelerator=cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in proc.stdout:  # the probe is training: Lightning's SIGTERM handler is in place
        if line.startswith("epoch 1 of 1000 took"):
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)[0]
    assert proc.returncode == 143, rest[-2000:]
    assert "stopped by SIGTERM: the evaluation wrote no eval_summary.json" in rest
    assert not (out / "eval_summary.json").exists() and not (out / "eval_config.yaml").exists()


PATHS_WITH_EQUALS = [
    ("eval.py", "ckpt", "nothing at that path", []),
    ("transfer.py", "ckpt", "nothing at that path", ["datasets=[cifar10]", "data.cifar10.download=true"]),
    ("train.py", "resume", "a run dir holding checkpoints/last.ckpt", []),
    ("train.py", "backbone.init", "no such file or folder", []),
]


@pytest.mark.parametrize(("script", "key", "refusal", "rest"), tiered(PATHS_WITH_EQUALS, 2))
def test_checkpoint_paths_with_equals_reach_the_checks(tmp_path, script, key, refusal, rest):
    """Kept checkpoints are named epoch=NNN.ckpt: the documented unquoted ``ckpt=.../epoch=100.ckpt``
    reaches our checks (here: no such file) instead of failing in Hydra's override parser."""
    path = tmp_path / "run" / "checkpoints" / "epoch=100.ckpt"
    main = {"eval.py": evaluate_main, "transfer.py": transfer_main, "train.py": train}[script]
    code, _, err = run_cli(main, f"{key}={path}", f"hydra.run.dir={tmp_path / 'new'}", *rest, cwd=tmp_path)
    assert code == 2, err[-2000:]
    assert f"config error: {key}={str(path)!r} is not allowed: " in err and refusal in err


@pytest.mark.slow  # a fresh interpreter per command (transfer.py imports the evaluation stack first: ~15 s)
@pytest.mark.parametrize(("script", "key", "refusal", "rest"), PATHS_WITH_EQUALS)
def test_checkpoint_paths_with_equals_parse_as_typed(tmp_path, script, key, refusal, rest):
    """Kept checkpoints are named epoch=NNN.ckpt: the documented unquoted ``ckpt=.../epoch=100.ckpt``
    reaches our checks (here: no such file) instead of failing in Hydra's override parser."""
    path = tmp_path / "run" / "checkpoints" / "epoch=100.ckpt"
    proc = subprocess.run(
        [sys.executable, script, f"{key}={path}", f"hydra.run.dir={tmp_path / 'new'}", *rest],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"config error: {key}={str(path)!r} is not allowed: " in proc.stderr and refusal in proc.stderr


# --- export --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resnet18_checkpoint(tmp_path_factory):
    """A width-64 ImageNet-stem SimSiam checkpoint with non-trivial BatchNorm statistics: (model, file)."""

    tmp_path = tmp_path_factory.mktemp("resnet18")

    cfg = make_cfg("backbone=resnet18", "backbone.width=64", "data.crop_size=32")
    with open_dict(cfg):
        cfg.data.num_classes = 10
    model = build(cfg)
    for name, buf in model.named_buffers():
        if name.endswith(("running_mean", "running_var")):
            buf.copy_(torch.rand_like(buf) + 0.5)
    ckpt = tmp_path / "last.ckpt"
    torch.save(
        {"state_dict": model.state_dict(), "hyper_parameters": {"cfg": OmegaConf.to_container(cfg, resolve=True)}}, ckpt
    )
    return model.eval(), ckpt


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_export_resnet18_loads_into_torchvision(resnet18_checkpoint, tmp_path, capsys):
    """Width 64 with the ImageNet stem: the exported file is a torchvision resnet18 state_dict
    without the classifier."""
    import torchvision

    model, ckpt = resnet18_checkpoint
    assert export.main([str(ckpt), str(tmp_path / "rn18.pth")]) == 0
    assert "torchvision.models.resnet18()" in capsys.readouterr().out
    state = torch.load(tmp_path / "rn18.pth", weights_only=True)
    assert not any(k.startswith(("trunk.", "backbone.")) for k in state)
    tv = torchvision.models.resnet18()
    missing, unexpected = tv.load_state_dict(state, strict=False)
    assert missing == ["fc.weight", "fc.bias"] and unexpected == []
    tv.fc = torch.nn.Identity()
    tv.load_state_dict(state, strict=True)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(tv.eval()(x), model.backbone.eval()(x))


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_export_narrow_resnet_and_vit_teacher(simsiam_run, dino_run, tmp_path):
    import timm.models.vision_transformer as tvit

    run_dir, _ = simsiam_run
    assert export.main([str(run_dir), str(tmp_path / "narrow.pth")]) == 0
    trunk = build_resnet("resnet18", width=8, cifar_stem=True).trunk
    trunk.load_state_dict(torch.load(tmp_path / "narrow.pth", weights_only=True), strict=True)

    assert export.main([str(dino_run), str(tmp_path / "vit.pth")]) == 0
    state = torch.load(tmp_path / "vit.pth", weights_only=True)
    vit = tvit.VisionTransformer(img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3, num_classes=0)
    vit.load_state_dict(state, strict=True)
    full = tvit.VisionTransformer(img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3)
    missing, unexpected = full.load_state_dict(state, strict=False)
    assert missing == ["head.weight", "head.bias"] and unexpected == []
    ckpt = torch.load(dino_run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    torch.testing.assert_close(
        state["blocks.0.attn.qkv.weight"], ckpt["teacher.backbone.trunk.blocks.0.attn.qkv.weight"]
    )
    assert not torch.equal(state["blocks.0.attn.qkv.weight"], ckpt["backbone.trunk.blocks.0.attn.qkv.weight"])
    assert export.main([str(dino_run), str(tmp_path / "student.pth"), "--student"]) == 0
    student = torch.load(tmp_path / "student.pth", weights_only=True)
    torch.testing.assert_close(student["blocks.0.attn.qkv.weight"], ckpt["backbone.trunk.blocks.0.attn.qkv.weight"])


def _fixed_batch(size: int) -> torch.Tensor:
    return torch.randn(4, 3, size, size, generator=torch.Generator().manual_seed(1))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@pytest.mark.slow  # an export checked in timm
def test_export_folder_loads_strictly_in_timm_with_the_runs_features(resnet18_checkpoint, tmp_path, capsys):
    """The documented load: timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=dict(file=...),
    num_classes=0) takes every tensor of model.safetensors (timm loads non-strictly there, since
    0 classes differ from its 1000: so the key sets are compared here) and gives the run's
    evaluation features; the folder's own config.json (local-dir:) loads strictly too."""
    import timm
    import yaml
    from safetensors.torch import load_file

    from hvp_lightning.training.checkpoint import checkpoint_config, load_checkpoint

    model, ckpt = resnet18_checkpoint
    run_cfg = checkpoint_config(load_checkpoint(ckpt))
    out = tmp_path / "export"
    assert export.main([str(ckpt), str(out)]) == 0
    printed = capsys.readouterr().out
    assert f'checked: timm.create_model("local-dir:{out}", pretrained=True) loads it strictly' in printed
    weights = load_file(out / "model.safetensors")
    x = _fixed_batch(32)
    reference = model.eval_backbone(x)
    tm = timm.create_model(
        "resnet18", pretrained=True, pretrained_cfg_overlay=dict(file=out / "model.safetensors"), num_classes=0
    ).eval()
    own = tm.state_dict()
    assert set(own) == set(weights)
    assert all(torch.equal(own[k], v) for k, v in weights.items())
    assert _max_diff(tm(x), reference) <= 1e-5
    local = timm.create_model(f"local-dir:{out}", pretrained=True).eval()  # strict: config.json says 0 classes
    assert _max_diff(local(x), reference) <= 1e-5
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"] == "resnet18" and config["num_features"] == 512 and config["model_args"] == {}
    data = timm.data.resolve_data_config({}, model=local)
    assert {k: tuple(v) if isinstance(v, list | tuple) else v for k, v in data.items()} == {
        "input_size": (3, 32, 32),
        "interpolation": "bilinear",
        "mean": tuple(run_cfg.data.mean),
        "std": tuple(run_cfg.data.std),
        "crop_pct": run_cfg.data.eval_crop_ratio,
        "crop_mode": "center",
    }
    card = (out / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["library_name"] == "timm" and front["license"] == "mit"
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())["preferred-citation"]
    assert cff["title"] in card and str(cff["year"]) in card
    assert all(f"{a['family-names']}, {a['given-names']}" in card for a in cff["authors"])


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_export_folder_vit_teacher_student_and_narrow_resnet(dino_run, simsiam_run, tmp_path, capsys):
    """A ViT whose size differs from timm's default: the printed create_model lines (model_args
    spelled out) load strictly and give the teacher's features, --student the student's; a
    narrow CIFAR-stem ResNet gets architecture null and a build_resnet line that loads it."""
    import timm
    from safetensors.torch import load_file

    from hvp_lightning.training.checkpoint import build_method, checkpoint_config, load_checkpoint

    model = build_method(load_checkpoint(dino_run / "checkpoints" / "last.ckpt"))
    run_cfg = checkpoint_config(load_checkpoint(dino_run / "checkpoints" / "last.ckpt"))
    x = _fixed_batch(32)
    for flag, reference in (([], model.eval_backbone), (["--student"], model.backbone)):
        out = tmp_path / f"vit{flag}"
        assert export.main([str(dino_run), str(out), *flag]) == 0
        lines = capsys.readouterr().out.splitlines()
        calls = [line.split(": ", 1)[1] for line in lines if line.startswith(("load: timm.", "  or: timm."))]
        assert len(calls) == 2 and "img_size=32, patch_size=8, depth=2, dynamic_img_size=True" in calls[1]
        for call in calls:
            tm = eval(call, {"timm": timm}).eval()
            assert _max_diff(tm(x), reference(x)) <= 1e-5
        config = json.loads((out / "config.json").read_text())
        assert config["hvp"]["weights"] == ("backbone" if flag else "teacher.backbone")
        summary = json.loads((dino_run / "summary.json").read_text())
        assert config["hvp"]["knn"]["top1"] == summary["knn_top1"]
        assert config["hvp"]["images_seen"] == summary["images_seen"] and config["hvp"]["epochs"] == summary["epochs"]
        hvp = run_cfg.hvp  # this run: HVP off, no hvp block
        assert config["hvp"]["hvp_settings"] == (None if hvp is None else hvp.model_dump())

    run_dir, _ = simsiam_run
    out = tmp_path / "narrow"
    assert export.main([str(run_dir), str(out)]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("timm: "))
    assert "width 8 and the CIFAR stem" in line
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"] is None and config["hvp_builder"]["width"] == 8
    narrow = build_method(load_checkpoint(run_dir / "checkpoints" / "last.ckpt"))
    trunk = build_resnet("resnet18", width=8, cifar_stem=True).trunk.eval()
    trunk.load_state_dict(load_file(out / "model.safetensors"), strict=True)
    assert "build_resnet('resnet18', width=8, cifar_stem=True)" in line
    x16 = _fixed_batch(16)
    assert _max_diff(trunk(x16), narrow.eval_backbone(x16)) <= 1e-5


def _folder(out: Path, target, state: dict, size: int) -> Path:
    """What hvp-export writes for ``target``: the weights and timm's fields of config.json."""
    pretrained = {"input_size": [3, size, size], "num_classes": 0}
    config = {"architecture": target.architecture, "num_classes": 0, "model_args": target.model_args}
    export.write_folder(out, state, {**config, "pretrained_cfg": pretrained}, "")
    return out


def test_timm_target_of_timm_family_trunks(tmp_path):
    """backbone=timm (its preset has model_args): the trunk is timm's own model, so its name (tag
    dropped) and model_args rebuild it, img_size where the run set it (the model took it) and a
    ViT's always; a wrong argument is caught by the check of the written folder (local-dir:):
    other keys, the same keys with other features, or a ViT grid timm would resample."""
    import timm

    from hvp_lightning.nn.backbones import Backbone
    from hvp_lightning.schema.backbone import TimmSettings
    from hvp_lightning.training.model_card import TimmTarget, timm_target

    def timm_cfg(name: str, img_size: int | None = 32, **model_args) -> TimmSettings:
        keys = dict(img_size=img_size, drop_path_rate=0.0, init=None, init_student=False, channels_last=False)
        return TimmSettings(name=name, model_args=model_args, **keys)

    vit = timm.create_model(
        "vit_tiny_patch16_224", num_classes=0, img_size=32, patch_size=8, depth=1, dynamic_img_size=True
    )
    cnn = timm.create_model("resnet18", num_classes=0)  # a timm name that is also a preset's
    cases = (
        (timm_cfg("vit_tiny_patch16_224.augreg_in21k", patch_size=8, depth=1), vit, 192, 32),
        (timm_cfg("resnet18", img_size=None), cnn, 512, 32),
    )
    for cfg, trunk, dim, size in cases:
        target = timm_target(cfg, trunk)
        assert target.architecture == cfg.name.split(".")[0]
        backbone = Backbone(trunk, dim).eval()
        state = {k: v.clone() for k, v in trunk.state_dict().items()}
        folder = _folder(tmp_path / cfg.name, target, state, size)
        assert export.check_in_timm(folder, state, backbone, [3, size, size]) <= 1e-5
    assert timm_target(cases[0][0], vit).model_args == dict(patch_size=8, depth=1, img_size=32, dynamic_img_size=True)
    assert timm_target(cases[1][0], cnn).model_args == {}
    wrong = timm_target(timm_cfg("vit_tiny_patch16_224", patch_size=8, depth=2), vit)
    state = dict(vit.state_dict())
    folder = _folder(tmp_path / "wrong", wrong, state, 32)
    with pytest.raises(ConfigError, match=r"missing \['blocks\.1\."):
        export.check_in_timm(folder, state, Backbone(vit, 192), [3, 32, 32])
    max_pool = timm_target(timm_cfg("resnet18", img_size=None, global_pool="max"), cnn)  # same keys, other features
    state = dict(cnn.state_dict())
    folder = _folder(tmp_path / "max", max_pool, state, 64)
    with pytest.raises(ConfigError, match="features differ from the run's"):
        export.check_in_timm(folder, state, Backbone(cnn, 512).eval(), [3, 64, 64])  # 2x2 maps
    vit384 = timm.create_model("vit_tiny_patch16_384", num_classes=0, depth=1, dynamic_img_size=True)
    assert timm_target(timm_cfg("vit_tiny_patch16_384", img_size=None, depth=1), vit384).model_args["img_size"] == 384
    no_size = TimmTarget("vit_tiny_patch16_384", dict(depth=1, dynamic_img_size=True))  # local-dir: a 224 grid
    state = dict(vit384.state_dict())
    folder = _folder(tmp_path / "no_size", no_size, state, 32)
    with pytest.raises(ConfigError, match=r"shapes \(ours vs timm's\) \['pos_embed \(1, 577, 192\) vs \(1, 197, 192\)"):
        export.check_in_timm(folder, state, Backbone(vit384, 192).eval(), [3, 32, 32])


@pytest.mark.parametrize(
    "overrides",
    [
        ["backbone.name=vit_tiny_patch16_224", "backbone.img_size=16", "backbone.model_args={patch_size:8,depth:1}"],
        ["backbone.name=resnet10t", "backbone.img_size=null"],
        ["backbone.name=vit_tiny_patch16_384", "backbone.img_size=null", "backbone.model_args={depth:1}"],
    ],
)
def test_export_of_a_timm_backbone_run(overrides, tmp_path):
    """A backbone=timm run's export: timm rebuilds it from config.json alone and gives the run's
    features (a ViT whose default grid is not 224 px too: config.json records its img_size)."""
    import timm

    cfg = make_cfg("backbone=timm", *overrides, "data.crop_size=16")
    with open_dict(cfg):
        cfg.data.num_classes = 10
    model = build(cfg).eval()
    ckpt = tmp_path / "last.ckpt"
    torch.save(
        {"state_dict": model.state_dict(), "hyper_parameters": {"cfg": OmegaConf.to_container(cfg, resolve=True)}}, ckpt
    )
    assert export.main([str(ckpt), str(tmp_path / "out")]) == 0
    loaded = timm.create_model(f"local-dir:{tmp_path / 'out'}", pretrained=True).eval()
    x = _fixed_batch(16)
    assert _max_diff(loaded(x), model.eval_backbone(x)) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "vit_small", "vit_base"])
def test_full_size_presets_are_timm_architectures(name, tmp_path):
    """The presets at their standard size are timm's resnet50 / vit_{small,base}_patch16_224:
    strict keys and equal features, and the short create_model form (no model_args) gets every
    tensor of the file."""
    import timm
    from safetensors.torch import save_file

    from hvp_lightning.schema.backbone import ResNetSettings, ViTSettings
    from hvp_lightning.training.build import build_backbone
    from hvp_lightning.training.model_card import timm_target

    if name.startswith("resnet"):
        cfg = ResNetSettings(name=name, width=64, cifar_stem=False, channels_last=True, zero_init_residual=False)
    else:
        cfg = ViTSettings(name=name, img_size=224, patch_size=16, drop_path_rate=0.1)
    torch.manual_seed(0)
    backbone = build_backbone(cfg).eval()
    for buf_name, buf in backbone.named_buffers():
        if buf_name.endswith(("running_mean", "running_var")):
            buf.copy_(torch.rand_like(buf) + 0.5)
    target = timm_target(cfg, backbone.trunk)
    assert target.architecture == (name if name.startswith("resnet") else f"{name}_patch16_224")
    state = {k: v.contiguous() for k, v in backbone.trunk.state_dict().items()}
    folder = _folder(tmp_path / "checked", target, state, 224)
    assert export.check_in_timm(folder, state, backbone, [3, 224, 224]) <= 1e-5
    save_file(state, tmp_path / "model.safetensors")
    tm = timm.create_model(
        target.architecture,
        pretrained=True,
        pretrained_cfg_overlay=dict(file=tmp_path / "model.safetensors"),
        num_classes=0,
    ).eval()
    assert set(tm.state_dict()) == set(state)
    x = _fixed_batch(224)[:2]
    with torch.no_grad():
        assert _max_diff(tm(x), backbone(x)) <= 1e-5


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_export_push_uploads_the_folder_only_when_asked(dino_run, tmp_path, monkeypatch, capsys):
    """--push: create_repo(exist_ok=True) then upload_folder of OUT_DIR (HfApi recorded, never
    reached); a failed upload is one line and exit 1, with the folder kept; .pth refuses --push."""
    import huggingface_hub

    calls: list[tuple] = []

    class RecordingApi:
        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", repo_id, kw))
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, **kw):
            calls.append(("upload_folder", kw))
            assert {p.name for p in Path(kw["folder_path"]).iterdir()} == {
                "model.safetensors",
                "config.json",
                "README.md",
            }

    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingApi)
    out = tmp_path / "out"
    assert export.main([str(dino_run), str(out)]) == 0 and calls == []
    assert export.main([str(dino_run), str(out), "--push", "me/hvp-dino", "--overwrite"]) == 0
    assert calls[0] == ("create_repo", "me/hvp-dino", {"exist_ok": True})
    assert calls[1][1]["repo_id"] == "me/hvp-dino" and Path(calls[1][1]["folder_path"]) == out
    assert 'timm.create_model("hf-hub:me/hvp-dino", pretrained=True)' in capsys.readouterr().out
    assert "hf-hub:me/hvp-dino" in (out / "README.md").read_text()

    def refuse(self, **kw):
        raise OSError("401 Client Error: Unauthorized\nmore")

    monkeypatch.setattr(RecordingApi, "upload_folder", refuse)
    assert export.main([str(dino_run), str(tmp_path / "again"), "--push", "me/x"]) == 1
    assert capsys.readouterr().err == "push error: me/x: OSError: 401 Client Error: Unauthorized\n"
    assert (tmp_path / "again" / "model.safetensors").is_file()
    assert export.main([str(dino_run), str(tmp_path / "b.pth"), "--push", "me/x"]) == 2
    assert not (tmp_path / "b.pth").exists()


def test_export_reports_bad_checkpoint(tmp_path, capsys):
    (tmp_path / "x.ckpt").write_bytes(b"not a checkpoint")
    assert export.main([str(tmp_path / "x.ckpt"), str(tmp_path / "out.pth")]) == 2
    assert "truncated or not a PyTorch checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out.pth").exists()


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_eval_loader_workers_are_capped_with_one_warning(simsiam_run, tmp_path, caplog, monkeypatch):
    """num_workers beyond the usable cores: capped for every loader, one warning of ours and
    none of torch's (as in training)."""
    import logging
    import warnings

    import hvp_lightning.evaluation.data as evaluate_module

    cores = len(os.sched_getaffinity(0))
    workers: list[int] = []

    def spy(*args, **kwargs):
        workers.append(kwargs.get("num_workers", 0))
        return DataLoader(*args, **kwargs)

    monkeypatch.setattr(evaluate_module, "DataLoader", spy)
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate(eval_cfg(f"ckpt={simsiam_run[0]}", "protocol=knn", f"num_workers={cores + 3}", f"out_dir={tmp_path}"))
    assert workers and set(workers) == {cores}
    assert [r.getMessage() for r in caplog.records if "CPU cores" in r.getMessage()] == [
        f"data.num_workers={cores + 3} is more than the {cores} CPU cores this process may use: using {cores} "
        "loader workers"
    ]
    assert not [w for w in caught if "worker" in str(w.message)]


@pytest.mark.slow  # exports checked in timm
def test_a_failed_export_check_leaves_an_earlier_export_as_it_was(resnet18_checkpoint, tmp_path, monkeypatch, capsys):
    """The folder is written beside OUT_DIR and checked there: a failed check must not replace
    (or delete) a good export already in OUT_DIR, nor leave the staging folder."""
    _, ckpt = resnet18_checkpoint
    out = tmp_path / "export"
    assert export.main([str(ckpt), str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def fails(*args, **kwargs):
        raise CheckpointError("features differ")

    monkeypatch.setattr(export, "check_in_timm", fails)
    assert export.main([str(ckpt), str(out), "--overwrite"]) != 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


@pytest.mark.slow  # exports checked in timm
def test_an_export_into_a_folder_that_holds_files_is_refused_unless_asked(resnet18_checkpoint, tmp_path, capsys):
    """As hvp-make-shards refuses an OUT that holds shards: an earlier export (or anything else)
    is not replaced without --overwrite, and the refusal comes before the checkpoint is read."""
    _, ckpt = resnet18_checkpoint
    out, pth = tmp_path / "export", tmp_path / "backbone.pth"
    out.mkdir()
    assert export.main([str(ckpt), str(out)]) == 0  # an empty folder is fine
    assert export.main([str(ckpt), str(pth)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert export.main([str(tmp_path / "nowhere.ckpt"), str(out)]) == 2
    assert capsys.readouterr().err == (
        f"config error: OUT_DIR={str(out)!r} already holds files (README.md, config.json, model.safetensors and "
        "1 more): pick an empty folder or remove them, or pass --overwrite\n"
    )
    assert export.main([str(ckpt), str(pth)]) == 2
    assert (
        f"OUT={str(pth)!r} already exists: pick another name or remove it, or pass --overwrite"
        in capsys.readouterr().err
    )
    assert (
        export.main([str(ckpt), str(out), "--overwrite"]) == 0
        and export.main([str(ckpt), str(pth), "--overwrite"]) == 0
    )
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "notes.txt"}.keys() == before.keys()
    assert (out / "notes.txt").read_text() == "mine"  # others stay
