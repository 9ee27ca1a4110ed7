"""train.py end to end through Hydra's compose API, and start-up config validation."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from hvp_lightning.cli import train
from hvp_lightning.config import ConfigError, validate
from hvp_lightning.training.driver import final_line, run

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, build, help_groups, run_cli, tiered, wandb_records, write_images

SUMMARY_KEYS = {"method", "hvp_enabled", "num_classes", "knn_top1", "train_loss", "epochs", "images_seen"}


@pytest.mark.parametrize("hvp", [False, True])
@pytest.mark.slow  # whole runs
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
    # the label-free monitors of a labelled set: on the k-NN pass's test features, at every pass
    assert (summary["monitor_source"], summary["monitor_images"], summary["monitor_dim"]) == ("test", 32, 64)
    assert [h["step"] for h in summary["monitor_history"]] == [h["step"] for h in summary["knn_history"]]
    assert {"monitor/rankme", "monitor/feature_std", "monitor/epoch"} <= set(metrics)
    # What the run cost: model FLOPs from the counted steps and the images trained; perf/* at the
    # log steps (trainer=cpu: every 5 steps), this session's rate and time split.
    cost = on_disk["cost"]
    assert cost["images"] == summary["images_seen"] and cost["selected_images"] == (cost["images"] if hvp else 0)
    per_image = cost["train_flops_per_image"] + cost["selection_flops_per_image"]
    assert cost["total_flops"] == cost["images"] * per_image > 0
    assert (cost["selection_flops_per_image"] > 0) is hvp and cost["baseline_flops_per_image"] > 0
    assert cost["images_per_s"] > 0 and sum(cost["time_split"].values()) == pytest.approx(1) and cost["mfu"] is None
    assert (cost["time_split"]["selection"] > 0) is hvp
    perf = [r for r in csv.DictReader((tmp_path / "csv" / "metrics.csv").open()) if r.get("perf/images_per_s")]
    assert [int(r["step"]) for r in perf] == [4]  # global step 5, Lightning's row 4
    assert float(perf[0]["perf/total_flops"]) == pytest.approx(5 * 16 * per_image, rel=1e-6)
    if hvp:
        h = summary["hvp"]
        assert h["selected_samples"] == 2 * 4 * 16
        assert (
            h["selection_selected_loss_mean"] >= h["selection_candidate_loss_mean"]
        )  # hard = per-sample max over pairs
        assert {"hvp/selection_selected_loss_step", "hvp/selection_candidate_loss_step"} <= set(metrics)
        assert h["nonfinite_candidates"] == 0
        assert "| HVP selected - candidate loss: +" in final_line(summary)  # read from the summary's own keys
        assert "| HVP cost: selection 33% of model FLOPs, step 1.50x the baseline's |" in final_line(summary)  # N=3
        # Every step selects here, so the trained loss is the steps' own train/loss, epoch by epoch
        # (equal batches), and its run mean is the mean of those epoch means.
        rows = list(csv.DictReader((tmp_path / "csv" / "metrics.csv").open()))
        epochs = [
            (float(r["train/loss_epoch"]), float(r["hvp/trained_loss_epoch"]))
            for r in rows
            if r.get("train/loss_epoch")
        ]
        assert len(epochs) == 2 and all(t == pytest.approx(tr, rel=1e-5) for t, tr in epochs)
        assert h["trained_loss_mean"] == pytest.approx(sum(t for t, _ in epochs) / 2, rel=1e-5)
    else:
        assert "hvp" not in summary and "HVP cost" not in final_line(summary)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow  # a run (the choice itself against brute force: tests/selection/)
def test_easy_mode_selects_below_the_candidate_mean(cfg_factory, tmp_path):
    summary = run(cfg_factory("+hvp=on", "hvp.mode=easy", "eval.every_n_epochs=1"), tmp_path)
    assert summary["hvp"]["selection_selected_loss_mean"] <= summary["hvp"]["selection_candidate_loss_mean"]


@pytest.mark.parametrize(
    ("override", "key"),
    tiered(
        [
            ("+hvp=on hvp.every_n_steps=0", "hvp.every_n_steps=0"),
            ("+hvp=on hvp.selection_precision=int8", "hvp.selection_precision='int8'"),
            ("method=dino_cifar +hvp=on hvp.global_pairs=same", "hvp.global_pairs='same'"),
            ("data=imagefolder data.root=/nonexistent/path", "data.root='/nonexistent/path'"),
            ("data=imagefolder", "data.root is not set"),
            ("data=cifar10 data.root=/nonexistent/cifar", "data.root='/nonexistent/cifar'"),
            ("backbone=vit_tiny data.crop_size=20", "data.crop_size=20"),
            ("backbone=resnet18 data.crop_size=16", "data.crop_size=16"),
            ("data.aug.scale=[0.5,0.2]", "data.aug.scale=[0.5, 0.2]"),
            ("data.aug.gray_p=1.5", "data.aug.gray_p=1.5"),
            ("data.aug.interpolation=nearest", "data.aug.interpolation='nearest'"),
            ("method=dino_cifar method.clip_grad_kind=layerwise", "method.clip_grad_kind='layerwise'"),
            ("method=dino_cifar method.clip_grad=-1", "method.clip_grad=-1"),
            ("backbone.zero_init_residual=yes", "backbone.zero_init_residual='yes'"),
            ("+trainer.max_epoch=3", "trainer.max_epoch=3"),
            ("method.batch_size=1", "method.batch_size=1"),
            ("seed=abc", "seed='abc'"),
            ("seed=4294967296", "seed=4294967296"),
            ("+hvp=on +hvp.max_combinations=8", "hvp.max_combinations=8"),
            ("data=images", "data.root=None"),
            ("data=images data.root=/nonexistent/path", "data.root='/nonexistent/path'"),
            ("data=images data.files=/nonexistent/list.txt", "data.files='/nonexistent/list.txt'"),
            ("method=simclr_cifar +hvp=on +hvp.max_combinations=8", "hvp.max_combinations=8"),
        ],
        10,
    ),
)
def test_config_errors_name_key_value_and_allowed(cfg_factory, override, key):
    """(The schema's own rules, one per key, with the same message: tests/test_schema.py.)"""
    with pytest.raises(ConfigError) as err:
        validate(cfg_factory(*override.split()))
    assert str(err.value).startswith(key) and ("allowed" in str(err.value) or "is not set" in str(err.value))


@pytest.mark.parametrize("method", ["simsiam", "simclr", "dino", "ibot"])
def test_declared_hvp_defaults_are_accepted_by_every_method(cfg_factory, method):
    """The schema declares every HVP key (no ``+`` needed); its defaults, including the
    multi-crop-only ones, must not stop any method from starting."""

    backbone = ["backbone=vit_tiny", "backbone.patch_size=8", "backbone.depth=1"] if method == "ibot" else []
    cfg = cfg_factory(f"method={method}_cifar", *backbone, "+hvp=on", "data.crop_size=16")
    assert {"global_pairs", "num_global_candidates", "num_local_candidates", "max_combinations"} <= cfg.hvp.keys()
    validate(cfg)
    assert build(cfg).hvp.global_pairs == "cross"


def test_empty_imagefolder_root_is_rejected(cfg_factory, tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(ConfigError, match="data.root"):
        validate(cfg_factory("data=imagefolder", f"data.root={tmp_path}"))


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "stl10"])
def test_torchvision_root_without_its_files_is_a_config_error(cfg_factory, tmp_path, name):
    (tmp_path / "unrelated.txt").write_text("not a dataset")  # a folder, but not torchvision's layout
    with pytest.raises(
        ConfigError, match=rf"^data.root='{tmp_path}' is not allowed: a folder holding torchvision's {name}"
    ):
        validate(cfg_factory(f"data={name}", f"data.root={tmp_path}"))


