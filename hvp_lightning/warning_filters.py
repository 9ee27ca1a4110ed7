"""Warnings a run cannot act on, silenced at start-up: each would otherwise print on every run
(or once per process in DDP) and bury the ones that matter; and one console copy of each of
Lightning's log messages."""

from __future__ import annotations

import logging
import os
import warnings

KNOWN = (
    # Lightning's hint, once per epoch-level metric in DDP: the k-NN is computed on features
    # gathered from every rank and the summary reduces the training loss itself; an all-reduce
    # per metric and step would only cost time.
    r"It is recommended to use `self.log\('",
    # The k-NN monitor shards its bank and queries over the ranks on purpose and gathers them.
    r"Using `DistributedSampler` with the dataloaders. During `trainer.validate\(\)`",
    # Lightning 2.6 internals on newer torch (deprecations inside Lightning's own code).
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    r"torch.distributed.nn.functional.all_gather is deprecated",
)


# Lightning's hint on any machine with SLURM's client tools (srun on PATH) when a run was not
# started by srun. Inside a SLURM job it matters (a multi-process run there needs srun), so it is
# silenced only outside one (no SLURM_JOB_ID: a login node, a workstation): there a run is local
# by intent, and the hint would print on every run.
SRUN_HINT = r"The `srun` command is available on your system but is not used"


def silence_known_warnings() -> None:
    for pattern in KNOWN:
        warnings.filterwarnings("ignore", message=pattern)
    if "SLURM_JOB_ID" not in os.environ:
        warnings.filterwarnings("ignore", message=SRUN_HINT)


def one_console_copy_of_lightning_logs() -> None:
    """The ``lightning`` logger prints to the console with a handler of its own and also passes
    each message on to the root logger, to which Hydra gives a console handler (and the file
    handler of ``train.log``): every Lightning message ("GPU available ...", the model summary)
    printed twice. Where the root logger already writes to the console, Lightning's own console
    handler goes; the messages still reach the console and ``train.log`` through the root's."""
    if not any(type(h) is logging.StreamHandler for h in logging.getLogger().handlers):
        return
    lightning_logger = logging.getLogger("lightning")
    for handler in list(lightning_logger.handlers):
        if type(handler) is logging.StreamHandler:
            lightning_logger.removeHandler(handler)


def quiet_console() -> None:
    """What ``train.py`` and ``eval.py`` do at start-up: both of the above."""
    silence_known_warnings()
    one_console_copy_of_lightning_logs()
