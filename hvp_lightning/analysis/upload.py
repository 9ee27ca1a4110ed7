"""Best-effort upload of an analysis to the run's W&B run (``hvp-analysis --wandb``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..run.directory import RunDir
from .report import json_safe


def log_to_wandb(run_dir: Path, result: dict[str, Any]) -> str | None:
    """Best effort: add the figures (as images) and scalar results to the run's W&B run,
    resumed by its id from ``<run_dir>/wandb/``. Returns the run id, or None if there is none."""
    import wandb

    runs = sorted(RunDir.of(run_dir).wandb.glob("*run-*-*"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return None
    run_id = runs[-1].name.rsplit("-", 1)[-1]
    from omegaconf import OmegaConf

    from ..config import stored_config

    lc = stored_config(OmegaConf.load(RunDir.of(run_dir).config)).logger
    project, entity = (lc.project, lc.entity) if lc.name == "wandb" else (None, None)
    run = wandb.init(id=run_id, resume="allow", project=project, entity=entity, dir=str(run_dir))
    run.log({f"analysis/{k}": wandb.Image(v) for k, v in result["figures"].items()})
    run.summary.update(
        {
            f"analysis/{k}": v
            for k, v in json_safe(result).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    )
    run.finish()
    return run_id