def test_imagefolder_without_image_files_is_a_config_error(cfg_factory, tmp_path):
    for split in ("train", "val"):
        (tmp_path / split / "cls").mkdir(parents=True)
        (tmp_path / split / "cls" / "notes.txt").write_text("no images here")
    with pytest.raises(ConfigError, match=r"^data.root=.*\(no image files"):
        validate(cfg_factory("data=imagefolder", f"data.root={tmp_path}"))


def test_images_settings_are_checked_against_the_files(cfg_factory, tmp_path):
    """data=images: root and files exclusive; a list's paths exist and are images; the monitor
    sample leaves images to train on, and is needed without data.eval_root; data.eval_root is
    an ImageNet-layout folder."""
    write_images(tmp_path / "imgs", 6)
    (tmp_path / "list.txt").write_text("imgs/img000.jpg\nimgs/a/img001.jpg\nimgs/missing.jpg\n")
    (tmp_path / "notes.txt").write_text("imgs/img000.jpg\nlist.txt\n")
    root = f"data.root={tmp_path / 'imgs'}"
    cases = [
        ([root, f"data.files={tmp_path / 'list.txt'}"], r"data.root=.*set exactly one of data.root"),
        ([f"data.files={tmp_path / 'list.txt'}"], r"data.files=.*\(1 of 3 are missing, the first: .*missing.jpg"),
        ([f"data.files={tmp_path / 'notes.txt'}"], r"data.files=.*\(1 are not, the first: .*list.txt"),
        ([root, "data.monitor_size=6"], r"data.monitor_size=6 .*fewer than the 6 images"),
        ([root, "data.monitor_size=0"], r"data.monitor_size=0 .*without data.eval_root"),
        ([root, "data.monitor_size=1", f"data.eval_root={tmp_path / 'imgs'}"], r"data.eval_root=.*ImageNet-layout"),
        (
            [f"data.root={tmp_path / 'list.txt'}"],
            r"data.root=.*\(a file, not a folder; a list of paths goes in data.files",
        ),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=f"^{message}"):
            validate(cfg_factory("data=images", *overrides))
    (tmp_path / "list.txt").write_text("# two of them\nimgs/img000.jpg\n\nimgs/a/img001.jpg\n")
    listed = f"data.files={tmp_path / 'list.txt'}"
    cfg = cfg_factory("data=images", listed, "data.monitor_size=1", "data.crop_size=auto")
    with pytest.raises(ConfigError, match=r"^method.batch_size=16 .*the 1 training images .* hold no batch of 2"):
        validate(cfg)  # one image left to train on: no batch fits
    cfg = validate(cfg_factory("data=images", f"data.root={tmp_path / 'imgs'}", "data.monitor_size=1",
                               "data.crop_size=auto", "method.batch_size=4"))  # fmt: skip
    assert (cfg.data.crop_size, cfg.data.eval_crop_ratio) == (20, 1.0)  # from the images' own size


