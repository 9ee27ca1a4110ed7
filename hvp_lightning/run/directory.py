"""A run directory and every path in it, each spelled once (:class:`RunDir`).

A run dir (``hydra.run.dir``: ``runs/<date>/<time>_<method>`` by default, a sweep's job dir)::

    .hydra/              Hydra's record of the command that started the run (config, overrides)
    train.log            the console log (Hydra's job logging)
    config.yaml          the run's composed config
    summary.json         the summary (rewritten live; sweep tables read it)
    sessions.json        each session's wall time and the W&B rewind points
    monitors.json        every label-free monitor and k-NN pass (rewritten at each; hvp-monitors reads it)
    wandb_run_id         the W&B run this run logs to (a resume continues it)
    wandb/               W&B's own files
    error.txt            a failed sweep job's exception, one line
    checkpoints/         last.ckpt (what a resume continues) and kept epoch=NNN.ckpt
    csv/metrics.csv      the CSV log
    analysis/            the hard-view analysis logs and report
    eval/<protocol>/     evaluations of the run (eval.py): eval_summary.json, eval_config.yaml, csv/
    eval/<variant>/<protocol>/  of another checkpoint file or data set (eval_variant: epoch=100_food101)
    eval/transfer/       the transfer table (hvp-transfer) and its cells <dataset>/<protocol>/

Torch-free, so the command-line entry points check a ``ckpt=`` or ``resume=`` path before the
heavy imports (hvp_lightning/cli.py, config.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError

LAST = "last.ckpt"
_CHECKPOINTS = "checkpoints"
_HYDRA = ".hydra"
_OVERRIDES = "overrides.yaml"  # Hydra's record of a job's command-line overrides
_TRAIN_LOG = "train.log"
_CSV = "csv"
_CSV_METRICS = "metrics.csv"  # Lightning's CSVLogger writes <save_dir>/<name>/metrics.csv


@dataclass(frozen=True)
class EvalDir:
    """One evaluation's folder (``<run_dir>/eval/<protocol>/``, a transfer cell, or ``out_dir=``)."""

    path: Path

    @property
    def summary(self) -> Path:
        return self.path / "eval_summary.json"

    @property
    def config(self) -> Path:
        return self.path / "eval_config.yaml"

    @property
    def csv_name(self) -> str:
        """The CSV logger's ``name`` under :attr:`path` (its ``save_dir``)."""
        return _CSV

    @property
    def csv_metrics(self) -> Path:
        return self.path / _CSV / _CSV_METRICS

    def start(self) -> None:
        """Make the folder for a new evaluation, removing the previous one's summary, config and CSV
        log: an evaluation that is stopped before its summary is written leaves none of the old
        results beside its own log."""
        self.path.mkdir(parents=True, exist_ok=True)
        for old in (self.summary, self.config, self.csv_metrics):
            old.unlink(missing_ok=True)


@dataclass(frozen=True)
class TransferDir:
    """The transfer table's folder: the table, and one :class:`EvalDir` per (dataset, protocol)."""

    path: Path

    @property
    def table_csv(self) -> Path:
        return self.path / "transfer_table.csv"

    @property
    def table_md(self) -> Path:
        return self.path / "transfer_table.md"

    def cell(self, dataset: str, protocol: str) -> EvalDir:
        return EvalDir(self.path / dataset / protocol)


