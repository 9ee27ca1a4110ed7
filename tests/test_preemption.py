"""Pre-emption (SLURM's USR2 warning): the run checkpoints at the step it was in, hands over to the
handler that was there before (submitit's, which requeues), and the continuation ends bit for bit
where the uninterrupted run ends, with one row per step in metrics.csv and both sessions counted.

DINO with HVP: an EMA teacher, centres and HVP's run totals are updated at the end of each step,
so a checkpoint taken before those updates (in a callback's ``on_train_batch_end``) would lose one.
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hvp_lightning.methods.base import SSLMethod
from hvp_lightning.run.job_signals import preempt_signal
from hvp_lightning.run.records import read_record
from hvp_lightning.training.driver import run
from hvp_lightning.training.preemption import StopOnSignal, cluster_plugins

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, assert_same_reported_run, living_session, make_cfg

pytestmark = (
    pytest.mark.serial
)  # its slow tests start processes of their own and time them: run one at a time (.ci/run)

VIT = [
    "method=dino_cifar",
    "backbone=vit_tiny",
    "backbone.patch_size=4",
    "backbone.img_size=16",
    "backbone.depth=1",
    "backbone.drop_path_rate=0.0",
    "data.crop_size=16",
    "method.local_crop_size=8",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
]
# train.py overrides (run in a subprocess, and in this process with make_cfg(..., tiny=False)).
RUN = [
    "logger=csv",
    "trainer=cpu",
    *VIT,
    "+hvp=on",
    "hvp.num_views=3",
    "data.train_size=64",
    "data.test_size=32",
    "data.num_workers=0",
    "method.batch_size=16",
    "trainer.max_epochs=2",
    "eval.at_start=false",
    "eval.every_n_epochs=2",
    "checkpoint.every_n_epochs=null",
    "trainer.log_every_n_steps=1",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
    "+trainer.deterministic=true",
]
STEPS_PER_EPOCH = 4  # 64 images, batch 16
MID = 5  # the signal comes during the step from global step 5 to 6: epoch 2's second batch


def _ckpt(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def _rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "csv" / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _per_column_steps(run_dir: Path) -> dict[str, list[int]]:
    """metrics.csv: for every column, the steps of the rows that hold a value for it (in file order)."""
    rows = _rows(run_dir)
    return {k: [int(r["step"]) for r in rows if r[k]] for k in rows[0] if k != "step"}


def _assert_same_run(resumed: Path, straight: Path) -> None:
    a, b = _ckpt(straight), _ckpt(resumed)
    assert a["global_step"] == b["global_step"] == 2 * STEPS_PER_EPOCH
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert any(k.startswith("teacher.") for k in a["state_dict"])
    unequal = [k for k in a["state_dict"] if not torch.equal(a["state_dict"][k], b["state_dict"][k])]
    assert not unequal, f"not bit for bit: {unequal[:5]}"
    # every step's row exactly once, the columns as in the uninterrupted run's log
    steps = _per_column_steps(resumed)
    assert steps == _per_column_steps(straight)
    assert steps["train/loss_step"] == list(range(2 * STEPS_PER_EPOCH))
    assert_same_reported_run(resumed, straight)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight")
    run(make_cfg(*RUN, tiny=False), run_dir)
    return run_dir


@pytest.mark.slow  # a train.py subprocess: 20-40 s on a small shared machine (the in-process tests below stay)
def test_usr2_mid_step_checkpoints_that_step_and_the_continuation_is_the_same_run(straight, tmp_path):
    """SIGUSR2 from outside in the middle of a step, no handler installed before (a local run): the
    step is finished, last.ckpt is written at it, the process exits with 128 + USR2. Run again in
    the same run dir (what the requeued job does), the run ends bit for bit as the uninterrupted one."""
    run_dir, marker = tmp_path / "preempted", tmp_path / "marker"
    env = dict(os.environ, PREEMPT_AT_STEP=str(MID), PREEMPT_MARKER=str(marker))
    command = [sys.executable, "-m", "tests._preempt_job", *RUN, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1][-3000:]
    os.kill(int(marker.read_text()), signal.SIGUSR2)
    out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 128 + signal.SIGUSR2, err[-3000:]
    assert f"SIGUSR2: stopped after step {MID + 1} with checkpoint" in out + err  # Hydra logs to stdout
    ckpt = _ckpt(run_dir)
    assert ckpt["global_step"] == MID + 1 and ckpt["epoch"] == 1  # mid-epoch: epoch 2 (0-based 1), 2 of 4 batches
    assert not (run_dir / "summary.json").exists()
    assert [int(r["step"]) for r in _rows(run_dir) if r["train/loss_step"]] == list(range(MID + 1))

    summary = run(make_cfg(*RUN, tiny=False), run_dir)  # the requeued job: same command, same run dir
    _assert_same_run(run_dir, straight)
    sessions = read_record(run_dir)["sessions_s"]
    assert len(sessions) == 2 and all(s > 0 for s in sessions)
    assert summary["wall_time_s"] == pytest.approx(sum(sessions), abs=0.5)
    assert summary["steps"] == 2 * STEPS_PER_EPOCH


@pytest.mark.slow  # a run stopped by SIGUSR2 and its continuation each, against a straight run
@pytest.mark.parametrize("at", [MID, STEPS_PER_EPOCH - 1])
def test_the_previous_handler_runs_after_the_checkpoint(straight, tmp_path, monkeypatch, at):
    """A handler installed before the fit (submitit's, in a SLURM task) is called once, after
    last.ckpt holds the stopping step -- also when the signal comes in an epoch's last step (its
    epoch-end checkpoint is the one) -- and what it raises (submitit: ``sys.exit(-1)`` after the
    requeue) ends the run. The handler is back in place afterwards."""
    run_dir, calls = tmp_path / "run", []

    def previous(signum, frame):  # submitit's SignalHandler.checkpoint_and_try_requeue, on rank 0
        calls.append((signum, _ckpt(run_dir)["global_step"]))
        sys.exit(-1)

    def on_before_optimizer_step(self, optimizer):  # the signal lands mid-step
        if self.trainer.global_step == at:
            os.kill(os.getpid(), signal.SIGUSR2)

    monkeypatch.setattr(SSLMethod, "on_before_optimizer_step", on_before_optimizer_step)
    before = signal.signal(signal.SIGUSR2, previous)
    try:
        with pytest.raises(SystemExit) as stop:
            run(make_cfg(*RUN, tiny=False), run_dir)
        assert signal.getsignal(signal.SIGUSR2) is previous
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert stop.value.code == -1 and calls == [(signal.SIGUSR2, at + 1)]
    monkeypatch.undo()
    run(make_cfg(*RUN, tiny=False), run_dir)
    _assert_same_run(run_dir, straight)
    assert len(read_record(run_dir)["sessions_s"]) == 2


@pytest.mark.filterwarnings("ignore:The `srun` command is available")  # SLURM's variables, set by the test
def test_lightning_auto_requeue_is_off_under_slurm(monkeypatch):
    """One mechanism: under SLURM the trainer gets Lightning's SLURM environment without its
    auto-requeue (its SIGUSR1 handler would save mid-step and requeue on its own); elsewhere
    Lightning picks its environment as usual."""
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    assert cluster_plugins() == []
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    (env,) = cluster_plugins()
    assert env.auto_requeue is False
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "TERM")
    assert preempt_signal() == signal.SIGTERM


DDP = [
    *(o for o in RUN if o not in ("trainer=cpu", "data.train_size=64")),
    "trainer=ddp",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "data.train_size=128",
]  # 128 images, 2 x 16 per step: 4 steps per epoch


def _train(run_dir: Path, *extra: str, env: dict | None = None, module: str = "tests._preempt_job"):
    """The 2-process run in a session of its own (its process group is the run's processes alone)."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *DDP, *extra, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def ddp_straight(tmp_path_factory) -> Path:
    """The uninterrupted 2-process run (Lightning's launcher, no loader workers), made once for the
    three DDP tests below: each stopped run must end bit for bit as it, whatever its launcher
    (torchrun) or loader workers (views are a function of (seed, epoch, sample, slot), not of the
    worker count: tests/test_determinism.py)."""
    run_dir = tmp_path_factory.mktemp("ddp_straight")
    straight = _train(run_dir, env=dict(os.environ, PREEMPT_AT_STEP="-1", PREEMPT_MARKER="-"))
    out, err = straight.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert straight.returncode == 0, err[-3000:]
    return run_dir


@pytest.mark.slow  # two runs of 2 processes (and ddp_straight, made once): minutes on a small machine
def test_ddp_signal_on_one_rank_stops_both_at_the_same_step(ddp_straight, tmp_path):
    """trainer=ddp, 2 CPU processes, SIGUSR2 to rank 1 only (mid-step): both ranks stop after the same
    step, one checkpoint at it; the continuation ends bit for bit as the uninterrupted 2-process run."""
    run_dir, marker = tmp_path / "preempted", tmp_path / "marker"
    proc = _train(run_dir, env=dict(os.environ, PREEMPT_AT_STEP=str(MID), PREEMPT_RANK="1", PREEMPT_MARKER=str(marker)))
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1][-3000:]
    assert int(marker.read_text()) != proc.pid  # rank 1 is a process of its own
    os.kill(int(marker.read_text()), signal.SIGUSR2)
    out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 128 + signal.SIGUSR2, err[-3000:]
    assert f"SIGUSR2: stopped after step {MID + 1} with checkpoint" in out + err  # rank 0
    assert f"SIGUSR2: stopped after step {MID + 1} (rank 1)" in out + err
    assert _ckpt(run_dir)["global_step"] == MID + 1

    resumed = _train(run_dir, env=dict(os.environ, PREEMPT_AT_STEP="-1", PREEMPT_MARKER="-"))
    out, err = resumed.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert resumed.returncode == 0, err[-3000:]
    _assert_same_run(run_dir, ddp_straight)
    assert len(read_record(run_dir)["sessions_s"]) == 2


