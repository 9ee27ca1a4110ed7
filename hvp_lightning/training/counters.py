"""A run's counters that belong to its data, as a Lightning callback: the images trained, the
files that could not be read, and the IoU policy's fallback pairs.

Kept in the run's checkpoints (``checkpoint["hvp_lightning"]``, the keys a checkpoint has always
held them under): the images as one number, the skipped files and the fallbacks per rank (each
rank reads its own share of the data; the summary unites them).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from ..cluster.distributed import gather_per_rank, rank_entries
from ..data.datasets import note_skipped
from ..data.iou_policy import IoUPolicy


class RunCounters(L.Callback):
    """Images trained, unreadable files met, and with ``data.iou_policy`` the pairs that kept their
    last try (``data/iou_fallbacks``, summed over the epoch and the ranks) and the epoch's threshold
    (``data/iou_threshold``).

    Args:
        iou_policy: The run's IoU policy (None: none).
    """

    def __init__(self, iou_policy: IoUPolicy | None = None) -> None:
        self.iou_policy = iou_policy
        self.images_seen = 0
        self.skipped_files: set[str] = set()
        self.iou_fallbacks = torch.zeros((), dtype=torch.int64)  # this rank's, whole run

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.images_seen += int(batch["views"][0].shape[0]) * trainer.world_size
        note_skipped(self.skipped_files, batch.get("bad_file", ()))
        if self.iou_policy is not None:
            self._log_iou_policy(pl_module, batch["params"]["iou_fallback"])

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        note_skipped(self.skipped_files, batch.get("bad_file", ()))

    def _log_iou_policy(self, pl_module: L.LightningModule, flags: torch.Tensor) -> None:
        fallbacks = (flags.sum() / 2).round().long()  # flags mark both views of a pair
        self.iou_fallbacks = self.iou_fallbacks.to(fallbacks.device) + fallbacks  # no host sync
        kw: dict[str, Any] = {"on_step": False, "on_epoch": True, "batch_size": 1}
        pl_module.log("data/iou_fallbacks", fallbacks.float(), reduce_fx="sum", sync_dist=True, **kw)
        pl_module.log("data/iou_threshold", self.iou_policy.threshold(pl_module.current_epoch), **kw)  # type: ignore[union-attr]

    def skipped(self) -> list[str]:
        """Every rank's skipped files, sorted (a collective under DDP)."""
        return sorted(set().union(*gather_per_rank(sorted(self.skipped_files))))

    def fallback_pairs(self, trainer: L.Trainer) -> int:
        """The IoU policy's fallback pairs of all ranks over the whole run (a collective)."""
        total = trainer.strategy.reduce(self.iou_fallbacks.to(trainer.strategy.root_device).clone(), "sum")
        return int(total)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint.setdefault("hvp_lightning", {}).update(
            images_seen=int(self.images_seen),
            skipped_files=gather_per_rank(sorted(self.skipped_files)),
            iou_fallbacks=gather_per_rank(int(self.iou_fallbacks)),
        )

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("hvp_lightning")
        if not state:
            return
        self.images_seen = int(state.get("images_seen", 0))
        self.skipped_files = set().union(*rank_entries(per_rank_files(state.get("skipped_files") or [])))
        self.iou_fallbacks = torch.tensor(sum(rank_entries(state.get("iou_fallbacks") or [0])), dtype=torch.int64)


def per_rank_files(saved: list[list[str]] | list[str]) -> list[list[str]]:
    """Skipped files as saved per rank; a checkpoint that holds one list holds the writer's (rank
    0's): the whole run's for a single process, other ranks' never saved."""
    return [saved] if saved and isinstance(saved[0], str) else saved  # type: ignore[list-item,return-value]
