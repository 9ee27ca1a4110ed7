"""The commands behave the same in any user's environment: a machine with SLURM's tools, more CPU
processes than cores, console-script names, and a refused resume that leaves the run dir as it was.
(HYDRA_FULL_ERROR: tests/test_sweep.py; the suite's own fixed environment: tests/conftest.py.)"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from hvp_lightning.cli import hydra_files_subdir
from hvp_lightning.config import validate
from hvp_lightning.warning_filters import silence_known_warnings

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, make_cfg


def fake_srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``srun`` on PATH, as on a machine with SLURM's client tools installed."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")


def srun_hints() -> list[str]:
    """Lightning's SLURM probe (run at every Trainer start and fit) under the run's warning filters."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        silence_known_warnings()
        SLURMEnvironment.detect()
    return [str(w.message) for w in seen if "srun" in str(w.message)]


def test_srun_on_path_is_no_warning_outside_a_slurm_job(tmp_path, monkeypatch):
    fake_srun(tmp_path, monkeypatch)
    assert srun_hints() == []  # a login node or workstation: the run is local by intent
    # Inside an interactive allocation (salloc) Lightning's hint is right: a multi-process run needs srun.
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")
    assert len(srun_hints()) == 1


@pytest.mark.parametrize("devices,warns", [(2, False), ("2", False), (3, True), ("3", True), ("auto", False)])
def test_more_cpu_processes_than_cores_is_said_at_start_up(monkeypatch, caplog, devices, warns):
    monkeypatch.setattr("hvp_lightning.device.usable_cpu_cores", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="hvp_lightning.config"):
        validate(make_cfg(f"trainer.devices={devices}", "trainer.strategy=ddp"))
    said = [r.getMessage() for r in caplog.records if "trainer.devices" in r.getMessage()]
    if warns:
        assert said == [
            f"trainer.devices={devices} starts {devices} CPU processes on 2 usable cores: allowed, but "
            "they share the cores, so each step is slower than with trainer.devices<=2"
        ]
    else:
        assert said == []


def test_gpu_devices_are_not_counted_against_cpu_cores(monkeypatch, caplog):
    monkeypatch.setattr("hvp_lightning.device.usable_cpu_cores", lambda: 2)
    monkeypatch.setattr("hvp_lightning.device.runs_on_cpu", lambda accelerator: False)
    monkeypatch.setattr("hvp_lightning.config.validate_precision", lambda cfg: cfg)  # no GPU here to check
    with caplog.at_level(logging.WARNING, logger="hvp_lightning.config"):
        validate(make_cfg("trainer.devices=8", "trainer.accelerator=gpu", "data.train_size=128"))
    assert not [r for r in caplog.records if "trainer.devices" in r.getMessage()]


@pytest.mark.slow  # a process per console command
def test_console_commands_show_their_own_name_in_usage():
    """``hvp-export --help`` says hvp-export (the console script), ``python -m`` says that; both
    answer before torch is imported."""
    script = Path(sys.executable).parent / "hvp-export"
    if not script.is_file():
        pytest.skip("the project's console scripts are not installed in this environment")
    for command, usage in (
        ([str(script)], "usage: hvp-export "),
        ([sys.executable, "-m", "hvp_lightning.training.export"], "usage: python -m hvp_lightning.training.export "),
    ):
        proc = subprocess.run(
            [*command, "--help"], cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
        )
        assert proc.returncode == 0 and proc.stdout.startswith(usage), proc.stdout + proc.stderr


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_refused_resume_leaves_the_run_dir_untouched(tmp_path):
    """A run killed before its first checkpoint: resume= is refused in one line, and its .hydra/
    files (which Hydra would rewrite before our check runs) keep their bytes."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run / ".hydra" / name).write_text(f"# the first session's {name}\n- seed=3\n")
    (run / "train.log").write_text("[first session]\n")
    before = snapshot(run)
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), f"resume={run}", "trainer.max_epochs=3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"config error: resume='{run}' is not allowed") and "Traceback" not in proc.stderr
    assert snapshot(run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no runs/<date>/ made either


def test_only_a_new_run_gets_hydra_files(tmp_path):
    assert hydra_files_subdir(None, str(tmp_path)) == ".hydra"
    assert hydra_files_subdir(str(tmp_path), str(tmp_path)) is None  # resume=
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert hydra_files_subdir(None, str(tmp_path)) is None  # hydra.run.dir=<a run>: continued automatically