@pytest.mark.slow  # a W&B run stopped by SIGUSR2
def test_wandb_rewind_point_is_noted_at_the_stop(tmp_path, monkeypatch):
    """The stop notes, in sessions.json, the W&B step of the first row after its checkpoint: the
    requeued job continues the same W&B run (same id) rewound to exactly the rows before it."""
    import json

    import wandb

    from hvp_lightning.run.records import wandb_resume, wandb_run_id

    from .conftest import wandb_records

    def on_before_optimizer_step(self, optimizer):
        if self.trainer.global_step == MID:
            os.kill(os.getpid(), signal.SIGUSR2)

    monkeypatch.setattr(SSLMethod, "on_before_optimizer_step", on_before_optimizer_step)
    with pytest.raises(SystemExit) as stop:
        run(make_cfg("logger=wandb", "trainer.max_epochs=2", "trainer.log_every_n_steps=1"), tmp_path)
    wandb.finish(exit_code=stop.value.code)  # what the process's exit does
    assert stop.value.code == 128 + signal.SIGUSR2
    noted = read_record(tmp_path)["wandb_steps"]
    rows = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in wandb_records(tmp_path)
        if r.HasField("history")
    ]
    n = noted[str(MID + 1)]
    assert n == len(rows) and {r["trainer/global_step"] for r in rows} == set(range(MID + 1))
    run_id = wandb_run_id(tmp_path)
    assert wandb_resume(tmp_path, MID + 1, "online") == {
        "id": run_id,
        "resume": None,
        "resume_from": f"{run_id}?_step={n}",
    }


