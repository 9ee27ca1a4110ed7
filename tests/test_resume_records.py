"""A resumed run reads as one uninterrupted run (analysis and CSV logs: no lost or duplicated
rows; summary totals over all sessions), and a run dir is only ever continued by its own run."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from hvp_lightning.checkpoint import AtomicCheckpointIO, CheckpointError, resume_config
from hvp_lightning.train import run

from .conftest import make_cfg

RUN = ["+hvp=on", "hvp.num_views=3", "trainer.max_epochs=2", "checkpoint.every_n_epochs=1", "eval.every_n_epochs=1",
       "trainer.log_every_n_steps=1", "analysis.log_every_n_steps=1", "+trainer.deterministic=true"]
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
    run_dir = tmp_path_factory.mktemp("straight")
    run(make_cfg(*RUN), run_dir)
    return run_dir


def test_analysis_rows_are_on_disk_when_a_checkpoint_is_written(tmp_path, monkeypatch):
    """A kill right after a checkpoint loses no analysis row (they were buffered for 50 steps)."""
    on_disk: list[tuple[int, int]] = []
    save = AtomicCheckpointIO.save_checkpoint

    def spy(self, checkpoint, path, storage_options=None):
        steps = tmp_path / "analysis" / "steps-r0.csv"
        parts = list((tmp_path / "analysis").glob("pairs-r0-*.parquet"))
        import pyarrow.parquet as pq

        logged = sum(pq.read_table(p).column("step").unique().__len__() for p in parts)
        on_disk.append((len(_rows(steps)) if steps.exists() else 0, logged))
        save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", spy)
    run(make_cfg(*RUN), tmp_path)
    assert on_disk == [(STEPS_PER_EPOCH, STEPS_PER_EPOCH), (2 * STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH)]


def test_resumed_run_logs_each_step_once_and_sums_wall_time(straight, tmp_path):
    """Killed after epoch 2 was logged (and flushed) but before its checkpoint: the run resumes
    from epoch 1's and its records end as the uninterrupted run's -- no step twice, none lost."""
    resumed = tmp_path / "resumed"
    shutil.copytree(straight, resumed)
    (resumed / "summary.json").unlink()
    shutil.copy(resumed / "checkpoints" / "epoch=001.ckpt", resumed / "checkpoints" / "last.ckpt")
    (resumed / "checkpoints" / "epoch=002.ckpt").unlink()
    summary = run(make_cfg(*RUN), resumed)

    assert _rows(resumed / "analysis" / "steps-r0.csv") == _rows(straight / "analysis" / "steps-r0.csv")
    assert _logged_steps(resumed / "csv" / "metrics.csv") == _logged_steps(straight / "csv" / "metrics.csv")
    import pyarrow.parquet as pq

    steps = sorted(s for p in (resumed / "analysis").glob("pairs-r0-*.parquet")
                   for s in set(pq.read_table(p).column("step").to_pylist()))
    assert steps == list(range(2 * STEPS_PER_EPOCH))

    first = torch.load(straight / "checkpoints" / "epoch=001.ckpt", weights_only=True)["callbacks"]["RunCheckpoint"]
    assert first["wall_time_s"] > 0 and summary["wall_time_s"] > first["wall_time_s"]  # both sessions


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


def test_another_seed_does_not_continue_a_finished_run(straight):
    """The same command with seed=1 in a seed-0 run dir: refused in one line naming seed
    (it resumed the seed-0 weights and reported them as seed 1)."""
    with pytest.raises(CheckpointError) as err:
        run(make_cfg(*RUN, "seed=1"), straight)
    message = str(err.value)
    assert "config differs in seed:" in message and "seed (0 there, 1 here)" in message and "\n" not in message
    with pytest.raises(CheckpointError, match=r"differs in seed"):  # resume= with a new seed: the same answer
        run(resume_config(straight, make_cfg(*RUN, "seed=1"), ["seed=1"]), straight)


def test_keys_that_may_change_on_resume_are_accepted(straight, tmp_path):
    run_dir = tmp_path / "longer"
    shutil.copytree(straight, run_dir)
    summary = run(make_cfg(*RUN, "trainer.max_epochs=3", "eval.every_n_epochs=3", "checkpoint.every_n_epochs=3"),
                  run_dir)
    assert summary["epochs"] == 3 and summary["steps"] == 3 * STEPS_PER_EPOCH
    assert json.loads((run_dir / "summary.json").read_text())["seed"] == 0
