"""The run directory's layout is defined once (:class:`RunDir`) and is the layout on disk: the
files an old run wrote sit where RunDir says, and everything a run writes is one of its paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from hvp_lightning.errors import CheckpointError
from hvp_lightning.run.directory import RunDir, resolve_checkpoint

OLD_RUN = Path(__file__).parent / "fixtures" / "run-0.1.0"  # written before RunDir existed


def test_run_dir_names_the_files_an_old_run_wrote() -> None:
    rd = RunDir(OLD_RUN)
    for path in (rd.last_checkpoint, rd.csv_metrics, rd.sessions, rd.summary, rd.config):
        assert path.is_file(), path
    assert rd.analysis.is_dir() and rd.has_run()
    assert {p.relative_to(OLD_RUN).as_posix() for p in OLD_RUN.rglob("*") if p.is_file()} == {
        "checkpoints/last.ckpt",
        "csv/metrics.csv",
        "csv/hparams.yaml",  # Lightning's CSVLogger's own file next to metrics.csv
        "analysis/steps-r0.csv",
        "sessions.json",
        "summary.json",
        "config.yaml",
    }


def test_the_layout_spelled_out() -> None:
    """The names on disk, written out once more: changing one is a format change (old run dirs
    would stop resuming), so it must be deliberate."""
    rd = RunDir("/r")
    assert {
        "checkpoints": rd.checkpoints,
        "last": rd.last_checkpoint,
        "epoch 7": rd.epoch_checkpoint(7),
        "csv": rd.csv_metrics,
        "analysis": rd.analysis,
        "sessions": rd.sessions,
        "wandb id": rd.wandb_id,
        "wandb": rd.wandb,
        "summary": rd.summary,
        "config": rd.config,
        "hydra config": rd.hydra_config,
        "overrides": rd.overrides,
        "log": rd.train_log,
        "error": rd.error,
        "eval": rd.eval("knn").summary,
        "eval config": rd.eval("linear").config,
        "eval csv": rd.eval("linear").csv_metrics,
        "transfer md": rd.transfer.table_md,
        "transfer csv": rd.transfer.table_csv,
        "transfer cell": rd.transfer.cell("food101", "linear").summary,
    } == {
        "checkpoints": Path("/r/checkpoints"),
        "last": Path("/r/checkpoints/last.ckpt"),
        "epoch 7": Path("/r/checkpoints/epoch=007.ckpt"),
        "csv": Path("/r/csv/metrics.csv"),
        "analysis": Path("/r/analysis"),
        "sessions": Path("/r/sessions.json"),
        "wandb id": Path("/r/wandb_run_id"),
        "wandb": Path("/r/wandb"),
        "summary": Path("/r/summary.json"),
        "config": Path("/r/config.yaml"),
        "hydra config": Path("/r/.hydra/config.yaml"),
        "overrides": Path("/r/.hydra/overrides.yaml"),
        "log": Path("/r/train.log"),
        "error": Path("/r/error.txt"),
        "eval": Path("/r/eval/knn/eval_summary.json"),
        "eval config": Path("/r/eval/linear/eval_config.yaml"),
        "eval csv": Path("/r/eval/linear/csv/metrics.csv"),
        "transfer md": Path("/r/eval/transfer/transfer_table.md"),
        "transfer csv": Path("/r/eval/transfer/transfer_table.csv"),
        "transfer cell": Path("/r/eval/transfer/food101/linear/eval_summary.json"),
    }


def test_a_run_dir_is_a_path_and_its_checkpoints_lead_back_to_it(tmp_path: Path) -> None:
    rd = RunDir.of(str(tmp_path))
    assert RunDir.of(rd) is rd and Path(rd) == tmp_path and str(rd) == str(tmp_path) and rd.name == tmp_path.name
    assert RunDir.of_checkpoint(rd.last_checkpoint) == rd and RunDir.of_checkpoint(tmp_path / "x.ckpt") == rd
    assert RunDir.is_last_checkpoint(rd.last_checkpoint) and not RunDir.is_last_checkpoint(rd.epoch_checkpoint(1))


def test_resolve_checkpoint_takes_a_run_dir_its_checkpoints_folder_or_a_file(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"resume='.*run' is not allowed: a run dir or a .ckpt file \(nothing"):
        resolve_checkpoint(rd, key="resume")
    rd.checkpoints.mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"no checkpoints/last.ckpt in that folder"):
        resolve_checkpoint(rd.path)
    rd.last_checkpoint.write_bytes(b"")
    rd.epoch_checkpoint(3).write_bytes(b"")
    assert resolve_checkpoint(rd.path) == (rd.last_checkpoint, rd)
    assert resolve_checkpoint(rd.checkpoints) == (rd.last_checkpoint, rd)
    assert resolve_checkpoint(str(rd.epoch_checkpoint(3))) == (rd.epoch_checkpoint(3), rd)
