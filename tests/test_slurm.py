"""The SLURM launcher presets (conf/hydra/launcher/slurm*.yaml): sized from the trainer preset, and
a sweep the cluster cannot run as asked stops in the submitting process before anything is queued
(hvp_lightning/cluster/slurm.py). No cluster needed; tests/test_slurm_cluster.py (-m slurm) submits for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import hvp_lightning.cluster.slurm  # noqa: F401  registers the presets' ${hvp_slurm_*:...} resolvers
from hvp_lightning.cli import train
from hvp_lightning.cluster.slurm import check_fits_partition, check_slurm_job, partition_cpus, slurm_threads
from hvp_lightning.errors import ConfigError

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, compose_with_hydra, run_cli

SIZE_KEYS = ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task", "mem_gb", "max_num_timeout")


def launcher_params(*overrides: str) -> tuple[dict, dict]:
    """The trainer node and the launcher parameters as submitit gets them (resolved, no _target_)."""
    cfg = compose_with_hydra(*overrides)
    return cfg.trainer, {key: OmegaConf.select(cfg, f"hydra.launcher.{key}") for key in SIZE_KEYS}


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "data.num_workers=0"],
            dict(nodes=1, tasks_per_node=2, gpus_per_node=None, cpus_per_task=1),
        ),
        (
            [
                "trainer=ddp",
                "trainer.accelerator=cpu",
                "trainer.devices=1",
                "trainer.num_nodes=2",
                "data.num_workers=3",
            ],
            dict(nodes=2, tasks_per_node=1, gpus_per_node=None, cpus_per_task=4),
        ),
        (["trainer=ddp_8gpu", "trainer.num_nodes=2"], dict(nodes=2, tasks_per_node=8, gpus_per_node=8)),
        (["trainer=gpu"], dict(nodes=1, tasks_per_node=1, gpus_per_node=1)),
        (["trainer=cpu"], dict(nodes=1, tasks_per_node=1, gpus_per_node=None)),
    ],
    ids=["cpu-1x2", "cpu-2x1", "gpu-2x8", "gpu-1", "cpu-1"],
)
def test_slurm_preset_is_sized_from_the_trainer_and_passes_the_check(overrides, expected):
    trainer, params = launcher_params("hydra/launcher=slurm", *overrides)
    assert {key: params[key] for key in expected} == expected
    assert params["mem_gb"] is None  # the partition's default: fits a small CPU partition
    assert params["max_num_timeout"] == 20  # a time limit requeues, like a pre-emption
    check_slurm_job(trainer, params)


def test_slurm_8gpu_preset_keeps_its_sizes_and_requeues_on_time_limits():
    trainer, params = launcher_params("hydra/launcher=slurm_8gpu", "trainer=ddp_8gpu")
    assert params == dict(nodes=1, tasks_per_node=8, gpus_per_node=8, cpus_per_task=8, mem_gb=256, max_num_timeout=20)
    check_slurm_job(trainer, params)


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (
            [
                "hydra/launcher=slurm",
                "trainer=ddp",
                "trainer.accelerator=cpu",
                "trainer.devices=2",
                "hydra.launcher.tasks_per_node=1",
            ],
            ["hydra.launcher.tasks_per_node=1", "trainer.devices=2"],
        ),
        (
            [
                "hydra/launcher=slurm",
                "trainer=ddp",
                "trainer.accelerator=cpu",
                "trainer.num_nodes=2",
                "trainer.devices=1",
                "hydra.launcher.nodes=1",
            ],
            ["hydra.launcher.nodes=1", "trainer.num_nodes=2"],
        ),
        (["hydra/launcher=slurm", "trainer=ddp"], ["trainer.devices='auto'"]),
        (["hydra/launcher=slurm_8gpu", "trainer=ddp"], ["trainer.devices='auto'"]),
        (
            ["hydra/launcher=slurm_8gpu", "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"],
            ["hydra.launcher.gpus_per_node=2", "trainer.accelerator='cpu'"],
        ),
        (
            ["hydra/launcher=slurm", "trainer=cpu", "hydra.launcher.gres=gpu:1"],
            ["hydra.launcher.gres='gpu:1'", "trainer.accelerator='cpu'"],
        ),
    ],
    ids=["tasks-vs-devices", "nodes-vs-num_nodes", "devices-auto", "devices-auto-8gpu", "gpus-on-cpu", "gres-on-cpu"],
)
def test_check_names_the_keys_that_disagree(overrides, keys):
    trainer, params = launcher_params(*overrides)
    params["gres"] = OmegaConf.select(compose_with_hydra(*overrides), "hydra.launcher.gres")
    with pytest.raises(ConfigError) as err:
        check_slurm_job(trainer, params)
    assert all(key in str(err.value) for key in keys), str(err.value)


BAD_SWEEPS = pytest.mark.parametrize(
    "overrides, keys",
    [
        (
            ["trainer.devices=2", "hydra.launcher.tasks_per_node=1"],
            ["hydra.launcher.tasks_per_node=1", "trainer.devices=2"],
        ),
        (["trainer.devices=auto"], ["trainer.devices='auto'"]),
        (
            ["trainer.devices=2", "hydra.launcher.gpus_per_node=2"],
            ["hydra.launcher.gpus_per_node=2", "trainer.accelerator='cpu'"],
        ),
        (["seed=0,1", "trainer.devices=1,auto"], ["trainer.devices='auto'"]),  # the launcher is sized from the base
        (
            ["trainer.devices=2", "trainer.devices=1,2"],
            ["tasks_per_node=2 differs from trainer.devices=1", "(job #0: ", "one sweep per layout"],
        ),
        (  # the default data's auto workers: 4 + 1 CPUs per task, 10 per node, on the stand-in sinfo's 4-CPU nodes
            ["trainer.devices=2", "seed=0,1"],
            ["tasks_per_node=2", "cpus_per_task=5", "10 CPUs per node", "data.num_workers", "2 nodes of 4 CPUs"],
        ),
    ],
    ids=["tasks-vs-devices", "devices-auto", "gpus-on-cpu", "swept-auto", "swept-devices", "cpus-vs-partition"],
)


def _stand_in_slurm(tmp_path: Path) -> dict[str, str]:
    """An ``sbatch`` on PATH that records being called, and a ``sinfo`` for a partition of two
    4-CPU nodes: the environment to run the command in."""
    (tmp_path / "bin").mkdir()
    sbatch = tmp_path / "bin" / "sbatch"
    sbatch.write_text(f"#!/bin/sh\ntouch {tmp_path / 'sbatch_called'}\nexit 1\n")
    sbatch.chmod(0o755)
    fake_sinfo(tmp_path / "bin", "n1 4 debug*\nn2 4 debug*\n")
    return {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}


SLURM_SWEEP = ["-m", "hydra/launcher=slurm", "trainer=ddp", "trainer.accelerator=cpu"]


def _assert_one_line_and_nothing_submitted(code: int, stderr: str, keys: list[str], tmp_path: Path) -> None:
    lines = [line for line in stderr.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]
    assert code == 1 and len(lines) == 1, stderr
    assert lines[0].startswith("config error: ") and lines[0].endswith("nothing was submitted"), lines[0]
    assert all(key in lines[0] for key in keys), lines[0]
    assert not (tmp_path / "sbatch_called").exists()


@BAD_SWEEPS
@pytest.mark.slow  # a sweep through the SLURM launcher's checks, per case
def test_a_bad_slurm_sweep_stops_before_sbatch_with_one_line(tmp_path, monkeypatch, overrides, keys):
    """The command in this process (the subprocess version: slow)."""
    for key, value in _stand_in_slurm(tmp_path).items():
        monkeypatch.setenv(key, value)
    code, _, err = run_cli(train, *SLURM_SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides)
    _assert_one_line_and_nothing_submitted(code, err, keys, tmp_path)


@pytest.mark.slow  # a fresh interpreter per command: ~1 s each
@BAD_SWEEPS
def test_train_m_stops_before_sbatch_with_one_line(tmp_path, overrides, keys):
    """``train.py -m hydra/launcher=slurm`` exactly as a user types it, with an ``sbatch`` on PATH that
    records being called (and a ``sinfo`` for a partition of two 4-CPU nodes): the bad sweep ends with
    exit 1 and one line naming the keys, and sbatch never ran."""
    proc = subprocess.run(
        [sys.executable, "train.py", *SLURM_SWEEP, f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides],
        cwd=REPO,
        env=_stand_in_slurm(tmp_path),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    _assert_one_line_and_nothing_submitted(proc.returncode, proc.stderr, keys, tmp_path)
    assert not (tmp_path / "sbatch_called").exists() and not (tmp_path / "sweep" / ".submitit").exists()


def fake_sinfo(bin_dir: Path, output: str, rc: int = 0) -> None:
    """An ``sinfo`` in ``bin_dir`` printing ``output`` (as ``sinfo -h -N -o "%N %c %P"`` does), exiting ``rc``."""
    (bin_dir / "sinfo.out").write_text(output)
    sinfo = bin_dir / "sinfo"
    sinfo.write_text(f"#!/bin/sh\ncat {bin_dir / 'sinfo.out'}\nexit {rc}\n")
    sinfo.chmod(0o755)


SINFO = "a1 8 cpu*\na2 8 cpu*\ng1 64 gpu\ng2 64 gpu\ng1 64 long\nb1 2 tiny\n"


@pytest.mark.parametrize(
    "partition, rc, expected",
    [
        (None, 0, {"a1": 8, "a2": 8}),  # the default partition: the one sinfo marks with *
        ("gpu", 0, {"g1": 64, "g2": 64}),
        ("gpu,tiny", 0, {"g1": 64, "g2": 64, "b1": 2}),  # sbatch --partition takes a list
        ("nope", 0, None),  # unknown here: SLURM says so itself at sbatch
        (None, 1, None),  # sinfo failing: not checked
    ],
)
def test_partition_cpus_reads_sinfo(tmp_path, monkeypatch, partition, rc, expected):
    fake_sinfo(tmp_path, SINFO, rc)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert partition_cpus(partition) == expected


def test_partition_cpus_without_sinfo_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty dir: no sinfo
    assert partition_cpus(None) is None


@pytest.mark.parametrize(
    "launcher, node_cpus, fits",
    [
        (dict(nodes=1, tasks_per_node=2, cpus_per_task=3), {"n1": 6}, True),  # exactly full
        (dict(nodes=1, tasks_per_node=2, cpus_per_task=3), {"n1": 5, "n2": 5}, False),  # a job never spans nodes' CPUs
        (dict(nodes=2, tasks_per_node=8, cpus_per_task=8), {"g1": 64, "g2": 64, "g3": 32}, True),
        (dict(nodes=2, tasks_per_node=8, cpus_per_task=8), {"g1": 64, "g3": 32}, False),  # one node big enough
        (dict(nodes=3, tasks_per_node=1, cpus_per_task=1), {"n1": 2, "n2": 2}, False),  # more nodes than it has
        (dict(nodes=1, tasks_per_node=1, cpus_per_task=None), {"n1": 1}, True),  # no CPU count: SLURM gives one
        (dict(nodes=9, tasks_per_node=9, cpus_per_task=9), None, True),  # sinfo could not tell: not checked
    ],
)
def test_a_job_must_fit_the_partition_nodes(launcher, node_cpus, fits):
    if fits:
        check_fits_partition(launcher, node_cpus)
        return
    with pytest.raises(ConfigError) as err:
        check_fits_partition({**launcher, "partition": "gpu"}, node_cpus)
    need = launcher["tasks_per_node"] * launcher["cpus_per_task"]
    assert f"{need} CPUs per node" in str(err.value) and "partition 'gpu'" in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "environ, threads",
    [
        ({"SLURM_CPUS_PER_TASK": "3"}, 3),
        ({"SLURM_CPUS_PER_TASK": "3", "OMP_NUM_THREADS": "1"}, None),  # the user's choice wins
        ({}, None),  # not in a SLURM job that asked for CPUs: Lightning's rule
    ],
)
def test_slurm_threads_follow_the_allocation(environ, threads):
    assert slurm_threads(environ) == threads
