"""Pretrain a self-supervised model, optionally with Hard View Pretraining.

    python train.py                                  # built-in CPU demo (SimSiam, synthetic shapes)
    python train.py +hvp=on                          # the same with hard views (N=4)
    python train.py data=imagefolder data.root=PATH backbone=resnet18_cifar +hvp=on hvp.num_views=8
    python train.py resume=runs/2026-11-21/10-30-00_simsiam     # continue an interrupted run
"""

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
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


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        if cfg.get("resume"):  # continue that run with its own config (+ key=value overrides)
            cfg = resume_config(cfg.resume, list(HydraConfig.get().overrides.task))
            run_dir = Path(cfg.resume)
        summary = run(cfg, run_dir)
    except (ConfigError, MisconfigurationException) as err:  # bad settings: one line, no traceback
        logging.getLogger("hvp_lightning").error("config error: %s", err)
        print(f"config error: {err}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # this job fails, the sweep goes on; its sweep_summary.csv row says failed
        sys.exit(2)
    if rank_zero_only.rank == 0:  # DDP: one final line per run, not one per process
        print(final_line(summary))
    return summary["knn_top1"]  # lets Hydra sweepers optimise it


if __name__ == "__main__":
    main()
