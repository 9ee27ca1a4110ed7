"""Base LightningModule shared by all SSL methods: backbone, optimiser and schedule,
online k-NN and label-free monitors, run counters. Methods add their heads, loss and HVP hooks."""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from ..cluster.distributed import gather_per_rank, rank_entries
from ..config import smallest_resnet_side
from ..data.augment import ViewAug
from ..data.datamodule import eval_roles, view_aug
from ..data.datasets import note_skipped
from ..data.iou_policy import iou_policy
from ..data.static_colour import coloured, share_colour, uncoloured
from ..nn.backbones import build_backbone
from ..nn.health import collapse_reason, feature_std, rankme
from ..nn.knn import knn_accuracy
from ..nn.optim import make_optimizer, warmup_cosine
from ..nn.sync_free import device_number
from ..nn.teacher import MomentumTargetMixin
from ..run.epoch_metrics import log_epoch_value
from ..schema import backbone_family
from ..selection import hvp_config

log = logging.getLogger(__name__)


class SSLMethod(L.LightningModule):
    """Everything a method needs that is not its loss. Subclasses implement ``ssl_step``
    and may override ``param_groups`` (e.g. SimSiam's fixed-LR predictor).

    Args:
        cfg: The run config (``DictConfig`` or plain dict); a plain dict is converted.
    """

    #: What HVP's selection pass computes outside the networks, where it is not small: model FLOPs
    #: (``nn/flops.py``) leave it out, so a run says so when it counts them (``training/cost.py``).
    uncounted_selection_work: str | None = None

    def __init__(self, cfg: DictConfig | dict) -> None:
        super().__init__()
        cfg = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
        self.save_hyperparameters({"cfg": OmegaConf.to_container(cfg, resolve=True)})
        self.cfg = cfg
        self.seed = int(cfg.get("seed", 0))
        self.hvp = hvp_config(cfg)
        self.backbone = build_backbone(cfg.backbone)
        self.num_classes = int(cfg.data.get("num_classes") or 0)
        self.images_seen = 0
        self.skipped_files: set[str] = set()
        self.knn_result: dict[str, float] = {}
        self.knn_init: float | None = None  # k-NN top-1 at random init (eval.at_start)
        self.knn_history: list[dict[str, float]] = []  # every k-NN pass: the learning curve in summary.json
        self.eval_roles = eval_roles(cfg.data)  # what each validation loader holds
        self.monitor_result: dict[str, Any] = {}  # the last pass's label-free monitors (RankMe, feature std)
        self.monitor_init: dict[str, float] = {}  # their values at random init (eval.at_start)
        self.monitor_history: list[dict[str, Any]] = []  # every pass's
        self._val_store: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}
        self.compiled_modules: list[str] = []  # filled by configure_model (method.compile)
        self.iou_policy = iou_policy(cfg) if cfg.get("trainer") is not None else None  # data.iou_policy
        self.iou_fallbacks = torch.zeros((), dtype=torch.int64)  # this rank's fallback pairs, whole run

    # --- hooks for methods ---------------------------------------------------------------
    @classmethod
    def view_augs(cls, cfg: DictConfig) -> tuple[ViewAug, ...]:
        """Augmentation of each view the loader produces per image, in order: 2 for the
        baseline, ``hvp.num_views`` candidates with HVP. Multi-crop methods override this."""
        return (view_aug(cfg.data),) * hvp_config(cfg).views_per_image

    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def uncoloured_candidates(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``hvp.colour=static`` (:mod:`hvp_lightning.data.static_colour`), the hook
        :class:`~hvp_lightning.selection.HardViewMixin` asks: the loader's uint8 candidates
        normalised without colour, every candidate's colour parameters its image's view 0's."""
        views = uncoloured(batch["views"], view_aug(self.cfg.data))
        return dict(batch, views=views, params=share_colour(batch["params"]))

    def colour_views(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``hvp.colour=static``: the chosen uint8 views coloured with their (shared) parameters
        and normalised, as the loader would have made them."""
        return dict(batch, views=coloured(batch["views"], batch["params"], view_aug(self.cfg.data)))

    def selection_size_rule(self) -> tuple[int, int]:
        """``hvp.selection_scale``: (multiple, minimum) of a view's side in the selection pass
        (:func:`~hvp_lightning.selection.scale.selection_side`): a ViT's patch (whole token grid),
        a ResNet's smallest input (8 px with the CIFAR stem, else 32 px), 32 px for another timm
        model (the total stride of the common CNNs)."""
        patch = self.backbone.patch_size
        if patch:
            return int(patch), int(patch)
        b = self.cfg.backbone
        return 1, smallest_resnet_side(b) if backbone_family(b) == "resnet" else 32

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        return self.ssl_step(batch, batch_idx)

    def param_groups(self) -> list[dict[str, Any]]:
        """Optimiser parameter groups; a group may carry ``fixed_lr`` (no schedule) or ``lr_scale``
        (its peak lr relative to the scaled ``base_lr``)."""
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]

    def configure_model(self) -> None:
        """``method.compile``: ``torch.compile`` every backbone (student, and teacher where
        there is one) in place, so state-dict keys and checkpoints stay as without it. Done
        here, once the model is complete, not in ``__init__``: DINO/iBOT deep-copy the student
        into the teacher there, and a copied compiled module would call the original."""
        if not self.cfg.method.get("compile", False) or self.compiled_modules:
            return
        for name, module in self.named_modules():
            if name.split(".")[-1] == "backbone":
                module.compile()
                self.compiled_modules.append(name)

    @torch.no_grad()
    def start_backbone_from(self, state: dict[str, torch.Tensor]) -> None:
        """Released weights into the backbone's trunk (strict; ``backbone.init``), before training.
        A momentum target (DINO/iBOT's teacher, BYOL/MoCo v3's target) was copied from the
        backbone at construction: it gets the same weights, so it starts equal to the student."""
        self.backbone.trunk.load_state_dict(state, strict=True)
        if isinstance(self, MomentumTargetMixin):
            for target, online in self.momentum_pairs():
                if online is self.backbone:
                    target.load_state_dict(online.state_dict(), strict=True)

    @property
    def eval_backbone(self) -> torch.nn.Module:
        """Backbone whose features are evaluated (the teacher's for DINO/iBOT)."""
        return self.backbone

    # --- optimisation --------------------------------------------------------------------
    @property
    def global_batch_size(self) -> int:
        """Images per optimiser step over all processes (devices x nodes) and accumulated
        micro-batches: the batch the papers' learning-rate rules refer to."""
        t = self.trainer
        return self.cfg.method.batch_size * t.world_size * t.accumulate_grad_batches

    def configure_optimizers(self):
        opt_cfg = self.cfg.method.optimizer
        lr = opt_cfg.base_lr * self.global_batch_size / 256  # linear scaling rule (all four papers)
        # DINO/iBOT end the cosine at an absolute min_lr (1e-6) whatever the batch; the others at a ratio (0).
        final_ratio = opt_cfg.min_lr / lr if opt_cfg.get("min_lr") is not None else opt_cfg.final_lr_ratio
        groups = self.param_groups()
        for g in groups:  # a group's own lr relative to the others' (Barlow Twins' biases)
            if "lr_scale" in g:
                g["lr"] = lr * g.pop("lr_scale")
        opt = make_optimizer(
            opt_cfg.name, groups, lr, opt_cfg.weight_decay, opt_cfg.get("momentum", 0.9), opt_cfg.get("eta", 1e-3)
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        steps_per_epoch = max(1, total // max(1, self.trainer.max_epochs or 1))
        warmup = int(opt_cfg.warmup_epochs * steps_per_epoch)

        def schedule(step: int) -> float:
            return warmup_cosine(step, total, warmup, final_ratio)

        lambdas = [(lambda _: 1.0) if g.get("fixed_lr") else schedule for g in groups]
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambdas)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # --- counters --------------------------------------------------------------------------
    def on_train_batch_end(self, outputs: Any, batch: dict[str, Any], batch_idx: int) -> None:
        self.images_seen += int(batch["label"].shape[0]) * self.trainer.world_size
        note_skipped(self.skipped_files, batch.get("bad_file", ()))
        if self.iou_policy is not None:
            self._log_iou_policy(batch["params"]["iou_fallback"])
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False, batch_size=1)  # type: ignore[union-attr]

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's ``log``, a Python number made on the module's device first
        (:func:`.nn.sync_free.device_number`, the value Lightning would make): Lightning copies
        it from the host, which waits for the GPU's queue on every logged number of a step.
        A training value's epoch aggregate is kept by the run's ``EpochAggregates`` callback, so
        that it survives a mid-epoch resume (:mod:`hvp_lightning.run.epoch_metrics`)."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = device_number(value, self.device)
        if args or not log_epoch_value(self, name, value, kwargs):
            super().log(name, value, *args, **kwargs)

    def _log_iou_policy(self, flags: torch.Tensor) -> None:
        """``data/iou_fallbacks``: pairs that kept their last try (flags mark both views), summed
        over the epoch and the ranks; ``data/iou_threshold``: the epoch's threshold."""
        fallbacks = (flags.sum() / 2).round().long()
        self.iou_fallbacks = self.iou_fallbacks.to(fallbacks.device) + fallbacks  # no host sync
        kw: dict[str, Any] = {"on_step": False, "on_epoch": True, "batch_size": 1}
        self.log("data/iou_fallbacks", fallbacks.float(), reduce_fx="sum", sync_dist=True, **kw)
        self.log("data/iou_threshold", self.iou_policy.threshold(self.current_epoch), **kw)  # type: ignore[union-attr]

    # --- run state in checkpoints (resume) ------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Run counters that are not tensors of the module: they travel in the checkpoint as
        plain values (it still loads with ``torch.load(weights_only=True)``); HVP's run totals
        are added by :class:`~hvp_lightning.selection.HardViewMixin`. Skipped files are kept
        per rank (each rank reads its own share of the data; the summary unites them)."""
        checkpoint["hvp_lightning"] = {
            "images_seen": int(self.images_seen),
            "skipped_files": gather_per_rank(sorted(self.skipped_files)),
            "knn_result": {k: float(v) for k, v in self.knn_result.items()},
            "knn_init": self.knn_init,
            "knn_history": list(self.knn_history),
            "monitor_result": dict(self.monitor_result),
            "monitor_init": dict(self.monitor_init),
            "monitor_history": list(self.monitor_history),
            "iou_fallbacks": gather_per_rank(int(self.iou_fallbacks)),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("hvp_lightning")
        if not state:
            return
        self.images_seen = int(state["images_seen"])
        self.skipped_files = set().union(*rank_entries(per_rank_files(state["skipped_files"])))
        self.knn_result = {
            k: (int(v) if k in ("epoch", "step", "queries") else v) for k, v in state["knn_result"].items()
        }
        self.knn_init = state.get("knn_init")
        self.knn_history = list(state.get("knn_history", []))
        self.monitor_result = dict(state.get("monitor_result", {}))
        self.monitor_init = dict(state.get("monitor_init", {}))
        self.monitor_history = list(state.get("monitor_history", []))
        self.iou_fallbacks = torch.tensor(sum(rank_entries(state.get("iou_fallbacks") or [0])), dtype=torch.int64)

    # --- online monitors (validation loop: the loaders of ``self.eval_roles``) --------------
    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        feats = self.eval_backbone(batch["image"]).float()  # raw: RankMe's input; k-NN normalises
        # an unreadable file's row holds the next readable image: a duplicate the monitors leave out
        flags = [bool(b) for b in batch.get("bad_file", [""] * len(feats))]
        stand_in = torch.tensor(flags, dtype=torch.uint8)  # on the host: moved once per pass (_gathered)
        self._val_store.setdefault(dataloader_idx, []).append((feats, batch["label"], batch["index"], stand_in))
        note_skipped(self.skipped_files, batch.get("bad_file", ()))

    @property
    def evaluated_step(self) -> int | None:
        """The optimiser step of the last evaluation pass (None before the first)."""
        return (self.knn_result or self.monitor_result).get("step")

    def _epochs_done(self) -> float:
        """Training epochs completed at this k-NN pass (0 at init; from optimiser steps so that a
        pass after the last epoch and one inside the loop agree)."""
        if self.global_step == 0:
            return 0.0
        batches = self.trainer.num_training_batches
        if not isinstance(batches, int) or batches <= 0:  # validate() outside fit: the epoch counter
            return float(self.current_epoch)
        return self.global_step / max(1, math.ceil(batches / self.trainer.accumulate_grad_batches))

    def _gathered(self, idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, labels, stand-in flags) of loader ``idx``, every rank's, each sample once."""
        feats, labels, index, stand_in = (torch.cat(x) for x in zip(*self._val_store[idx]))
        stand_in = stand_in.to(feats.device)  # uint8: gloo gathers no bool
        if self.trainer.world_size > 1:  # every rank saw a shard; DistributedSampler pads duplicates
            feats, labels, index, stand_in = (
                self.all_gather(x).flatten(0, 1) for x in (feats, labels, index, stand_in)
            )
            order = torch.argsort(index, stable=True)
            index, feats, labels, stand_in = index[order], feats[order], labels[order], stand_in[order]
            keep = torch.ones_like(index, dtype=torch.bool)
            keep[1:] = index[1:] != index[:-1]
            feats, labels, stand_in = feats[keep], labels[keep], stand_in[keep]
        return feats, labels, stand_in.bool()

    def on_validation_epoch_end(self) -> None:
        if not set(range(len(self.eval_roles))) <= self._val_store.keys():
            self._val_store.clear()
            return
        data = {role: self._gathered(i) for i, role in enumerate(self.eval_roles)}
        self._val_store.clear()
        position = {"step": int(self.global_step), "epoch": round(self._epochs_done(), 4)}
        if "test" in data:  # stand-ins stay: the k-NN's sets keep their size, as DINO's loaders would
            self._knn_pass(*data["bank"][:2], *data["test"][:2], position)
        source = "monitor" if "monitor" in data else "test"
        feats, _, stand_in = data[source]
        self._monitor_pass(feats[~stand_in], source, position, left_out=int(stand_in.sum()))

    def _knn_pass(
        self,
        bank: torch.Tensor,
        bank_labels: torch.Tensor,
        queries: torch.Tensor,
        query_labels: torch.Tensor,
        position: dict[str, Any],
    ) -> None:
        knn = self.cfg.eval
        res = knn_accuracy(bank, bank_labels, queries, query_labels, self.num_classes, knn.knn_k, knn.knn_temperature)
        self.knn_result = dict(res, epoch=self.current_epoch, step=self.global_step, queries=int(queries.shape[0]))
        self.knn_history.append(
            {**position, "images_seen": int(self.images_seen), "top1": float(res["top1"]), "top5": float(res["top5"])}
        )
        self.log("knn/top1", res["top1"], prog_bar=True, add_dataloader_idx=False)
        self.log("knn/top5", res["top5"], add_dataloader_idx=False)
        self.log("knn/epoch", position["epoch"], add_dataloader_idx=False)  # the curves' x (W&B)

    def _monitor_pass(self, feats: torch.Tensor, source: str, position: dict[str, Any], left_out: int = 0) -> None:
        """RankMe and feature std of ``feats`` (every rank has them all; ``left_out`` unreadable
        images' stand-ins not among them: duplicates would pull RankMe down), logged, kept in the
        history, and one warning line naming the epoch when they signal collapse."""
        n, d = feats.shape
        if left_out and self.trainer.is_global_zero:
            log.warning("label-free monitors: %d unreadable %s images left out (%d used)", left_out, source, n)
        if n == 0:
            return
        values = {"rankme": rankme(feats), "feature_std": feature_std(feats)}
        self.monitor_result = dict(values, images=int(n), dim=int(d), source=source, **position)
        self.monitor_history.append({**position, "images_seen": int(self.images_seen), **values})
        for key, value in values.items():
            self.log(f"monitor/{key}", value, add_dataloader_idx=False)
        self.log("monitor/epoch", position["epoch"], add_dataloader_idx=False)  # the curves' x (W&B)
        reason = collapse_reason(values["rankme"], values["feature_std"], d)
        if reason is not None and self.trainer.is_global_zero:
            what = (  # at random init: the untrained network's features, not a collapse of training
                "at random init, the label-free monitors are below the collapse thresholds"
                if position["step"] == 0
                else f"epoch {position['epoch']}: the label-free monitors signal collapse"
            )
            log.warning("%s: %s (on %d %s images)", what, reason, n, "held-out" if source == "monitor" else "test")


def per_rank_files(saved: list[list[str]] | list[str]) -> list[list[str]]:
    """Skipped files as saved per rank; a checkpoint from before that holds one list, the
    writer's (rank 0's): the whole run's for a single process, other ranks' never saved."""
    return [saved] if saved and isinstance(saved[0], str) else saved  # type: ignore[list-item,return-value]
