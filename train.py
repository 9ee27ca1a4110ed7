"""Pretrain a self-supervised model, optionally with Hard View Pretraining.

    python train.py                                  # built-in CPU demo (SimSiam, synthetic shapes)
    python train.py +hvp=on                          # the same with hard views (N=4)
    python train.py data=imagefolder data.root=PATH backbone=resnet18_cifar +hvp=on hvp.num_views=8
    python train.py resume=runs/2026-11-21/10-30-00_simsiam     # continue an interrupted run
"""

import logging
import shutil
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from hvp_lightning.checkpoint import resume_config
from hvp_lightning.config import ConfigError
from hvp_lightning.train import final_line, run
import hvp_lightning.sweep  # noqa: F401  registers ${hvp_dirname:...} (hydra.sweep.subdir)

# hydra.run.dir: the run dir being resumed, else a new timestamped one (conf/config.yaml).
OmegaConf.register_new_resolver("hvp_resume_or", lambda resume, new: str(resume) if resume else new, replace=True)


class SweepConfigError(CompactHydraException):
    """A sweep job's config error: Hydra reports the job failed with this one line (no traceback),
    runs the other jobs, and its sweep_summary.csv row says failed."""


def _fresh(run_dir: Path) -> bool:
    """True when Hydra has just made ``run_dir`` for this job: it holds only its ``.hydra/``
    and an empty ``train.log`` (a dir holding an earlier run's files is never fresh)."""
    log_file = run_dir / "train.log"
    return ({p.name for p in run_dir.iterdir()} <= {".hydra", "train.log"}
            and (not log_file.exists() or log_file.stat().st_size == 0))


def _remove_run_dir(run_dir: Path) -> None:
    """Delete a run dir made for a run that never started (close Hydra's log file in it first)."""
    for handler in list(logging.root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == run_dir.resolve():
            logging.root.removeHandler(handler)
            handler.close()
    shutil.rmtree(run_dir, ignore_errors=True)


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    fresh = _fresh(run_dir)
    try:
        if cfg.get("resume"):  # continue that run with its own config (+ what the command line changes)
            cfg = resume_config(cfg.resume, cfg, list(HydraConfig.get().overrides.task))
            run_dir = Path(cfg.resume)
        summary = run(cfg, run_dir)
    except (ConfigError, MisconfigurationException) as err:  # bad settings: one line, no traceback
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # this job fails, the sweep goes on
            raise SweepConfigError(f"config error: {err}") from err
        print(f"config error: {err}", file=sys.stderr)
        if fresh:  # a rejected command leaves nothing behind
            _remove_run_dir(run_dir)
        sys.exit(2)
    if rank_zero_only.rank == 0:  # DDP: one final line per run, not one per process
        print(final_line(summary))
    return summary["knn_top1"]  # lets Hydra sweepers optimise it


if __name__ == "__main__":
    main()
