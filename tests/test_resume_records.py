"""A resumed run reads as one uninterrupted run (analysis and CSV logs: no lost or duplicated
rows; summary totals over all sessions), and a run dir is only ever continued by its own run."""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path

import pytest

from hvp_lightning.monitors.online import OnlineMonitors
from hvp_lightning.run.directory import RunDir
from hvp_lightning.run.records import RunRecord, read_record, wandb_resume, wandb_run_id
from hvp_lightning.training.checkpoint import AtomicCheckpointIO, CheckpointError, resume_config
from hvp_lightning.training.driver import build_logger, run

from .conftest import make_cfg, make_settings, wandb_records

RUN = [
    "+hvp=on",
    "hvp.num_views=3",
    "trainer.max_epochs=2",
    "checkpoint.every_n_epochs=1",
    "eval.every_n_epochs=1",
    "trainer.log_every_n_steps=1",
    "analysis.log_every_n_steps=1",
    "+trainer.deterministic=true",
]
STEPS_PER_EPOCH = 4  # 64 images, batch 16


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _logged_steps(path: Path) -> dict[str, list[int]]:
    """metrics.csv: for every column, the steps of the rows that hold a value for it."""
    rows = _rows(path)
    return {k: sorted(int(r["step"]) for r in rows if r[k]) for k in rows[0] if k != "step"}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted 2-epoch run, with what was on disk of its analysis logs at each checkpoint
    noted in ``on_disk.json`` ((steps.csv rows, steps in pairs parquet files), by a spy on the writer)."""
    run_dir = tmp_path_factory.mktemp("straight")
    on_disk: list[tuple[int, int]] = []
    save = AtomicCheckpointIO.save_checkpoint

    def spy(self, checkpoint, path, storage_options=None):
        import pyarrow.parquet as pq

        steps = run_dir / "analysis" / "steps-r0.csv"
        parts = list((run_dir / "analysis").glob("pairs-r0-*.parquet"))
        logged = sum(pq.read_table(p).column("step").unique().__len__() for p in parts)
        on_disk.append((len(_rows(steps)) if steps.exists() else 0, logged))
        save(self, checkpoint, path, storage_options)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AtomicCheckpointIO, "save_checkpoint", spy)
        run(make_cfg(*RUN), run_dir)
    (run_dir.parent / f"{run_dir.name}_on_disk.json").write_text(json.dumps(on_disk))
    return run_dir


@pytest.mark.slow  # a run (the module's straight run)
def test_analysis_rows_are_on_disk_when_a_checkpoint_is_written(straight):
    """A kill right after a checkpoint loses no analysis row (they were buffered for 50 steps)."""
    on_disk = json.loads((straight.parent / f"{straight.name}_on_disk.json").read_text())
    assert on_disk == [[STEPS_PER_EPOCH, STEPS_PER_EPOCH], [2 * STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]]


@pytest.mark.slow  # a run continued from the straight run's epoch-1 checkpoint
def test_resumed_run_logs_each_step_once_and_sums_wall_time(straight, tmp_path, monkeypatch):
    """Killed after epoch 2 was logged (and flushed) but before its checkpoint: the run resumes
    from epoch 1's and its records end as the uninterrupted run's -- no step twice, none lost.
    The record of monitor passes drops the killed session's last pass as soon as training resumes."""
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    (resumed / "summary.json").unlink()
    shutil.copy(resumed / "checkpoints" / "epoch=001.ckpt", resumed / "checkpoints" / "last.ckpt")
    (resumed / "checkpoints" / "epoch=002.ckpt").unlink()
    at_fit_start: list[list[int]] = []
    write = OnlineMonitors.on_fit_start

    def spy(self, trainer, pl_module):
        write(self, trainer, pl_module)
        at_fit_start.append([h["step"] for h in json.loads(RunDir(resumed).monitors.read_text())["monitor_history"]])

    monkeypatch.setattr(OnlineMonitors, "on_fit_start", spy)
    summary = run(make_cfg(*RUN), resumed)
    straight_passes = json.loads(RunDir(straight).monitors.read_text())
    assert [h["step"] for h in straight_passes["monitor_history"]] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    assert at_fit_start == [[STEPS_PER_EPOCH]]
    assert json.loads(RunDir(resumed).monitors.read_text()) == straight_passes

    assert _rows(resumed / "analysis" / "steps-r0.csv") == _rows(straight / "analysis" / "steps-r0.csv")
    assert _logged_steps(resumed / "csv" / "metrics.csv") == _logged_steps(straight / "csv" / "metrics.csv")
    import pyarrow.parquet as pq

    steps = sorted(
        s
        for p in (resumed / "analysis").glob("pairs-r0-*.parquet")
        for s in set(pq.read_table(p).column("step").to_pylist())
    )
    assert steps == list(range(2 * STEPS_PER_EPOCH))

    sessions = read_record(resumed)["sessions_s"]  # the straight run's session, then the resumed one
    assert len(sessions) == 2 and summary["wall_time_s"] == pytest.approx(sum(sessions), abs=0.2)


