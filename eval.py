"""Evaluate a pretrained checkpoint: weighted k-NN, linear probe or full fine-tuning.

    python eval.py protocol=knn ckpt=runs/2026-11-21/10-30-00_simsiam          # k = 10, 20, 100, 200
    python eval.py protocol=linear ckpt=<run_dir> protocol.epochs=20 protocol.batch_size=256
    python eval.py protocol=linear ckpt=<run_dir> protocol.augment=false      # fast path, small data
    python eval.py protocol=finetune ckpt=<run_dir>/checkpoints/epoch=100.ckpt data=cifar10 data.root=...

Writes <run_dir>/eval/<protocol>/eval_summary.json (conf/eval.yaml, conf/protocol/).
"""

import logging
import sys

import hydra
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig

from hvp_lightning.config import ConfigError
from hvp_lightning.evaluate import evaluate


@hydra.main(config_path="conf", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    try:
        summary = evaluate(cfg)
    except (ConfigError, MisconfigurationException) as err:  # bad settings or checkpoint: one line, no traceback
        logging.getLogger("hvp_lightning").error("config error: %s", err)
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    m = summary["metrics"]
    k = f" (k={m['k_for_top1']})" if summary["protocol"] == "knn" else ""
    print(f"{summary['protocol']} top-1: {100 * m['top1']:.2f}%, top-5: {100 * m['top5']:.2f}%{k} "
          f"(chance {100 * summary['chance']:.1f}%) | {summary['out_dir']}/eval_summary.json")
    return m["top1"]


if __name__ == "__main__":
    main()
