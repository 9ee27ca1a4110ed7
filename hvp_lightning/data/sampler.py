"""The training order: a function of (seed, epoch), split across ranks, resumable at any batch.

:class:`EpochSampler` yields ``(epoch, index)`` keys: the loader workers learn the epoch with
each index (a persistent worker keeps its own copy of the dataset, so an epoch set on the
dataset in the training process would never reach it), and a view's random numbers are a
function of (seed, epoch, index, slot) (:mod:`.seeds`). The epoch's order is
``randperm(n)`` from a generator seeded by a hash of (seed, epoch); rank ``r`` of ``w`` takes
``order[r::w]`` of its first ``w * (n // w)`` entries (``DistributedSampler``'s split with
``drop_last``). It subclasses ``DistributedSampler`` so that Lightning's DDP keeps it instead
of injecting its own (``use_distributed_sampler`` replaces only samplers that are not one).

:class:`ResumableLoader` is a ``DataLoader`` with ``state_dict``/``load_state_dict``: Lightning
saves that state with its fit loop in every checkpoint and loads it into the loader of a
resumed run before its first ``iter`` (``FitLoop.setup_data``), which is when loader workers
start taking indices. The state is the epoch and the number of batches of it already trained,
read from the trainer's loop at the moment of the save, so a run resumed from a checkpoint
written at any batch end trains exactly the batches the interrupted one had not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from .seeds import MASK, mix64

SHUFFLE_DOMAIN = 0x5348554646  # "SHUFF": keeps the order's seeds apart from the views' keys


def order_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch``'s order in the run seeded ``seed``."""
    return mix64((mix64((SHUFFLE_DOMAIN + seed) & MASK) + epoch) & MASK)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """``randperm(n)`` of epoch ``epoch``: the same on every rank and in every session."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(order_seed(seed, epoch)))


class EpochSampler(DistributedSampler):
    """This rank's ``(epoch, index)`` keys of the epoch set by :meth:`set_epoch`, from batch
    :attr:`start` on (0 but for the first epoch of a resumed run). ``len`` is the whole
    epoch's share, as Lightning counts the epoch's batches from it."""

    def __init__(self, dataset: Dataset, batch_size: int, seed: int, rank: int = 0, world: int = 1) -> None:
        super().__init__(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.start = 0  # batches of self.epoch already trained

    def __len__(self) -> int:
        return len(self.dataset) // self.num_replicas  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Lightning calls this before each epoch; a new epoch starts at its first batch."""
        if epoch != self.epoch:
            self.epoch, self.start = epoch, 0

    def resume_at(self, epoch: int, batches: int) -> None:
        """The next iteration yields epoch ``epoch`` from its batch ``batches`` on."""
        self.epoch, self.start = epoch, batches

    def shard(self, epoch: int) -> torch.Tensor:
        """This rank's indices of epoch ``epoch``, in order."""
        n = len(self.dataset)  # type: ignore[arg-type]
        return epoch_order(n, self.seed, epoch)[: len(self) * self.num_replicas][self.rank :: self.num_replicas]

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        epoch, start = self.epoch, self.start
        self.start = 0  # once: the epoch after a resumed one starts at its beginning
        for i in self.shard(epoch)[start * self.batch_size :].tolist():
            yield epoch, i


class ResumableLoader(DataLoader):
    """A training loader whose checkpoint state is where training stands in its epochs.

    ``position()`` (the data module's) says, at the moment of a save, which epoch is running and
    how many of its batches are trained; :meth:`load_state_dict` makes the sampler continue
    there. No worker or RNG state is needed: the views are functions of their keys."""

    def __init__(
        self, dataset: Dataset, sampler: EpochSampler, position: Callable[[], tuple[int, int]], **kwargs: Any
    ) -> None:
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.position = position

    def state_dict(self) -> dict[str, int]:
        epoch, batches = self.position()
        return {"epoch": epoch, "batches": batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        assert isinstance(self.sampler, EpochSampler)
        self.sampler.resume_at(int(state["epoch"]), int(state["batches"]))
