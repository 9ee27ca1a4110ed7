"""Hydra sweeps: the sweep_summary.csv table (pure function, callback, a real ``train.py -m``) and
the SLURM launcher config (composed and rendered to an sbatch script, never submitted)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.utils import JobReturn, JobStatus
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from hvp_lightning.cluster.sweep import (
    DIRNAME_MAX_BYTES,
    FILENAME,
    RESULT_COLUMNS,
    Job,
    SweepSummary,
    job_dir_name,
    main,
    read_jobs,
    sweep_csv,
    write_sweep_summary,
)
from hvp_lightning.config import ConfigError

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, compose_with_hydra, write_tiny_experiment

HVP_SUMMARY = {
    "method": "simsiam",
    "hvp_enabled": True,
    "knn_top1": 0.5,
    "knn_top1_init": 0.3,
    "knn_top5": 0.9,
    "monitor_rankme": 41.5,
    "monitor_feature_std": 0.03,
    "monitor_collapse_epoch": None,
    "wall_time_s": 12.5,
    "hvp": {
        "mode": "hard",
        "num_views": 4,
        "every_n_steps": 1,
        "selection_selected_loss_mean": -0.5,
        "selection_candidate_loss_mean": -0.7,
        "trained_loss_mean": -0.45,
        "nonfinite_candidates": 0,
    },
}
BASE_SUMMARY = {
    "method": "simclr",
    "hvp_enabled": False,
    "knn_top1": 0.4,
    "knn_top1_init": None,
    "knn_top5": 0.8,
    "wall_time_s": 9.0,
}


def rows_of(text: str) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    return list(reader.fieldnames or []), list(reader)


def test_sweep_csv_has_a_column_per_override_key_then_the_results():
    text = sweep_csv(
        [
            Job("m/0_a", ["method=simsiam", "+hvp=on", "seed=0"], HVP_SUMMARY),
            Job("m/1_b", ["method=simclr", "seed=1", "data.root=/x=y"], BASE_SUMMARY),
            Job("m/2_c", ["method=simsiam", "+hvp=on", "seed=2"], None, "ConfigError: hvp.num_views=1 is not allowed"),
        ]
    )
    columns, rows = rows_of(text)
    assert columns == ["method", "hvp", "seed", "data.root", *RESULT_COLUMNS]
    hvp, base, failed = rows
    assert hvp["hvp"] == "on" and hvp["overrides"] == "method=simsiam +hvp=on seed=0"
    assert (hvp["knn_top1"], hvp["knn_top1_init"], hvp["knn_top5"], hvp["wall_time_s"]) == ("0.5", "0.3", "0.9", "12.5")
    assert (hvp["monitor_rankme"], hvp["monitor_feature_std"], hvp["monitor_collapse_epoch"]) == ("41.5", "0.03", "")
    assert base["monitor_rankme"] == ""  # a summary from before the monitors
    assert (hvp["hvp_mode"], hvp["hvp_num_views"], hvp["hvp_every_n_steps"]) == ("hard", "4", "1")
    assert (hvp["hvp_selection_selected_loss_mean"], hvp["hvp_selection_candidate_loss_mean"]) == ("-0.5", "-0.7")
    assert (hvp["hvp_trained_loss_mean"], hvp["hvp_nonfinite_candidates"]) == ("-0.45", "0")
    assert hvp["status"] == "ok" and hvp["error"] == "" and hvp["run_dir"] == "m/0_a"
    assert base["hvp"] == "" and base["data.root"] == "/x=y"  # the value is everything after the first '='
    assert base["hvp_mode"] == "off" and base["hvp_num_views"] == "" and base["knn_top1_init"] == ""
    assert failed["status"] == "failed" and failed["knn_top1"] == "" and failed["hvp_mode"] == ""
    assert failed["error"] == "ConfigError: hvp.num_views=1 is not allowed" and failed["seed"] == "2"


def fake_job(sweep_dir: Path, name: str, overrides: list[str], summary: dict | None) -> Path:
    run_dir = sweep_dir / name
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_table_is_built_from_the_job_dirs_in_job_order(tmp_path):
    for num in (10, 2, 1):  # 10_ sorts after 2_: natural order, not string order
        fake_job(tmp_path, f"{num}_seed={num}", [f"seed={num}"], HVP_SUMMARY if num != 2 else None)
    (tmp_path / ".submitit" / "123").mkdir(parents=True)  # launcher files are no job
    jobs = read_jobs(tmp_path)
    assert [Path(j.run_dir).name for j in jobs] == ["1_seed=1", "2_seed=2", "10_seed=10"]
    assert jobs[1].summary is None and jobs[0].summary == HVP_SUMMARY
    path = write_sweep_summary(tmp_path)
    assert path == tmp_path / FILENAME and not list(tmp_path.glob(".*.tmp-*"))
    _, rows = rows_of(path.read_text())
    assert [(r["seed"], r["status"]) for r in rows] == [("1", "ok"), ("2", "failed"), ("10", "ok")]


def test_job_dir_name_is_one_short_path_component():
    assert job_dir_name(["seed=0", "data.root=/a/b"], argv=[]) == "data.root=_a_b,seed=0"
    long = job_dir_name([f"method.optimizer.key{i}=value{i}" for i in range(20)], argv=[])
    assert len(long.encode()) == DIRNAME_MAX_BYTES and "/" not in long
    resolved = OmegaConf.create({"o": ["x=a/b"], "d": "${hvp_dirname:${o}}"}).d  # hydra.sweep.subdir's resolver
    assert resolved.endswith("x=a_b")


def test_job_dir_name_puts_the_swept_keys_first():
    """``-m method=simsiam,simclr seed=0,1`` plus many fixed keys: the cut name still shows what
    differs between the jobs, in the command line's order; flags and unparsable argv are ignored."""
    argv = [
        "-m",
        "--config-dir",
        "c",
        "data.train_size=64",
        "seed=0,1",
        "method=simsiam,simclr",
        "+hvp=on",
        *(f"data.key{i}=v{i}" for i in range(20)),
    ]
    job = ["data.train_size=64", "seed=1", "method=simclr", "+hvp=on", *(f"data.key{i}=v{i}" for i in range(20))]
    name = job_dir_name(job, argv=argv)
    assert name.startswith("seed=1,method=simclr,+hvp=on,data.key0=v0,") and len(name.encode()) == DIRNAME_MAX_BYTES
    assert job_dir_name(job, argv=["-m", "not an override", "x=(("]).startswith("+hvp=on,data.key0=v0")


