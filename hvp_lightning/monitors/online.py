"""The online monitors of a run as a Lightning callback: weighted k-NN on a labelled set and the
label-free monitors (RankMe, feature std), at every validation pass, with their records.

The method's ``validation_step`` returns the evaluated backbone's features of each validation
batch (:meth:`hvp_lightning.methods.base.SSLMethod.validation_step`); :class:`OnlineMonitors`
collects them per loader, gathers every rank's and, at the pass's end, scores k-NN (the ``bank``
and ``test`` loaders) and the monitors (the ``monitor`` loader, else the test set). What each
loader holds is its ``roles`` (the data module's ``eval_roles``).

Its records -- the last result, the value at random init, every pass -- travel in the run's
checkpoints (in ``checkpoint["hvp_lightning"]``, the keys a checkpoint has always held them
under), so a resumed run's history is its checkpoint's and then its own; global rank 0 rewrites
``<run_dir>/monitors.json`` whole (atomically) when fit starts and after every pass, whatever the
logger: ``hvp-monitors`` reads it on a login node while the run trains.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch

from ..run.atomic import atomic_write_text
from ..run.directory import RunDir
from .health import collapse_reason, feature_std, rankme
from .knn import knn_accuracy

log = logging.getLogger(__name__)

RECORDS = ("knn_result", "knn_init", "knn_history", "monitor_result", "monitor_init", "monitor_history")


class OnlineMonitors(L.Callback):
    """k-NN and the label-free monitors at every validation pass (module docstring).

    Args:
        roles: What each validation loader holds, in loader order: ``bank`` and ``test`` (labelled,
            k-NN), ``monitor`` (a held-out unlabelled sample).
        num_classes: Classes of the labelled set (0: none).
        knn_k: k of the k-NN top-1 the run reports.
        knn_temperature: The votes' temperature.
        run_dir: Where ``monitors.json`` goes (None: no file).
        images_seen: The run's images trained so far (a pass's history entry notes it).
    """

    def __init__(
        self,
        roles: tuple[str, ...],
        num_classes: int,
        knn_k: int = 20,
        knn_temperature: float = 0.07,
        run_dir: str | Path | RunDir | None = None,
        images_seen: Callable[[], int] = lambda: 0,
    ) -> None:
        self.roles, self.num_classes = tuple(roles), int(num_classes)
        self.knn_k, self.knn_temperature = knn_k, knn_temperature
        self.path = RunDir.of(run_dir).monitors if run_dir is not None else None
        self.images_seen = images_seen
        self.knn_result: dict[str, Any] = {}
        self.knn_init: float | None = None  # k-NN top-1 at random init (a pass before training)
        self.knn_history: list[dict[str, Any]] = []  # every k-NN pass: the learning curve
        self.monitor_result: dict[str, Any] = {}  # the last pass's RankMe and feature std
        self.monitor_init: dict[str, float] = {}  # their values at random init
        self.monitor_history: list[dict[str, Any]] = []
        self._store: dict[int, list[tuple[torch.Tensor, ...]]] = {}

    @property
    def evaluated_step(self) -> int | None:
        """The optimiser step of the last pass (None before the first)."""
        return (self.knn_result or self.monitor_result).get("step")

    def note_init(self) -> None:
        """The last pass was at random init: keep its values as the reference of training."""
        self.knn_init = self.knn_result.get("top1")
        self.monitor_init = {k: self.monitor_result[k] for k in ("rankme", "feature_std") if k in self.monitor_result}

    # --- a pass ---------------------------------------------------------------------------------
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        feats = outputs.detach().float()
        # an unreadable file's row holds the next readable image: a duplicate the monitors leave out
        flags = [bool(b) for b in batch.get("bad_file", [""] * len(feats))]
        stand_in = torch.tensor(flags, dtype=torch.uint8)  # on the host: moved once per pass (_gathered)
        self._store.setdefault(dataloader_idx, []).append((feats, batch["label"], batch["index"], stand_in))

    def _gathered(self, pl_module: L.LightningModule, idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, labels, stand-in flags) of loader ``idx``, every rank's, each sample once."""
        feats, labels, index, stand_in = (torch.cat(x) for x in zip(*self._store[idx]))
        stand_in = stand_in.to(feats.device)  # uint8: gloo gathers no bool
        if pl_module.trainer.world_size > 1:  # every rank saw a shard; DistributedSampler pads duplicates
            feats, labels, index, stand_in = (
                pl_module.all_gather(x).flatten(0, 1) for x in (feats, labels, index, stand_in)
            )
            order = torch.argsort(index, stable=True)
            index, feats, labels, stand_in = index[order], feats[order], labels[order], stand_in[order]
            keep = torch.ones_like(index, dtype=torch.bool)
            keep[1:] = index[1:] != index[:-1]
            feats, labels, stand_in = feats[keep], labels[keep], stand_in[keep]
        return feats, labels, stand_in.bool()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not set(range(len(self.roles))) <= self._store.keys():
            self._store.clear()
            return
        data = {role: self._gathered(pl_module, i) for i, role in enumerate(self.roles)}
        self._store.clear()
        position = {"step": int(trainer.global_step), "epoch": round(epochs_done(trainer), 4)}
        if "test" in data:  # stand-ins stay: the k-NN's sets keep their size, as DINO's loaders would
            self._knn_pass(pl_module, *data["bank"][:2], *data["test"][:2], position)
        source = "monitor" if "monitor" in data else "test"
        feats, _, stand_in = data[source]
        self._monitor_pass(pl_module, feats[~stand_in], source, position, left_out=int(stand_in.sum()))

    def _knn_pass(
        self,
        pl_module: L.LightningModule,
        bank: torch.Tensor,
        bank_labels: torch.Tensor,
        queries: torch.Tensor,
        query_labels: torch.Tensor,
        position: dict[str, Any],
    ) -> None:
        res = knn_accuracy(bank, bank_labels, queries, query_labels, self.num_classes, self.knn_k, self.knn_temperature)
        trainer = pl_module.trainer
        self.knn_result = dict(
            res, epoch=trainer.current_epoch, step=trainer.global_step, queries=int(queries.shape[0])
        )
        self.knn_history.append(
            {**position, "images_seen": int(self.images_seen()), "top1": float(res["top1"]), "top5": float(res["top5"])}
        )
        pl_module.log("knn/top1", res["top1"], prog_bar=True, add_dataloader_idx=False)
        pl_module.log("knn/top5", res["top5"], add_dataloader_idx=False)
        pl_module.log("knn/epoch", position["epoch"], add_dataloader_idx=False)  # the curves' x (W&B)

    def _monitor_pass(
        self, pl_module: L.LightningModule, feats: torch.Tensor, source: str, position: dict[str, Any], left_out: int
    ) -> None:
        """RankMe and feature std of ``feats`` (every rank has them all; ``left_out`` unreadable
        images' stand-ins not among them: duplicates would pull RankMe down), logged, kept in the
        history, and one warning line naming the epoch when they signal collapse."""
        n, d = feats.shape
        zero = pl_module.trainer.is_global_zero
        if left_out and zero:
            log.warning("label-free monitors: %d unreadable %s images left out (%d used)", left_out, source, n)
        if n == 0:
            return
        values = {"rankme": rankme(feats), "feature_std": feature_std(feats)}
        self.monitor_result = dict(values, images=int(n), dim=int(d), source=source, **position)
        self.monitor_history.append({**position, "images_seen": int(self.images_seen()), **values})
        for key, value in values.items():
            pl_module.log(f"monitor/{key}", value, add_dataloader_idx=False)
        pl_module.log("monitor/epoch", position["epoch"], add_dataloader_idx=False)  # the curves' x (W&B)
        reason = collapse_reason(values["rankme"], values["feature_std"], d)
        if reason is not None and zero:
            what = (  # at random init: the untrained network's features, not a collapse of training
                "at random init, the label-free monitors are below the collapse thresholds"
                if position["step"] == 0
                else f"epoch {position['epoch']}: the label-free monitors signal collapse"
            )
            log.warning("%s: %s (on %d %s images)", what, reason, n, "held-out" if source == "monitor" else "test")

    # --- records --------------------------------------------------------------------------------
    def write(self, trainer: L.Trainer) -> None:
        """``monitors.json``: every pass so far (global rank 0)."""
        if self.path is None or not trainer.is_global_zero:
            return
        last = self.monitor_result
        record = {
            "monitor_dim": last.get("dim"),
            "monitor_images": last.get("images"),
            "monitor_source": last.get("source"),
            "monitor_history": list(self.monitor_history),
            "knn_history": list(self.knn_history),
        }
        atomic_write_text(self.path, json.dumps(record, indent=1) + "\n")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write(trainer)  # after Lightning restored a resumed run's histories

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.write(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """The records as plain values (the checkpoint still loads with ``weights_only=True``)."""
        checkpoint.setdefault("hvp_lightning", {}).update(
            knn_result={k: float(v) for k, v in self.knn_result.items()},
            knn_init=self.knn_init,
            knn_history=list(self.knn_history),
            monitor_result=dict(self.monitor_result),
            monitor_init=dict(self.monitor_init),
            monitor_history=list(self.monitor_history),
        )

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        self.restore(checkpoint.get("hvp_lightning") or {})

    def restore(self, state: dict[str, Any]) -> None:
        """The records of a checkpoint's ``hvp_lightning`` entry."""
        self.knn_result = {
            k: (int(v) if k in ("epoch", "step", "queries") else v) for k, v in (state.get("knn_result") or {}).items()
        }
        self.knn_init = state.get("knn_init")
        self.knn_history = list(state.get("knn_history") or [])
        self.monitor_result = dict(state.get("monitor_result") or {})
        self.monitor_init = dict(state.get("monitor_init") or {})
        self.monitor_history = list(state.get("monitor_history") or [])


def epochs_done(trainer: L.Trainer) -> float:
    """Training epochs completed at a pass (0 at init; from optimiser steps so that a pass after
    the last epoch and one inside the loop agree)."""
    if trainer.global_step == 0:
        return 0.0
    batches = trainer.num_training_batches
    if not isinstance(batches, int) or batches <= 0:  # validate() outside fit: the epoch counter
        return float(trainer.current_epoch)
    return trainer.global_step / max(1, math.ceil(batches / trainer.accumulate_grad_batches))