@pytest.mark.slow  # a 2-epoch run on generated JPEGs
def test_tiny_images_run_reports_the_label_free_monitors(cfg_factory, tmp_path):
    """data=images without labels: trains on the images at every depth but the held-out sample,
    skips an unreadable one, and reports RankMe and feature std of the held-out images at init and
    after every epoch (eval.every_n_epochs=5 spaces k-NN passes, and there are none) -- in
    summary.json, the CSV log and the final line."""
    write_images(tmp_path / "imgs", 39)
    (tmp_path / "imgs" / "a" / "broken.jpg").write_bytes(b"not a jpeg")
    images = ["data=images", f"data.root={tmp_path / 'imgs'}", "data.monitor_size=8", "data.crop_size=16"]
    cfg = cfg_factory(*images, "eval.at_start=true", "trainer.max_epochs=2", "eval.every_n_epochs=5")
    summary = run(cfg, tmp_path / "run")
    assert summary["steps"] == 2 * 32 // 16 and summary["images_seen"] == 64  # 40 - 8 held out, batch 16
    assert summary["skipped_files"] == [str(tmp_path / "imgs" / "a" / "broken.jpg")]
    assert summary["knn_top1"] is None and summary["knn_history"] == [] and summary["num_classes"] == 0
    assert (summary["monitor_source"], summary["monitor_images"], summary["monitor_dim"]) == ("monitor", 8, 64)
    history = summary["monitor_history"]
    assert [(h["epoch"], h["images_seen"]) for h in history] == [(0.0, 0), (1.0, 32), (2.0, 64)]
    assert (summary["monitor_rankme_init"], summary["monitor_feature_std_init"]) == (
        history[0]["rankme"],
        history[0]["feature_std"],
    )
    assert 1 <= summary["monitor_rankme"] == history[-1]["rankme"] <= 8 and summary["monitor_feature_std"] > 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["monitor_history"] == history
    rows = list(csv.DictReader((tmp_path / "run" / "csv" / "metrics.csv").open()))
    logged = [float(r["monitor/rankme"]) for r in rows if r.get("monitor/rankme")]
    assert logged == pytest.approx([h["rankme"] for h in history], rel=1e-6)  # logged as float32
    line = final_line(summary)
    assert line.startswith(f"RankMe {summary['monitor_rankme']:.1f} of 8 (at init {history[0]['rankme']:.1f}), ")
    assert "/sqrt(d)" in line and "on 8 held-out images | model FLOPs: " in line and "| run dir: " in line