def job_config(sweep_dir: Path, run_dir: Path, mode: str = "MULTIRUN"):
    cfg = compose_with_hydra("logger=csv", f"hydra.sweep.dir={sweep_dir}", f"hydra.mode={mode}")
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
    return cfg


def test_callback_writes_the_table_after_each_job_and_at_the_end(tmp_path, capsys, monkeypatch):
    assert (
        "SweepSummary" in compose_with_hydra().hydra.callbacks.sweep_summary._target_
    )  # configured in conf/config.yaml
    ok = fake_job(tmp_path, "0_seed=0", ["seed=0"], HVP_SUMMARY)
    bad = fake_job(tmp_path, "1_seed=1", ["seed=1"], None)
    failed = JobReturn(status=JobStatus.FAILED, _return_value=ConfigError("hvp.num_views=1 is not allowed:\n x"))
    callback = SweepSummary()
    callback.on_job_end(job_config(tmp_path, bad, mode="RUN"), failed)  # a single run: no table
    monkeypatch.setenv("SLURM_PROCID", "3")
    callback.on_job_end(job_config(tmp_path, bad), failed)  # not the job's rank 0: no table
    assert not (tmp_path / FILENAME).exists()
    monkeypatch.setenv("SLURM_PROCID", "0")
    callback.on_job_end(job_config(tmp_path, bad), failed)  # what a sweep whose job raised leaves
    assert (bad / "error.txt").read_text() == "ConfigError: hvp.num_views=1 is not allowed: x\n"
    _, rows = rows_of((tmp_path / FILENAME).read_text())
    assert [(r["status"], r["error"]) for r in rows] == [
        ("ok", ""),
        ("failed", "ConfigError: hvp.num_views=1 is not allowed: x"),
    ]
    callback.on_multirun_end(job_config(tmp_path, ok))
    assert capsys.readouterr().out.strip() == f"sweep summary: {tmp_path / FILENAME}"


