"""A run's records besides its checkpoints -- the CSV log, the W&B run, the wall time, the
monitor passes -- kept as one uninterrupted run over kills and resumes.

A session killed after its last checkpoint has logged rows and spent time that the resumed
session repeats from that checkpoint on. So on resume:

* the CSV log keeps the rows of the steps before the checkpoint's (:func:`continue_csv_log`);
* the W&B run is *rewound* to the checkpoint -- ``wandb.init(resume_from="<id>?_step=<n>")``
  truncates its history at W&B step n and logs on from there -- where W&B can rewind (online;
  a preview feature of the W&B server). Offline the run is continued as it is (``resume="allow"``,
  the later rows stay), with one warning (:func:`wandb_resume`);
* the wall time counts every session in full, up to its last heartbeat (:class:`RunRecord`);
* the monitor and k-NN passes are the checkpoint's, then the resumed session's
  (:class:`hvp_lightning.monitors.online.OnlineMonitors`, ``monitors.json``).

The W&B step a checkpoint corresponds to, and each session's clock, are in
``<run_dir>/sessions.json`` (written atomically by global rank 0).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import lightning as L

from .atomic import atomic_write_text
from .directory import RunDir

log = logging.getLogger(__name__)


def read_record(run_dir: str | Path | RunDir) -> dict[str, Any]:
    """``{"sessions_s": [seconds of each session], "wandb_steps": {global step: W&B step}}`` of a
    run dir (empty for a new one). ``wandb_steps[g]`` is the W&B step of the first row logged
    at optimiser step ``g`` or later: the point to rewind to when resuming from step ``g``."""
    path = RunDir.of(run_dir).sessions
    record = json.loads(path.read_text()) if path.is_file() else {}
    return {"sessions_s": list(record.get("sessions_s", [])), "wandb_steps": dict(record.get("wandb_steps", {}))}


class RunRecord(L.Callback):
    """The session clock and W&B rewind points in ``<run_dir>/sessions.json``.

    Rank 0 rewrites the file (atomically) at the start and end of every training epoch, at
    the end of fit, and after a training batch or validation when ``every_s`` seconds have
    passed since the last write: a killed session's time is lost only back to its last write,
    not to its last checkpoint. At each epoch start it also notes the W&B step (the W&B
    logger's next row), which :func:`wandb_resume` rewinds to."""

    every_s = 10.0  # at most this much of a killed session's time goes uncounted

    def __init__(self, run_dir: str | Path | RunDir) -> None:
        self.path = RunDir.of(run_dir).sessions
        self.record = read_record(run_dir)
        self.earlier_s = sum(self.record["sessions_s"])
        self.record["sessions_s"].append(0.0)  # this session
        self.start = time.monotonic()
        self.last_write = -math.inf

    def total_seconds(self) -> float:
        """Wall-clock seconds of every session of this run, this one up to now."""
        return self.earlier_s + time.monotonic() - self.start

    def beat(self, trainer: L.Trainer, force: bool = False) -> None:
        """Record this session's time so far (on disk when forced or due)."""
        now = time.monotonic()
        self.record["sessions_s"][-1] = round(now - self.start, 3)
        if trainer.is_global_zero and (force or now - self.last_write >= self.every_s):
            text = json.dumps(self.record, indent=1) + "\n"
            atomic_write_text(self.path, text)
            self.last_write = now

    def note_checkpoint_step(self, trainer: L.Trainer) -> None:
        """Note the W&B step of the next row as the rewind point of a checkpoint at this global
        step (an epoch's start, or a pre-empted session's stop: hvp_lightning/training/preemption.py),
        and write the record."""
        from lightning.pytorch.loggers import WandbLogger

        if trainer.is_global_zero and isinstance(trainer.logger, WandbLogger):
            self.record["wandb_steps"][str(trainer.global_step)] = int(trainer.logger.experiment.step)
        self.beat(trainer, force=True)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.note_checkpoint_step(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.beat(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.beat(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.beat(trainer, force=True)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.beat(trainer, force=True)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.beat(trainer, force=True)  # a session that stops (pre-emption) or fails counts in full


def wandb_run_id(run_dir: str | Path | RunDir) -> str:
    """The W&B run id of this run dir (created on first use), so a resumed run continues
    the same W&B run."""
    path = RunDir.of(run_dir).wandb_id
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    import secrets

    run_id = secrets.token_hex(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id


def wandb_resume(run_dir: str | Path | RunDir, resume_step: int, mode: str) -> dict[str, Any]:
    """The ``wandb.init`` arguments (``id``, ``resume``, ``resume_from``) that continue this run
    dir's W&B run from the checkpoint at optimiser step ``resume_step`` (0: a new run).

    Rows the killed session logged from that step on are dropped by rewinding the run to the
    W&B step :class:`RunRecord` noted when the step-``resume_step`` epoch started. With no such
    rows (none noted) the run just continues. W&B rewinds only online runs: in ``mode``
    offline the run continues with those rows kept, and a warning says so."""
    run_id = wandb_run_id(run_dir)
    step = read_record(run_dir)["wandb_steps"].get(str(resume_step)) if resume_step > 0 else None
    if step is None or mode == "disabled":
        return {"id": run_id, "resume": "allow"}
    if mode != "online":
        log.warning(
            "W&B %s mode cannot rewind run %s to the checkpoint (W&B step %d): the rows the interrupted "
            "session logged after it stay in its W&B history (the CSV log is rewound)",
            mode,
            run_id,
            step,
        )
        return {"id": run_id, "resume": "allow"}
    return {"id": run_id, "resume": None, "resume_from": f"{run_id}?_step={step}"}


def continue_csv_log(logger, path: Path, resume_step: int) -> None:
    """Make Lightning's CSV log survive interruptions. Its writer deletes an existing
    metrics.csv when it starts, knows only the columns it has seen itself, and adds a column
    by truncating and rewriting the file (a kill then loses the rows). Put a resumed run's old
    rows back -- those of the steps before ``resume_step``, where its checkpoint left off
    (later ones were logged after the checkpoint and are logged again) -- seed the writer with
    their header, and make the rewrite atomic. ``path``: the logger's metrics.csv
    (:attr:`RunDir.csv_metrics`)."""
    import csv
    import io
    import warnings

    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank != 0:  # only rank 0 writes the log
        return
    old = path.read_bytes() if path.is_file() else None
    with warnings.catch_warnings():  # "Previous log files ... will be deleted": not any more
        warnings.filterwarnings("ignore", message="Experiment logs directory")
        exp = logger.experiment
    if old and resume_step > 0:
        reader = csv.DictReader(io.StringIO(old.decode(), newline=""))
        header = list(reader.fieldnames or [])
        rows = [r for r in reader if not r.get("step") or int(float(r["step"])) < resume_step]
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(path, text.getvalue())
        exp.metrics_keys = sorted(set(header) | set(exp.metrics_keys))

    def rewrite_with_new_header(fieldnames: list[str]) -> None:
        with open(exp.metrics_file_path, newline="") as f:
            rows = list(csv.DictReader(f))
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(exp.metrics_file_path, text.getvalue())

    exp._rewrite_with_new_header = rewrite_with_new_header
