"""Evaluate a pretrained checkpoint: weighted k-NN, linear probe or full fine-tuning.

    python eval.py protocol=knn ckpt=runs/2026-11-21/10-30-00_simsiam          # k = 10, 20, 100, 200
    python eval.py protocol=linear ckpt=<run_dir> protocol.epochs=20 protocol.batch_size=256
    python eval.py protocol=linear ckpt=<run_dir> protocol.augment=false      # fast path, small data
    python eval.py protocol=finetune ckpt=<run_dir>/checkpoints/epoch=100.ckpt data=cifar10 data.root=...

Writes <run_dir>/eval/<protocol>/eval_summary.json; for another checkpoint file or data set
<run_dir>/eval/<variant>/<protocol>/ (epoch=100, food101, epoch=100_food101; conf/eval.yaml, conf/protocol/).
"""

from hvp_lightning.cli import evaluate_main

if __name__ == "__main__":
    evaluate_main()