def test_cli_rebuilds_the_table(tmp_path):
    fake_job(tmp_path, "0_seed=0", ["seed=0"], HVP_SUMMARY)
    proc = subprocess.run(
        [sys.executable, "-m", "hvp_lightning.cluster.sweep", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == str(tmp_path / FILENAME)


def test_cli_refuses_what_is_no_sweep_dir(tmp_path, capsys):
    """A mistyped path used to be made, with a header-only table; a run dir got a one-row table."""
    run_dir = fake_job(tmp_path, "run", ["seed=0"], HVP_SUMMARY)
    (tmp_path / "empty").mkdir()
    for path, why in [
        (tmp_path / "nowhere", "no such folder"),
        (run_dir, "it is a single run dir"),
        (tmp_path / "empty", "it holds no job subfolder"),
    ]:
        assert main([str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"hvp-sweep-summary: {path} is not a sweep dir ({why}") and "train.py -m" in err
        assert not (path / FILENAME).exists()
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / FILENAME).exists()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "one row per job" in capsys.readouterr().out


def test_slurm_launcher_renders_one_task_per_gpu(tmp_path, monkeypatch):
    """hydra/launcher=slurm_8gpu with trainer=ddp_8gpu: the submitit launcher's parameters and the
    sbatch script it would submit (a stand-in srun on PATH; map_array captures instead of submitting)."""
    import submitit

    cfg = compose_with_hydra(
        "hydra/launcher=slurm_8gpu", "trainer=ddp_8gpu", "trainer.num_nodes=2", f"hydra.sweep.dir={tmp_path / 'sweep'}"
    )
    launcher_cfg = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher_cfg["_target_"] == "hydra_plugins.hvp_lightning_launcher.CheckedSlurmLauncher"
    assert (launcher_cfg["gpus_per_node"], launcher_cfg["tasks_per_node"], launcher_cfg["nodes"]) == (8, 8, 2)
    assert launcher_cfg["timeout_min"] > 0 and launcher_cfg["cpus_per_task"] > 0 and launcher_cfg["mem_gb"] > 0
    assert launcher_cfg["partition"] is None and launcher_cfg["account"] is None
    launcher = instantiate(cfg.hydra.launcher)
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.types import HydraContext

    loader = ConfigLoaderImpl(config_search_path=create_config_search_path(str(REPO / "conf")))  # checks the jobs
    launcher.setup(
        hydra_context=HydraContext(config_loader=loader, callbacks=Callbacks()), task_function=None, config=cfg
    )

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    # The partition the launcher checks the job against (sinfo -h -N -o "%N %c %P"): two 64-CPU nodes.
    (tmp_path / "bin" / "sinfo").write_text("#!/bin/sh\nprintf 'g1 64 gpu*\\ng2 64 gpu*\\n'\n")
    (tmp_path / "bin" / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    scripts: list[str] = []

    def capture(executor, fn, *args):
        scripts.append(executor._executor._make_submission_file_text("python -m submitit.core._submit", "0"))
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", capture)
    fixed = ["hydra/launcher=slurm_8gpu", "trainer=ddp_8gpu", "trainer.num_nodes=2"]  # as Hydra's sweeper passes them
    assert launcher.launch([[*fixed, "seed=0"], [*fixed, "seed=1"]], initial_job_idx=0) == []
    sbatch = scripts[0]
    for line in (
        "--nodes=2",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
        f"--cpus-per-task={launcher_cfg['cpus_per_task']}",
        f"--time={launcher_cfg['timeout_min']}",
        f"--mem={launcher_cfg['mem_gb']}GB",
    ):
        assert f"#SBATCH {line}\n" in sbatch, line
    assert "--partition" not in sbatch and "--account" not in sbatch
    assert f"{tmp_path / 'sweep'}/.submitit/" in sbatch  # logs beside the jobs' dirs


@pytest.mark.slow  # train.py -m in a subprocess: two tiny jobs
@pytest.mark.parametrize("full_error", [None, "1"], ids=["plain", "HYDRA_FULL_ERROR=1"])
def test_multirun_writes_one_row_per_job_and_a_failed_job_says_so(tmp_path, full_error):
    """``train.py -m`` with two jobs, one of which stops on a config error: two job dirs, and the
    table (written after each job: Hydra skips on_multirun_end when a job raised) has both rows.
    The sweep ends alike with HYDRA_FULL_ERROR=1 (Hydra then re-raises instead of printing), and on
    a machine with SLURM's srun on PATH no hint about it is printed."""
    write_tiny_experiment(tmp_path / "conf")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    if full_error:
        env["HYDRA_FULL_ERROR"] = full_error
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "--config-dir",
            str(tmp_path / "conf"),
            "+experiment=tiny",
            "logger=csv",
            "+hvp=on",
            "hvp.num_views=3,1",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]  # Hydra reports the failed job after the sweep
    said = [line for line in proc.stderr.splitlines() if "hvp.num_views=1 is not allowed" in line]
    assert said == ["config error: hvp.num_views=1 is not allowed: an integer >= 2"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "srun" not in proc.stderr
    dirs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert dirs == [
        "0_hvp.num_views=3,+experiment=tiny,+hvp=on,logger=csv",  # the swept key first
        "1_hvp.num_views=1,+experiment=tiny,+hvp=on,logger=csv",
    ]
    columns, rows = rows_of((sweep / FILENAME).read_text())
    assert columns == ["experiment", "logger", "hvp", "hvp.num_views", *RESULT_COLUMNS]
    ok, failed = rows
    summary = json.loads((sweep / dirs[0] / "summary.json").read_text())
    assert ok["status"] == "ok" and ok["hvp.num_views"] == "3" and float(ok["knn_top1"]) == summary["knn_top1"]
    assert (ok["hvp_mode"], ok["hvp_num_views"]) == ("hard", "3") and float(ok["hvp_selection_selected_loss_mean"]) > -2
    assert float(ok["wall_time_s"]) > 0 and ok["run_dir"] == str(sweep / dirs[0])
    assert failed["status"] == "failed" and failed["hvp.num_views"] == "1" and failed["knn_top1"] == ""
    assert failed["error"].startswith("ConfigError: hvp.num_views=1 is not allowed")


@pytest.mark.slow  # train.py -m in a subprocess: four tiny jobs
def test_multirun_over_new_methods_fills_the_table(tmp_path):
    """``train.py -m method=byol_cifar,mocov3_cifar,vicreg_cifar,barlow_twins_cifar +hvp=on``: a row
    per method with its results and HVP's statistics (the table needs nothing method-specific;
    this checks the new methods give it all)."""
    methods = ("byol_cifar", "mocov3_cifar", "vicreg_cifar", "barlow_twins_cifar")
    write_tiny_experiment(tmp_path / "conf")
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "--config-dir",
            str(tmp_path / "conf"),
            f"method={','.join(methods)}",
            "+experiment=tiny",
            "logger=csv",
            "+hvp=on",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    columns, rows = rows_of((sweep / FILENAME).read_text())
    assert columns[:2] == ["method", "experiment"] and [r["method"] for r in rows] == list(methods)
    for row in rows:
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert summary["method"] == row["method"].removesuffix("_cifar") and row["status"] == "ok"
        assert float(row["knn_top1"]) == summary["knn_top1"] and row["hvp_mode"] == "hard"
        assert float(row["hvp_selection_selected_loss_mean"]) >= float(row["hvp_selection_candidate_loss_mean"])
