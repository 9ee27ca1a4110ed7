"""Warnings a run cannot act on, silenced at start-up: each would otherwise print on every run
(or once per process in DDP) and bury the ones that matter."""

from __future__ import annotations

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


def silence_known_warnings() -> None:
    for pattern in KNOWN:
        warnings.filterwarnings("ignore", message=pattern)
