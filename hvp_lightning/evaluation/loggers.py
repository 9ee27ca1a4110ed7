"""Where an evaluation logs: CSV next to its summary, or a W&B run in the pretraining run's group."""

from __future__ import annotations

import os
from typing import Any

from ..run.directory import EvalDir, RunDir
from ..run.wandb_logging import wandb_logged_in
from ..schema import EvalConfig, TrainConfig


def eval_logger(cfg: EvalConfig, train_cfg: TrainConfig, out: EvalDir, run_dir: RunDir, protocol: str):
    """``logger=...`` of the evaluation, else the pretraining run's logger kind."""
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    lc = cfg.logger if cfg.logger is not None else train_cfg.logger
    if lc.name == "csv":
        return CSVLogger(save_dir=str(out.path), name=out.csv_name, version="")
    mode = os.environ.get("WANDB_MODE") or (
        lc.mode if lc.mode != "auto" else ("online" if wandb_logged_in() else "offline")
    )
    return WandbLogger(
        project=lc.project,
        entity=lc.entity,
        group=run_dir.name,
        job_type=f"eval-{protocol}",
        name=f"{run_dir.name}-eval-{protocol}",
        save_dir=str(out.path),
        mode=mode,
        tags=[*lc.tags, "eval", protocol],
        config=cfg.model_dump(),
    )


def finish_logger(logger, summary: dict[str, Any]) -> None:
    from lightning.pytorch.loggers import WandbLogger

    if isinstance(logger, WandbLogger):
        run = logger.experiment
        run.summary.update({f"eval/{k}": v for k, v in flatten(summary["metrics"]).items()})
        run.summary.update({"checkpoint": summary["checkpoint"], "protocol": summary["protocol"]})
        logger.finalize("success")
        run.finish()
    else:
        logger.save()
        logger.finalize("success")


def flatten(d: dict[str, Any], sep: str = "_", prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level, keys joined with ``sep`` (logger hyperparameters, config diffs)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, sep, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out