@pytest.mark.slow  # a run and its resume
def test_finished_run_resumed_with_its_own_command_reports_the_same_run(straight, tmp_path):
    """train.py <its command> resume=<dir>: accepted (logger=csv included), trains nothing and
    reports the run's loss and total wall time, not null and one session's."""
    run_dir = tmp_path / "again"
    shutil.copytree(straight, run_dir)
    before = json.loads((run_dir / "summary.json").read_text())
    command = ["logger=csv", *RUN, f"resume={run_dir}"]
    summary = run(resume_config(run_dir, make_cfg(*command), command), run_dir)
    assert summary["steps"] == before["steps"] and summary["knn_top1"] == before["knn_top1"]
    assert summary["train_loss"] == pytest.approx(before["train_loss"])
    assert summary["wall_time_s"] >= 0.8 * before["wall_time_s"]


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_another_seed_does_not_continue_a_finished_run(simsiam_run):
    """The same command with seed=1 in a seed-0 run dir: refused in one line naming seed
    (it resumed the seed-0 weights and reported them as seed 1)."""
    finished, command = simsiam_run[0], ["eval.every_n_epochs=1"]  # the shared run's command
    with pytest.raises(CheckpointError) as err:
        run(make_cfg(*command, "seed=1"), finished)
    message = str(err.value)
    assert "config differs in seed:" in message and "seed (0 there, 1 here)" in message and "\n" not in message
    with pytest.raises(CheckpointError, match=r"differs in seed"):  # resume= with a new seed: the same answer
        run(resume_config(finished, make_cfg(*command, "seed=1"), ["seed=1"]), finished)


@pytest.mark.slow  # a run continued for a third epoch
def test_keys_that_may_change_on_resume_are_accepted(straight, tmp_path):
    run_dir = tmp_path / "longer"
    shutil.copytree(straight, run_dir)
    summary = run(
        make_cfg(*RUN, "trainer.max_epochs=3", "eval.every_n_epochs=3", "checkpoint.every_n_epochs=3"), run_dir
    )
    assert summary["epochs"] == 3 and summary["steps"] == 3 * STEPS_PER_EPOCH
    assert json.loads((run_dir / "summary.json").read_text())["seed"] == 0


@pytest.mark.slow  # a run killed in its second checkpoint, waits 3 s, then resumed
def test_a_killed_sessions_time_after_its_last_checkpoint_counts(tmp_path, monkeypatch):
    """Killed 3 s after its epoch-1 checkpoint (while writing epoch 2's): the resumed run's
    wall_time_s holds that session up to its last heartbeat, not up to its checkpoint."""
    monkeypatch.setattr(RunRecord, "every_s", 0.0)  # a heartbeat after every batch
    save, saves, killed_at = AtomicCheckpointIO.save_checkpoint, [], []

    def slow_then_killed(self, checkpoint, path, storage_options=None):
        saves.append(path)
        if len(saves) == 2:
            killed_at.append(time.monotonic())
            raise RuntimeError("killed")
        save(self, checkpoint, path, storage_options)
        time.sleep(3.0)  # after the checkpoint: only the heartbeats know of this time

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", slow_then_killed)
    cfg = ["trainer.max_epochs=2", "checkpoint.every_n_epochs=null", "trainer.log_every_n_steps=1"]
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*cfg), tmp_path)
    (killed,) = read_record(tmp_path)["sessions_s"]
    assert killed >= killed_at[0] - start - 2.0  # the old count stopped 3 s + one epoch earlier

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save)
    summary = run(make_cfg(*cfg), tmp_path)  # resumes from epoch 1's checkpoint
    sessions = read_record(tmp_path)["sessions_s"]
    assert len(sessions) == 2 and sessions[0] == killed and summary["steps"] == 2 * STEPS_PER_EPOCH
    assert summary["wall_time_s"] == pytest.approx(sum(sessions), abs=0.2)


