"""Evaluation of pretrained checkpoints (``python eval.py``, ``hvp-eval``), by concern:

* :mod:`.run` -- :func:`evaluate`, the entry point, and the k-NN / classifier runners;
* :mod:`.protocols` -- each protocol's recipe and its validation;
* :mod:`.data` -- labelled splits, transforms, loaders;
* :mod:`.features` -- the feature function of a backbone and feature extraction;
* :mod:`.probe` -- the linear head: linear probe and fine-tuning;
* :mod:`.loggers` -- CSV or W&B logging of an evaluation;
* :mod:`.transfer` -- the paper's transfer table: every (dataset, protocol) cell in one process.

The top layer below the console commands: imports ``training/`` (loading a checkpoint builds its
method), ``nn/``, ``data/``, ``cluster/``, ``run/``, ``config``, ``schema/`` (the validated configs,
typed) and the leaves.
"""

from .run import evaluate

__all__ = ["evaluate"]
