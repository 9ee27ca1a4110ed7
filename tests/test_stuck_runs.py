"""A run never waits forever (hvp_lightning/cluster/waits.py): a rank stopped mid-training fails the run
after ``limits.wait_s`` with an error that says who waited for what, and a SIGTERM or Ctrl-C to a
rank stuck in a collective ends it after ``limits.stop_grace_s``. Either way every process of the
run is gone afterwards and the last checkpoint is intact.

Two CPU processes (gloo) started by Lightning's launcher, rank 1 stopped with SIGSTOP at a known
step (tests/_stall_job.py); the run is its own session, so "every process of the run" is its
process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, living_session

pytestmark = (
    pytest.mark.serial
)  # its slow tests start processes of their own and time them: run one at a time (.ci/run)

STALL_AT = 3  # rank 1 stops before the batch after step 3; step 2's checkpoint is the last one
RUN = [
    "logger=csv",
    "trainer=ddp",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "method=simsiam_cifar",
    "backbone.width=8",
    "method.proj_hidden_dim=64",
    "method.proj_dim=32",
    "data.train_size=256",
    "data.test_size=32",
    "data.crop_size=16",
    "data.num_workers=1",
    "method.batch_size=16",
    "trainer.max_epochs=1",
    "eval.at_start=false",
    "checkpoint.every_n_steps=2",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
]


def _start(run_dir: Path, marker: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, STALL_AT_STEP=str(STALL_AT), STALL_RANK="1", STALL_MARKER=str(marker))
    return subprocess.Popen(
        [sys.executable, "-m", "tests._stall_job", *RUN, *extra, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_stall(proc: subprocess.Popen, marker: Path) -> int:
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate()[1][-3000:]
    time.sleep(0.2)
    return int(marker.read_text())


def _assert_all_gone_and_checkpoint_intact(proc: subprocess.Popen, run_dir: Path) -> None:
    deadline = time.monotonic() + 15  # loader workers notice their server's end within 5 s
    while living_session(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not living_session(proc.pid), f"left behind: {living_session(proc.pid)}"
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == 2


@pytest.mark.slow  # a 2-process run that waits out its limit
def test_a_stopped_rank_fails_the_run_after_the_wait_limit(tmp_path):
    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    # The limit is also the rendezvous's: 40 s failed there (rank 1 timed out connecting to rank 0's
    # store) on a 2-core machine at load 8; 90 s leaves room and keeps the test inside minutes.
    wait_s = 90
    proc = _start(run_dir, marker, f"limits.wait_s={wait_s}")
    _wait_for_stall(proc, marker)
    stalled = time.monotonic()
    out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    took = time.monotonic() - stalled
    assert proc.returncode not in (0, None), err[-3000:]
    assert f"rank 0 waited more than {wait_s} s (limits.wait_s) for the other ranks in a collective" in err, err[-3000:]
    assert wait_s - 5 < took < wait_s + 60, took
    _assert_all_gone_and_checkpoint_intact(proc, run_dir)


@pytest.mark.slow  # a 2-process run
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_a_run_stuck_in_a_collective(tmp_path, signum):
    """Rank 0 waits in a collective for the stopped rank 1, where no Python handler runs: the
    signal still ends the run within ``limits.stop_grace_s`` (+ a few seconds)."""
    run_dir, marker = tmp_path / "run", tmp_path / "marker"
    grace = 10
    proc = _start(run_dir, marker, "limits.wait_s=600", f"limits.stop_grace_s={grace}")
    _wait_for_stall(proc, marker)
    time.sleep(3)  # rank 0 reaches its gradient all-reduce
    sent = time.monotonic()
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signum, err[-3000:]
    assert f"{signum.name} came {grace} s ago (limits.stop_grace_s)" in err, err[-3000:]
    assert took < grace + 20, took
    _assert_all_gone_and_checkpoint_intact(proc, run_dir)
