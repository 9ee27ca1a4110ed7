"""The paper's transfer table for one checkpoint: linear probe and fine-tuning on CIFAR-10,
CIFAR-100, Flowers102, iNaturalist 2021 and Food101 (conf/transfer.yaml, docs/evaluation.md).

    python transfer.py ckpt=runs/2026-11-21/10-30-00_simsiam root=/datasets accelerator=gpu
    python transfer.py ckpt=<run_dir> root=/datasets datasets=[cifar10,flowers102] protocols=[linear]

Writes <run_dir>/eval/transfer/transfer_table.{csv,md} and each evaluation's eval_summary.json;
with out_dir=, a row per checkpoint, each one's cells in <out_dir>/<run dir name>/.
"""

from hvp_lightning.cli import transfer_main

if __name__ == "__main__":
    transfer_main()