def test_crop_larger_than_the_images_is_said_once(cfg_factory, caplog):
    with caplog.at_level("WARNING"):
        validate(cfg_factory("data.crop_size=48"))  # generated images are 32 px
    assert [r.getMessage() for r in caplog.records if "upsampled" in r.getMessage()] == [
        "data.crop_size=48 is larger than the images (shorter side 32 px): every crop is upsampled; "
        "set data.crop_size=32 to crop them at their own size"
    ]
    caplog.clear()
    with caplog.at_level("WARNING"):
        validate(cfg_factory("data.crop_size=32"))
    assert "upsampled" not in caplog.text


def test_batch_larger_than_dataset_is_a_config_error(cfg_factory, tmp_path):
    with pytest.raises(ConfigError, match="method.batch_size=128"):
        run(cfg_factory("method.batch_size=128"), tmp_path)


CLI_BAD = [["+hvp=on", "hvp.num_views=1"], ["seed=abc"], ["data=images", "data.root={tmp}/no_images"]]


def _no_images(tmp_path) -> None:
    (tmp_path / "no_images" / "sub").mkdir(parents=True)
    (tmp_path / "no_images" / "sub" / "notes.txt").write_text("not an image")


@pytest.mark.parametrize("bad", CLI_BAD)
def test_a_config_error_is_one_line_and_leaves_no_run_dir(tmp_path, bad):
    """The command in this process: a folder with no images is one of them (the line names the
    key, the folder and which files count as images); nothing is left of the run dir."""
    run_dir = tmp_path / "run"
    bad = [b.format(tmp=tmp_path) for b in bad]
    _no_images(tmp_path)
    code, out, err = run_cli(train, *bad, "logger=csv", f"hydra.run.dir={run_dir}")
    assert code == 2
    assert (out + err).count("config error:") == 1 and "Traceback" not in out + err, (out + err)[-2000:]
    assert len(err.splitlines()) == 1 and f"config error: {bad[-1].split('=')[0]}=" in err
    assert not run_dir.exists()  # no run dir with an empty train.log left behind


@pytest.mark.slow  # a fresh interpreter per command
@pytest.mark.parametrize("bad", CLI_BAD)
def test_cli_reports_config_error_once_in_one_line_and_leaves_no_run_dir(tmp_path, bad):
    """A folder with no images is one of them: the line names the key, the folder and which
    files count as images."""
    run_dir = tmp_path / "run"
    bad = [b.format(tmp=tmp_path) for b in bad]
    _no_images(tmp_path)
    proc = subprocess.run(
        [sys.executable, "train.py", *bad, "logger=csv", f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert out.count("config error:") == 1 and "Traceback" not in out, out[-2000:]
    assert f"config error: {bad[-1].split('=')[0]}=" in proc.stderr
    assert not run_dir.exists()  # no run dir with an empty train.log left behind
    if bad[0] == "data=images":
        assert proc.stderr.strip().splitlines() == [
            f"config error: data.root='{tmp_path}/no_images' is not allowed: a folder holding image files "
            "(.jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp, .gif, any case) "
            "at any depth (none found under it; hidden files and folders do not count)"
        ]


@pytest.mark.slow  # a W&B run (offline)
def test_wandb_offline_run_logs_metrics_and_summary(cfg_factory, tmp_path, monkeypatch):
    """The default logger: W&B in offline mode (no account, no network), finished before the
    run's final line, with HVP statistics and the run summary on it."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    summary = run(
        cfg_factory(
            "logger=wandb", "+hvp=on", "hvp.num_views=3", "eval.every_n_epochs=1", "trainer.log_every_n_steps=1"
        ),
        tmp_path,
    )
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and summary["knn_top1"] is not None
    import wandb

    assert wandb.run is None  # finished by training.driver.run
    # Offline runs keep history and summary in the run's protobuf log; keys are plain strings there.
    wandb_records(tmp_path)  # waits until the W&B service has written the run's exit record
    record = next(runs[0].glob("run-*.wandb")).read_bytes()
    for key in (
        "knn/top1",
        "hvp/selection_selected_loss_step",
        "train/loss_step",
        "summary/knn_top1",
        "summary/hvp_selection_selected_loss_mean",
    ):
        assert key.encode() in record, key


@pytest.mark.slow  # python <script> --help: ~3 s of CPU (Hydra lists the groups)
def test_train_help_lists_every_group_but_eval_s_protocol():
    groups = {str(p.parent.relative_to(REPO / "conf")) for p in (REPO / "conf").rglob("*.yaml")} - {"."}
    groups |= {"hvp", "logger", "data/iou_policy"}  # groups whose only options are the schema's nodes
    assert help_groups("train.py") == {g for g in groups if g.split("/")[0] != "hydra"} - {"protocol"}
