"""Evaluation of pretrained checkpoints (k-NN, linear probe, fine-tuning).

Not built yet: it arrives with the evaluation issue. Until then, every `train.py` run
reports weighted k-NN top-1/top-5 (DINO protocol) in its summary.json.
"""

import sys

if __name__ == "__main__":
    print("eval.py is coming with the evaluation issue (k-NN, linear probe, fine-tuning); "
          "train.py already reports k-NN accuracy in <run_dir>/summary.json.", file=sys.stderr)
    sys.exit(1)