@dataclass(frozen=True)
class RunDir:
    """A run's directory: every file and folder of a run is a property or method here.

    Args:
        path: the run dir (need not exist yet).

    Usable wherever a path is (``os.fspath``, ``Path(run_dir)``), so a function that takes a run
    dir accepts a ``str``, a ``Path`` or a :class:`RunDir` through :meth:`of`.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path).expanduser())

    @classmethod
    def of(cls, where: str | os.PathLike[str] | RunDir) -> RunDir:
        """``where`` as a :class:`RunDir` (itself when it is one)."""
        return where if isinstance(where, RunDir) else cls(Path(where))

    @classmethod
    def of_checkpoint(cls, ckpt_file: str | os.PathLike[str]) -> RunDir:
        """The run dir a checkpoint file belongs to: the folder above ``checkpoints/`` (a file
        elsewhere: its own folder)."""
        p = Path(ckpt_file)
        return cls(p.parent.parent if p.parent.name == _CHECKPOINTS else p.parent)

    @classmethod
    def started_under(cls, root: Path) -> list[RunDir]:
        """Every run dir below ``root`` that Hydra started (it holds ``.hydra/overrides.yaml``):
        the jobs of a sweep dir, in no particular order."""
        return [cls(p.parent.parent) for p in root.rglob(f"{_HYDRA}/{_OVERRIDES}")]

    @staticmethod
    def is_last_checkpoint(path: str | os.PathLike[str]) -> bool:
        """True for a run's own ``checkpoints/last.ckpt`` (the file a resume continues from)."""
        p = Path(path)
        return p.name == LAST and p.parent.name == _CHECKPOINTS

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    # --- Hydra's files -----------------------------------------------------------------------
    @property
    def hydra(self) -> Path:
        return self.path / _HYDRA

    @property
    def hydra_config(self) -> Path:
        return self.hydra / "config.yaml"

    @property
    def overrides(self) -> Path:
        return self.hydra / _OVERRIDES

    @property
    def train_log(self) -> Path:
        return self.path / _TRAIN_LOG

    def just_made(self) -> bool:
        """True when Hydra has just made this dir for a job: it holds only ``.hydra/`` and an
        empty ``train.log`` (a dir holding an earlier run's files never is)."""
        return {p.name for p in self.path.iterdir()} <= {_HYDRA, _TRAIN_LOG} and (
            not self.train_log.exists() or self.train_log.stat().st_size == 0
        )

    # --- the run's own records ---------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def sessions(self) -> Path:
        return self.path / "sessions.json"

    @property
    def monitors(self) -> Path:
        return self.path / "monitors.json"

    @property
    def wandb_id(self) -> Path:
        return self.path / "wandb_run_id"

    @property
    def wandb(self) -> Path:
        return self.path / "wandb"

    @property
    def error(self) -> Path:
        return self.path / "error.txt"

    @property
    def csv_name(self) -> str:
        """The CSV logger's ``name`` under the run dir (its ``save_dir``)."""
        return _CSV

    @property
    def csv_metrics(self) -> Path:
        return self.path / _CSV / _CSV_METRICS

    @property
    def analysis(self) -> Path:
        return self.path / "analysis"

    # --- checkpoints -------------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.path / _CHECKPOINTS

    @property
    def last_checkpoint(self) -> Path:
        return self.checkpoints / LAST

    def epoch_checkpoint(self, epoch: int) -> Path:
        """The kept checkpoint after ``epoch`` epochs (``checkpoint.every_n_epochs``)."""
        return self.checkpoints / f"epoch={epoch:03d}.ckpt"

    def has_run(self) -> bool:
        """True when the dir holds a run to continue (its ``checkpoints/last.ckpt``)."""
        return self.last_checkpoint.is_file()

    # --- evaluations of the run --------------------------------------------------------------
    def eval(self, protocol: str, variant: str | None = None) -> EvalDir:
        """``eval/<protocol>``: the run's last.ckpt on its own data; ``eval/<variant>/<protocol>``
        for another checkpoint file or data set (:func:`eval_variant`), so it replaces neither."""
        return EvalDir(self.path.joinpath("eval", *([variant] if variant else []), protocol))

    @property
    def transfer(self) -> TransferDir:
        return TransferDir(self.path / "eval" / "transfer")


def eval_variant(ckpt_file: Path, dataset: str | None) -> str | None:
    """The name of an evaluation's subfolder of ``eval/``: the checkpoint file's stem unless it is
    the run's last.ckpt, and the data set evaluated on if not the pretraining data, joined by '_'
    (``epoch=100``, ``food101``, ``epoch=100_food101``); None for last.ckpt on its own data."""
    parts = ([] if RunDir.is_last_checkpoint(ckpt_file) else [ckpt_file.stem]) + ([dataset] if dataset else [])
    return "_".join(parts) or None


def resolve_checkpoint(path: str | os.PathLike[str], key: str = "ckpt") -> tuple[Path, RunDir]:
    """``(checkpoint file, run dir)`` for a run dir (its ``checkpoints/last.ckpt``), the
    ``checkpoints/`` folder itself, or a ``.ckpt`` file (its run dir: :meth:`RunDir.of_checkpoint`).
    Anything else is a :class:`CheckpointError` naming ``key``."""
    p = Path(os.fspath(path)).expanduser()
    if p.is_dir():
        run_dir = RunDir(p)
        if run_dir.has_run():
            return run_dir.last_checkpoint, run_dir
        if (p / LAST).is_file():  # the checkpoints/ folder itself
            return p / LAST, RunDir.of_checkpoint(p / LAST)
        raise CheckpointError(
            f"{key}={os.fspath(path)!r} is not allowed: a run dir with {_CHECKPOINTS}/{LAST} or a .ckpt file "
            f"(no {_CHECKPOINTS}/{LAST} in that folder)"
        )
    if not p.is_file():
        raise CheckpointError(
            f"{key}={os.fspath(path)!r} is not allowed: a run dir or a .ckpt file (nothing at that path)"
        )
    return p, RunDir.of_checkpoint(p)