@pytest.mark.slow  # a W&B run
def test_wandb_rewind_point_is_noted_at_every_n_steps_checkpoints(tmp_path):
    """A checkpoint written every N steps inside an epoch notes its W&B rewind point too: a run
    killed after it and resumed rewinds the W&B run to exactly the rows before that checkpoint."""
    import json

    import wandb

    from .conftest import wandb_records

    run(
        make_cfg("logger=wandb", "trainer.max_epochs=1", "trainer.log_every_n_steps=1", "checkpoint.every_n_steps=2"),
        tmp_path,
    )
    wandb.finish()
    noted = read_record(tmp_path)["wandb_steps"]
    rows = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in wandb_records(tmp_path)
        if r.HasField("history")
    ]
    steps = [r.get("trainer/global_step") for r in rows]
    assert "2" in noted, noted  # the first every_n_steps checkpoint, mid-epoch
    n = noted["2"]
    assert all(s < 2 for s in steps[:n]) and steps[n] >= 2, (n, steps)


@pytest.mark.slow  # two runs of 2 processes (and ddp_straight, made once)
def test_sigterm_to_every_process_stops_at_a_step_and_the_same_command_continues(ddp_straight, tmp_path):
    """A spot VM's or Kubernetes' notice: SIGTERM to every process of a 2-process run (ranks, the
    loader workers' fork servers, the workers) in the middle of a step. Both ranks finish the step,
    last.ckpt is written at it, every process exits (143: stopped, resumable) well inside a 30 s
    grace period, and running the same command again ends bit for bit as the uninterrupted run."""
    workers = "data.num_workers=1"
    run_dir, marker = tmp_path / "stopped", tmp_path / "marker"
    env = dict(os.environ, PREEMPT_AT_STEP=str(MID), PREEMPT_RANK="1", PREEMPT_MARKER=str(marker))
    proc = _train(run_dir, workers, env=env)
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1][-3000:]
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    while living_session(proc.pid) and time.monotonic() - sent < 30:
        time.sleep(0.1)
    took = time.monotonic() - sent
    print(f"SIGTERM to exit of every process: {took:.1f} s")
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert f"SIGTERM: stopped after step {MID + 1} with checkpoint" in out + err
    assert not living_session(proc.pid) and took < 30, took
    assert _ckpt(run_dir)["global_step"] == MID + 1

    resumed = _train(run_dir, workers, env=dict(os.environ, PREEMPT_AT_STEP="-1", PREEMPT_MARKER="-"))
    out, err = resumed.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert resumed.returncode == 0, err[-3000:]
    _assert_same_run(run_dir, ddp_straight)
    assert len(read_record(run_dir)["sessions_s"]) == 2


