"""train.py end to end through Hydra's compose API, and start-up config validation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hvp_lightning.config import ConfigError, validate
from hvp_lightning.train import run

from .conftest import REPO, wandb_records

SUMMARY_KEYS = {"method", "hvp_enabled", "num_classes", "knn_top1", "train_loss", "epochs", "images_seen"}


@pytest.mark.parametrize("hvp", [False, True])
def test_tiny_train_run(cfg_factory, tmp_path, hvp, capsys):
    overrides = ["+hvp=on", "hvp.num_views=3"] if hvp else ["eval.at_start=true"]
    summary = run(cfg_factory(*overrides, "trainer.max_epochs=2", "eval.every_n_epochs=1"), tmp_path)
    out = capsys.readouterr().out
    assert out.count("device: cpu (") == 1 and "| precision: 32-true" in out  # the start-up line
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert SUMMARY_KEYS <= on_disk.keys() and on_disk["hvp_enabled"] is hvp
    assert summary["epochs"] == 2 and summary["images_seen"] == 2 * 4 * 16  # 64 images / batch 16, drop_last
    assert 0 <= summary["knn_top1"] <= 1 and summary["num_classes"] == 10
    assert summary["train_loss"] is not None
    assert (summary["knn_top1_init"] is None) is hvp  # the random-init reference when asked for
    metrics = (tmp_path / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "knn/top1" in metrics and "train/loss_step" in metrics
    if hvp:
        h = summary["hvp"]
        assert h["selected_samples"] == 2 * 4 * 16
        assert h["selected_loss_mean"] >= h["candidate_loss_mean"]  # hard = per-sample max over pairs
        assert {"hvp/selected_loss_step", "hvp/candidate_loss_step"} <= set(metrics)
    else:
        assert "hvp" not in summary
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_easy_mode_selects_below_the_candidate_mean(cfg_factory, tmp_path):
    summary = run(cfg_factory("+hvp=on", "hvp.mode=easy", "eval.every_n_epochs=1"), tmp_path)
    assert summary["hvp"]["selected_loss_mean"] <= summary["hvp"]["candidate_loss_mean"]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("+hvp=on hvp.num_views=1", "hvp.num_views=1"),
        ("+hvp=on hvp.mode=hardest", "hvp.mode='hardest'"),
        ("+hvp=on hvp.every_n_steps=0", "hvp.every_n_steps=0"),
        ("+hvp=on hvp.selection_precision=int8", "hvp.selection_precision='int8'"),
        ("method.name=byol", "method.name='byol'"),
        ("backbone.name=resnet7", "backbone.name='resnet7'"),
        ("data.name=mnist", "data.name='mnist'"),
        ("data=imagefolder data.root=/nonexistent/path", "data.root='/nonexistent/path'"),
        ("data=imagefolder", "data.root='???'"),
        ("data=cifar10 data.root=/nonexistent/cifar", "data.root='/nonexistent/cifar'"),
        ("backbone=vit_tiny data.crop_size=20", "data.crop_size=20"),
        ("backbone=resnet18 data.crop_size=16", "data.crop_size=16"),
        ("data.aug.scale=[0.5,0.2]", "data.aug.scale=[0.5, 0.2]"),
        ("data.aug.gray_p=1.5", "data.aug.gray_p=1.5"),
        ("+trainer.max_epoch=3", "trainer.max_epoch=3"),
        ("method.batch_size=1", "method.batch_size=1"),
    ],
)
def test_config_errors_name_key_value_and_allowed(cfg_factory, override, key):
    with pytest.raises(ConfigError) as err:
        validate(cfg_factory(*override.split()))
    assert str(err.value).startswith(key) and "allowed" in str(err.value)


def test_empty_imagefolder_root_is_rejected(cfg_factory, tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(ConfigError, match="data.root"):
        validate(cfg_factory("data=imagefolder", f"data.root={tmp_path}"))


def test_batch_larger_than_dataset_is_a_config_error(cfg_factory, tmp_path):
    with pytest.raises(ConfigError, match="method.batch_size=128"):
        run(cfg_factory("method.batch_size=128"), tmp_path)


def test_cli_reports_config_error_in_one_line_without_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "train.py", "+hvp=on", "hvp.num_views=1", "logger=csv", f"hydra.run.dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "config error: hvp.num_views=1 is not allowed: expected an integer >= 2" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_wandb_offline_run_logs_metrics_and_summary(cfg_factory, tmp_path, monkeypatch):
    """The default logger: W&B in offline mode (no account, no network), finished before the
    run's final line, with HVP statistics and the run summary on it."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    summary = run(cfg_factory("logger=wandb", "+hvp=on", "hvp.num_views=3", "eval.every_n_epochs=1",
                              "trainer.log_every_n_steps=1"), tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and summary["knn_top1"] is not None
    import wandb

    assert wandb.run is None  # finished by train.run
    # Offline runs keep history and summary in the run's protobuf log; keys are plain strings there.
    wandb_records(tmp_path)  # waits until the W&B service has written the run's exit record
    record = next(runs[0].glob("run-*.wandb")).read_bytes()
    for key in ("knn/top1", "hvp/selected_loss_step", "train/loss_step", "summary/knn_top1",
                "summary/hvp_selected_loss_mean"):
        assert key.encode() in record, key