def _history(run_dir: Path) -> list[dict]:
    records = wandb_records(run_dir)
    return [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.HasField("history")
    ]


@pytest.mark.slow  # a W&B run
def test_wandb_rewind_point_is_the_first_row_after_the_checkpoint(tmp_path):
    """sessions.json notes, per epoch start, the W&B step of that epoch's first row: resuming
    from the checkpoint at optimiser step 4 rewinds the W&B run to exactly the rows before it."""
    run(
        make_cfg("logger=wandb", "trainer.max_epochs=2", "trainer.log_every_n_steps=1", "eval.every_n_epochs=1"),
        tmp_path,
    )
    rows = _history(tmp_path)
    noted = read_record(tmp_path)["wandb_steps"]
    assert set(noted) == {"0", str(STEPS_PER_EPOCH)}
    n = noted[str(STEPS_PER_EPOCH)]
    assert [r["_step"] for r in rows] == list(range(len(rows)))
    assert all(r["trainer/global_step"] < STEPS_PER_EPOCH for r in rows[:n])  # epoch 1, its k-NN and epoch row
    assert rows[n]["trainer/global_step"] == STEPS_PER_EPOCH  # epoch 2's first row
    run_id = wandb_run_id(tmp_path)
    assert wandb_resume(tmp_path, STEPS_PER_EPOCH, "online") == {
        "id": run_id,
        "resume": None,
        "resume_from": f"{run_id}?_step={n}",
    }


def test_wandb_resume_arguments(tmp_path, monkeypatch, caplog):
    """Online: rewind (resume_from, and resume unset: W&B refuses both). Offline: continue as
    is, with one warning. Nothing noted for that step (or a fresh run): continue as is."""
    RunDir(tmp_path).sessions.write_text(json.dumps({"sessions_s": [5.0], "wandb_steps": {"0": 0, "8": 13}}))
    (tmp_path / "wandb_run_id").write_text("abc123\n")
    assert wandb_resume(tmp_path, 8, "online") == {"id": "abc123", "resume": None, "resume_from": "abc123?_step=13"}
    for step in (0, 4):
        assert wandb_resume(tmp_path, step, "online") == {"id": "abc123", "resume": "allow"}
    with caplog.at_level("WARNING"):
        assert wandb_resume(tmp_path, 8, "offline") == {"id": "abc123", "resume": "allow"}
    assert [r.getMessage() for r in caplog.records] == [
        "W&B offline mode cannot rewind run abc123 to the checkpoint (W&B step 13): the rows the interrupted "
        "session logged after it stay in its W&B history (the CSV log is rewound)"
    ]

    import lightning.pytorch.loggers as loggers

    made: list[dict] = []
    monkeypatch.setattr(loggers, "WandbLogger", lambda **kwargs: made.append(kwargs))
    monkeypatch.setenv("WANDB_MODE", "online")
    # training.driver.run passes the checkpoint's step
    build_logger(make_settings("logger=wandb"), tmp_path, resume_step=8)
    assert made[0]["resume_from"] == "abc123?_step=13" and made[0]["resume"] is None and made[0]["id"] == "abc123"


@pytest.mark.slow  # two W&B runs (offline)
def test_wandb_accepts_the_rewind_arguments(tmp_path):
    """Lightning's WandbLogger and wandb.init take them together (offline here: no server)."""
    from lightning.pytorch.loggers import WandbLogger

    RunDir(tmp_path).sessions.write_text(json.dumps({"wandb_steps": {"4": 2}}))
    first = WandbLogger(save_dir=str(tmp_path), mode="offline", **wandb_resume(tmp_path, 0, "offline"))
    for i in range(3):
        first.experiment.log({"x": i})
    first.experiment.finish()
    again = WandbLogger(save_dir=str(tmp_path), mode="offline", **wandb_resume(tmp_path, 4, "online"))
    assert again.experiment.id == first.experiment.id
    again.experiment.finish()
