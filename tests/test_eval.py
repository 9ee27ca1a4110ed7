"""eval.py (k-NN, linear probe, fine-tuning) and the backbone export, on tiny checkpoints."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.utils.data import DataLoader, TensorDataset

from hvp_lightning.config import ConfigError
from hvp_lightning.evaluation import evaluate
from hvp_lightning.evaluation.features import FeatureNet
from hvp_lightning.evaluation.probe import (
    Classifier,
    fit_classifier,
    lars_growth_bound,
    probe_batch_size,
    warn_if_lars_cannot_fit,
)
from hvp_lightning.nn.backbones import build_resnet, build_vit
from hvp_lightning.nn.knn import knn_accuracies, knn_accuracy
from hvp_lightning.training import export
from hvp_lightning.training.driver import run

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, eval_cfg, make_cfg, write_images

DINO = [
    "method=dino_cifar",
    "backbone=vit_tiny",
    "backbone.patch_size=8",
    "backbone.img_size=32",
    "+backbone.depth=2",
    "data.crop_size=32",
    "data.train_size=32",
    "method.local_crop_size=16",
    "method.out_dim=256",
    "method.head_hidden_dim=64",
    "method.bottleneck_dim=32",
]


@pytest.fixture(scope="module")
def simsiam_run(tmp_path_factory) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("simsiam")
    return run_dir, run(make_cfg("eval.every_n_epochs=1"), run_dir)


@pytest.fixture(scope="module")
def dino_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("dino")
    run(make_cfg(*DINO), run_dir)
    return run_dir


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
    settings = {"optimizer": "sgd", "lr": 0.5, "momentum": 0.9, "weight_decay": 0.0, "epochs": 10}
    model = Classifier(None, 16, 5, settings)
    res = fit_classifier(
        _cpu(),
        model,
        DataLoader(TensorDataset(x_train, y_train), batch_size=50, shuffle=True),
        DataLoader(TensorDataset(x_test, y_test), batch_size=100),
        epochs=10,
    )
    assert res["top1"] >= 0.99 and res["top5"] == 1.0 and res["train_loss"] < 0.1


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
        ["protocol=knn"],
        ["protocol=linear", "protocol.epochs=2", "protocol.batch_size=32", "protocol.augment=true"],
        ["protocol=linear", "protocol.epochs=2", "protocol.batch_size=32", "protocol.augment=false"],
        ["protocol=linear", "protocol.epochs=2"],  # defaults: batch sized to the data, augment auto
        ["protocol=finetune", "protocol.epochs=1", "protocol.batch_size=16", "protocol.base_lr=0.01"],
    ],
    ids=["knn", "linear", "linear-precomputed", "linear-defaults", "finetune"],
)
def test_eval_protocols_end_to_end(simsiam_run, protocol):
    run_dir, train_summary = simsiam_run
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
    }
    m = on_disk["metrics"]
    assert 0 <= m["top1"] <= m["top5"] <= 1 and on_disk["features"] == "backbone" and on_disk["pretrain_epochs"] == 1
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
        want = ("lars", 0.1, 256) if name == "linear" else ("adamw", 0.01, 512)  # SimSiam recipes, scaled down
        assert (s["optimizer"], s["base_lr"], s["lr_ref_batch"]) == want
        assert s["lr"] == pytest.approx(s["base_lr"] * s["batch_size"] / s["lr_ref_batch"])
        if protocol == ["protocol=linear", "protocol.epochs=2"]:
            # 64 images: the recipe's 4,096 halved to 16 (4 steps an epoch); CPU: cached features
            assert s["batch_size"] == 16 and s["augment"] is False


def test_probe_batch_gives_every_epoch_at_least_16_steps():
    for recipe, n in [(4096, 3072), (4096, 50_000), (4096, 1_281_167), (1024, 3072), (4096, 100)]:
        b = probe_batch_size(recipe, n)
        assert 16 <= b <= recipe
        assert b == 16 or n >= 16 * b  # at least 16 optimiser steps an epoch
        assert b == recipe or n < 16 * 2 * b  # and not smaller than that needs
    assert probe_batch_size(4096, 3072) == 128 and probe_batch_size(4096, 1_281_167) == 4096


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

    def settings(optimizer: str, batch: int) -> dict:
        return {"optimizer": optimizer, "batch_size": batch, "lr": 0.1 * batch / 256, "epochs": 90, "momentum": 0.9}

    assert lars_growth_bound(1.6, 90 * 312, 0, 0.9) > math.exp(200)  # ImageNet, batch 4,096
    with caplog.at_level(logging.WARNING, logger="hvp_lightning.evaluation.probe"):
        warn_if_lars_cannot_fit(settings("lars", 4096), 312)
        warn_if_lars_cannot_fit(settings("lars", 512), 98)  # CIFAR-10's 50k images
        warn_if_lars_cannot_fit(settings("sgd", 128), 24)
        assert not caplog.records
        warn_if_lars_cannot_fit(settings("lars", 128), 24)  # 3,072 images (the demo)
    assert len(caplog.records) == 1 and "protocol.optimizer=sgd" in caplog.records[0].getMessage()


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


def test_eval_config_errors(simsiam_run, tmp_path):
    run_dir, _ = simsiam_run
    write_images(tmp_path / "images", 3)
    unlabelled = ["data=images", f"data.root={tmp_path / 'images'}", "data.monitor_size=1"]
    cases = [
        ([f"ckpt={run_dir}", *unlabelled], r"data.eval_root=None is not allowed: a labelled ImageNet-layout folder"),
        ([], r"ckpt='\?\?\?' is not allowed"),
        ([f"ckpt={tmp_path}"], r"ckpt='.*' is not allowed: a run dir with checkpoints/last.ckpt or a .ckpt file"),
        ([f"ckpt={run_dir}", "protocol=linear", "protocol.epochs=0"], r"protocol.epochs=0 is not allowed"),
        (
            [f"ckpt={run_dir}", "protocol=linear", "protocol.optimizer=adam"],
            r"protocol.optimizer='adam' is not allowed",
        ),
        ([f"ckpt={run_dir}", "protocol=knn", "protocol.ks=[0,20]"], r"protocol.ks=\[0, 20\] is not allowed"),
        ([f"ckpt={run_dir}", "protocol=finetune", "protocol.table_row=imagenet"], r"protocol.table_row='imagenet'"),
        ([f"ckpt={run_dir}", "data=cifar10", "data.root=/nonexistent"], r"data.root='/nonexistent' is not allowed"),
        ([f"ckpt={run_dir}", "precision=bf16"], r"precision='bf16' is not allowed: one of 32-true, bf16-mixed"),
        ([f"ckpt={run_dir}", "accelerator=cpu", "precision=16-mixed"], r"precision='16-mixed' is not allowed: on CPU"),
    ]
    for overrides, match in cases:
        with pytest.raises(ConfigError, match=match):
            evaluate(eval_cfg(*overrides))


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


# --- export --------------------------------------------------------------------------------------
def test_export_resnet18_loads_into_torchvision(tmp_path, capsys):
    """Width 64 with the ImageNet stem: the exported file is a torchvision resnet18 state_dict
    without the classifier."""
    import torchvision

    from hvp_lightning.methods import SimSiam

    cfg = make_cfg("backbone=resnet18", "backbone.width=64", "data.crop_size=32")
    with open_dict(cfg):
        cfg.data.num_classes = 10
    model = SimSiam(cfg)
    for name, buf in model.named_buffers():  # non-trivial BatchNorm statistics
        if name.endswith(("running_mean", "running_var")):
            buf.copy_(torch.rand_like(buf) + 0.5)
    ckpt = tmp_path / "last.ckpt"
    torch.save(
        {"state_dict": model.state_dict(), "hyper_parameters": {"cfg": OmegaConf.to_container(cfg, resolve=True)}}, ckpt
    )
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


def test_export_reports_bad_checkpoint(tmp_path, capsys):
    (tmp_path / "x.ckpt").write_bytes(b"not a checkpoint")
    assert export.main([str(tmp_path / "x.ckpt"), str(tmp_path / "out.pth")]) == 2
    assert "truncated or not a PyTorch checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out.pth").exists()


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