@pytest.mark.slow  # a run of 2 processes under torchrun, restarted once (and ddp_straight)
def test_sigterm_under_torchrun_stops_at_a_step_and_its_restart_continues(ddp_straight, tmp_path):
    """torchrun (``--max-restarts=1``) starts the 2 ranks; SIGTERM to rank 1 mid-step: both ranks
    stop after that step with last.ckpt at it, torchrun restarts them, and the restarted run
    resumes there and ends bit for bit as the uninterrupted one."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    job = ["-m", "tests._preempt_job", *DDP]
    # torchrun's default: its rendezvous store shared with the workers, every attempt's keys in it;
    # the package joins each attempt under a prefix of its own (cluster/distributed.py attempt_store)
    shared = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    run_dir, marker = tmp_path / "stopped", tmp_path / "marker"
    env = dict(shared, PREEMPT_AT_STEP=str(MID), PREEMPT_RANK="1", PREEMPT_MARKER=str(marker))
    proc = subprocess.Popen(
        [*torchrun, "--max-restarts=1", *job, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()[1][-3000:]
    rank1 = int(marker.read_text())
    sent = time.monotonic()
    os.kill(rank1, signal.SIGTERM)
    while Path(f"/proc/{rank1}").exists() and time.monotonic() - sent < 60:
        time.sleep(0.1)
    print(f"SIGTERM to rank 1's exit: {time.monotonic() - sent:.1f} s")
    out, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == 0, err[-3000:]
    assert f"SIGTERM: stopped after step {MID + 1} with checkpoint" in out + err
    _assert_same_run(run_dir, ddp_straight)
    assert len(read_record(run_dir)["sessions_s"]) == 2


def test_a_signal_after_the_last_step_is_named_as_received(caplog: pytest.LogCaptureFixture) -> None:
    """Outside SLURM the run stops for USR2 or SIGTERM; one that arrives after the last step
    (nothing left to stop) is reported by the name of the signal that came, not the first one
    the run listens for."""
    stop = StopOnSignal(None, None)  # type: ignore[arg-type]  # teardown touches neither
    assert signal.SIGTERM in stop.signals and stop.signals[0] != signal.SIGTERM
    stop._note(signal.SIGTERM, None)  # noqa: SLF001 -- what the installed handler does
    with caplog.at_level("WARNING", logger="hvp_lightning.training.preemption"):
        stop.teardown(None, None, "fit")  # type: ignore[arg-type]
    assert "SIGTERM came after the last training step" in caplog.text


def test_each_torchrun_attempt_joins_under_a_prefix_of_its_own() -> None:
    """Under a torchrun sharing its store (``TORCHELASTIC_USE_AGENT_STORE=True``) the process group
    joins through torchrun's store under ``hvp_lightning/attempt_<restart count>/``: keys of an
    earlier attempt (a peer's old address) are not seen by the next. Without torchrun's store: None."""
    from datetime import timedelta

    import torch.distributed as dist

    from hvp_lightning.cluster.distributed import attempt_store

    agent = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    env = {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(agent.port)}
    env["WORLD_SIZE"] = "1"
    first = attempt_store(timedelta(seconds=10), {**env, "TORCHELASTIC_RESTART_COUNT": "0"})
    second = attempt_store(timedelta(seconds=10), {**env, "TORCHELASTIC_RESTART_COUNT": "1"})
    first.set("rank_1_address", "old")
    assert agent.get("hvp_lightning/attempt_0/rank_1_address") == b"old"
    assert not second.check(["rank_1_address"])  # the restart does not read the first attempt's address
    assert attempt_store(timedelta(seconds=10), {**env, "TORCHELASTIC_USE_AGENT_STORE": "False"}) is None
    assert attempt_store(timedelta(seconds=10), {}) is None
