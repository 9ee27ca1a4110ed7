"""Pretrain a self-supervised model, optionally with Hard View Pretraining.

    python train.py                                  # built-in CPU demo (SimSiam, synthetic shapes)
    python train.py +hvp=on                          # the same with hard views (N=4)
    python train.py data=imagefolder data.root=PATH backbone=resnet18_cifar +hvp=on hvp.num_views=8
"""

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from hvp_lightning.config import ConfigError
from hvp_lightning.train import run


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        summary = run(cfg, run_dir)
    except ConfigError as err:
        logging.getLogger("hvp_lightning").error("config error: %s", err)
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    top1, init = summary["knn_top1"], summary.get("knn_top1_init")
    ref = f"at init {100 * init:.2f}%, " if init is not None else ""
    print(f"k-NN top-1: {100 * top1:.2f}% ({ref}chance {100 * summary['knn_chance']:.1f}%) | run dir: {run_dir}")
    return top1  # lets Hydra sweepers optimise it


if __name__ == "__main__":
    main()
