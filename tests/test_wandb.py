"""W&B: run identity from the config (project, group, tags, name; a sweep's runs share a group), and
what an offline run holds -- metadata, the k-NN chart definitions, the HVP/analysis/k-NN history keys."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.hydra_config import HydraConfig

from hvp_lightning.analysis.monitors import main as monitors_main
from hvp_lightning.run.wandb_logging import current_sweep_dir, run_names, sweep_group
from hvp_lightning.training.driver import build_logger, run

from .conftest import REPO, compose_with_hydra, make_settings, wandb_records, write_tiny_experiment


def test_names_default_to_the_run_dir_and_the_sweep():
    run_dir = Path("multirun/2026-11-21/10-00-00/1_method=simclr,seed=0")
    assert sweep_group("multirun/2026-11-21/10-00-00") == "sweep_2026-11-21_10-00-00"
    assert run_names(None, None, Path("runs/2026-11-21/10-38-59_simsiam"), None) == (None, "10-38-59_simsiam")
    assert run_names(None, None, run_dir, "multirun/2026-11-21/10-00-00") == ("sweep_2026-11-21_10-00-00", run_dir.name)
    assert run_names("mine", "x", run_dir, "multirun/2026-11-21/10-00-00") == ("mine", "x")  # set values win


@pytest.fixture
def multirun_job(tmp_path):
    """This process as job 1 of a Hydra multirun in tmp_path/sweep (what Hydra sets before train.main)."""
    cfg = compose_with_hydra("hydra.mode=MULTIRUN", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    HydraConfig.instance().set_config(cfg)
    yield tmp_path / "sweep"
    HydraConfig.instance().cfg = None


def test_a_sweep_job_logs_to_the_sweep_group(cfg_factory, tmp_path, multirun_job):
    assert current_sweep_dir() == str(multirun_job)
    logger = build_logger(make_settings("logger=wandb"), multirun_job / "1_seed=1")  # wandb.init is lazy: not run here
    assert logger._wandb_init["group"] == f"sweep_{tmp_path.name}_sweep" and logger._wandb_init["name"] == "1_seed=1"


def test_no_group_outside_a_sweep(cfg_factory, tmp_path):
    assert current_sweep_dir() is None
    logger = build_logger(make_settings("logger=wandb"), tmp_path / "10-38-59_simsiam")
    assert logger._wandb_init["group"] is None and logger._wandb_init["name"] == "10-38-59_simsiam"


def test_no_live_gallery_without_wandb_or_without_hvp(cfg_factory):
    from hvp_lightning.analysis.live import LiveGallery, live_gallery_callbacks

    assert live_gallery_callbacks(make_settings("logger=csv", "+hvp=on")) == []
    assert live_gallery_callbacks(make_settings("logger=wandb")) == []  # baseline: nothing is selected
    assert live_gallery_callbacks(make_settings("logger=wandb", "+hvp=on", "logger.gallery_images=0")) == []
    (cb,) = live_gallery_callbacks(make_settings("logger=wandb", "+hvp=on", "logger.gallery_images=2"))
    assert isinstance(cb, LiveGallery) and cb.num_images == 2


def history_rows(records) -> list[dict]:
    """One dict per wandb.log() call."""
    return [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.HasField("history")
    ]


@pytest.mark.slow  # a whole run with an offline W&B run
def test_offline_run_holds_identity_charts_and_hvp_curves(cfg_factory, tmp_path, capsys):
    cfg = cfg_factory(
        "logger=wandb",
        "logger.project=hvp-test",
        "logger.group=ablation",
        "logger.tags=[hvp,n3]",
        "logger.run_name=n3-hard",
        "+hvp=on",
        "hvp.num_views=3",
        "eval.every_n_epochs=1",
        "eval.at_start=true",
        "trainer.log_every_n_steps=1",
    )
    run(cfg, tmp_path)
    records = wandb_records(tmp_path)
    (meta,) = [r.run for r in records if r.HasField("run")]
    assert (meta.project, meta.run_group, list(meta.tags), meta.display_name) == (
        "hvp-test",
        "ablation",
        ["hvp", "n3"],
        "n3-hard",
    )
    config = {u.key: json.loads(u.value_json) for u in meta.config.update}
    assert config["logger"]["group"] == "ablation" and config["hvp"]["num_views"] == 3  # the whole config
    metrics = {m.metric.name or m.metric.glob_name: m.metric for m in records if m.HasField("metric")}
    for key in ("knn/top1", "knn/top5"):  # k-NN curves over epochs, best and last in the summary
        assert metrics[key].step_metric == "knn/epoch" and metrics[key].summary.max and metrics[key].summary.last
    for key in ("monitor/rankme", "monitor/feature_std"):  # the label-free monitors: over the same passes
        assert metrics[key].step_metric == "monitor/epoch" and metrics[key].summary.min and metrics[key].summary.last
    assert metrics["*"].step_metric == "trainer/global_step"  # Lightning's axis for everything else
    rows = history_rows(records)
    keys = set().union(*rows)
    for key in (
        "knn/top1",
        "knn/top5",
        "train/loss_step",
        "hvp/selection_selected_loss_step",
        "hvp/selection_candidate_loss_step",
        "hvp/selection_selected_minus_candidate",
        "hvp/trained_loss_step",
        "analysis/iou_selected_step",
        "analysis/lowest_iou_share_step",
        "trainer/global_step",
    ):
        assert key in keys, key
    assert [r["knn/epoch"] for r in rows if "knn/top1" in r] == [0.0, 1.0]  # at init, after the one epoch
    assert [r["monitor/epoch"] for r in rows if "monitor/rankme" in r] == [0.0, 1.0]
    # hvp-monitors reads a W&B run's passes (its own record: there is no CSV log), as W&B has them
    capsys.readouterr()
    assert not (tmp_path / "csv").exists() and monitors_main([str(tmp_path)]) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    rankme = [r["monitor/rankme"] for r in rows if "monitor/rankme" in r]
    assert [float(r[1]) for r in table] == pytest.approx(rankme, abs=0.006)
    assert [r[4] for r in table] == [f"{100 * r['knn/top1']:.2f}%" for r in rows if "knn/top1" in r]
    # the live gallery: at the pass after the epoch (not at init: nothing selected yet), 4 images and the histogram
    (gallery,) = [r for r in rows if "hvp/gallery/_type" in r]  # W&B flattens the media entries' fields
    assert gallery["hvp/gallery/_type"] == "images/separated" and gallery["hvp/gallery/count"] == 4
    assert len(gallery["hvp/gallery/captions"]) == 4 and "selected views" in gallery["hvp/gallery/captions"][0]
    assert gallery["hvp/iou_histogram/_type"] == "image-file"
    (files,) = tmp_path.glob("wandb/offline-run-*/files/media/images/hvp")
    assert len(list(files.glob("gallery_*.png"))) == 4 and len(list(files.glob("iou_histogram_*.png"))) == 1


@pytest.mark.slow
def test_multirun_jobs_share_a_wandb_group(tmp_path):
    """``train.py -m`` with W&B offline: both jobs in the sweep's group, each named after its dir, and
    the table printed at the end."""
    write_tiny_experiment(tmp_path / "conf")
    sweep = tmp_path / "2026-11-21" / "10-00-00"
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "--config-dir",
            str(tmp_path / "conf"),
            "+experiment=tiny",
            "logger=wandb",
            "logger.mode=offline",
            "seed=0,1",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"sweep summary: {sweep / 'sweep_summary.csv'}" in proc.stdout
    runs = [r.run for d in sorted(sweep.glob("*_*/")) for r in wandb_records(d) if r.HasField("run")]
    assert [r.run_group for r in runs] == ["sweep_2026-11-21_10-00-00"] * 2
    # the swept key first (sweep.job_dir_name), then the fixed overrides as Hydra sorts them
    assert [r.display_name for r in runs] == [
        "0_seed=0,+experiment=tiny,logger.mode=offline,logger=wandb",
        "1_seed=1,+experiment=tiny,logger.mode=offline,logger=wandb",
    ]
    assert len((sweep / "sweep_summary.csv").read_text().splitlines()) == 3
