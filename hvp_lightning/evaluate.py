"""Evaluation of pretrained checkpoints (``python eval.py``): weighted k-NN, linear probe,
full fine-tuning. Each writes ``eval_summary.json`` into ``<run_dir>/eval/<protocol>/`` and
logs to the pretraining run's logger kind (CSV next to the summary, or a W&B run in the
group named after the pretraining run).

Features are the checkpoint's ``eval_backbone``: the backbone, or the EMA teacher's for
DINO/iBOT (``student=true`` picks the student's).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchvision.transforms import v2 as T
from torchvision.transforms.v2 import functional as TF

from .backbones import Backbone
from .checkpoint import build_method, checkpoint_config, load_checkpoint, resolve_checkpoint
from .config import fail, int_at_least, validate_backbone, validate_data
from .data.augment import EvalTransform, normalize, to_uint8_tensor
from .data.datamodule import EvalDataset, subset, build_raw_datasets, resolve_auto_crop
from .device import runs_on_cpu
from .errors import ConfigError
from .knn import knn_accuracies
from .optim import make_optimizer, warmup_cosine

log = logging.getLogger(__name__)

PROTOCOLS = ("knn", "linear", "finetune")
OPTIMIZERS = ("sgd", "lars", "adamw")
# Finetune tables: which one a method's checkpoint uses (the paper has DINO ViT-S and SimSiam RN50).
FINETUNE_TABLE = {"dino": "dino", "ibot": "dino", "simsiam": "simsiam", "simclr": "simsiam"}


# --- features ---------------------------------------------------------------------------------
class FeatureNet(nn.Module):
    """Image -> feature vector. ResNets: the pooled trunk output. ViTs: the final CLS token,
    or (DINO's linear evaluation) the CLS tokens of the last ``n_last_blocks`` blocks, each
    through the final norm, concatenated, optionally with the mean patch token of the last."""

    def __init__(self, backbone: Backbone, n_last_blocks: int = 1, avgpool_patchtokens: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.is_vit = hasattr(backbone.trunk, "get_intermediate_layers")
        self.n = n_last_blocks if self.is_vit else 1
        self.avgpool = avgpool_patchtokens and self.is_vit
        self.feature_dim = backbone.feature_dim * (self.n + int(self.avgpool))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.is_vit or (self.n == 1 and not self.avgpool):
            return self.backbone(x)
        layers = self.backbone.trunk.get_intermediate_layers(x, n=self.n, return_prefix_tokens=True, norm=True)
        out = [prefix[:, 0] for _, prefix in layers]
        if self.avgpool:
            out.append(layers[-1][0].mean(1))
        return torch.cat(out, dim=-1)


class _Extract(L.LightningModule):
    """Frozen features of a loader, through ``trainer.predict`` (progress bar, device, precision)."""

    def __init__(self, net: FeatureNet) -> None:
        super().__init__()
        self.net = net

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(batch["image"]).float().cpu(), batch["label"].cpu()


class Classifier(L.LightningModule):
    """A linear head on features: frozen (linear probe, backbone in eval mode, no gradients),
    trained (fine-tuning) or precomputed (``features=None``: batches are feature tensors)."""

    def __init__(self, features: FeatureNet | None, feature_dim: int, num_classes: int, settings: dict[str, Any],
                 finetune: bool = False) -> None:
        super().__init__()
        self.features, self.settings, self.finetune, self.num_classes = features, settings, finetune, num_classes
        self.head = nn.Linear(feature_dim, num_classes)
        nn.init.normal_(self.head.weight, std=0.01)  # as the SimSiam / DINO linear classifiers
        nn.init.zeros_(self.head.bias)
        if features is not None:
            features.requires_grad_(finetune)  # the teacher copy comes frozen
        # top-1 hits, top-5 hits, samples: a buffer, so it sits on the device of the batches it counts
        self.register_buffer("test_counts", torch.zeros(3, dtype=torch.long), persistent=False)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.features is not None and not self.finetune:
            self.features.eval()  # frozen: BatchNorm statistics stay the pretrained ones
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.features is not None:
            if self.finetune:
                x = self.features(x)
            else:
                with torch.no_grad():
                    x = self.features(x)
        return self.head(x.float() if self.features is None else x)

    @staticmethod
    def _xy(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return (batch["image"], batch["label"]) if isinstance(batch, dict) else (batch[0], batch[1])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self._xy(batch)
        logits = self(x)
        loss = F.cross_entropy(logits.float(), y)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=y.shape[0])
        self.log("train/acc", (logits.argmax(1) == y).float().mean(), on_step=False, on_epoch=True, batch_size=y.shape[0])
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, on_epoch=False, batch_size=1)  # type: ignore[union-attr]
        return loss

    def on_validation_epoch_start(self) -> None:
        self.test_counts.zero_()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = self._xy(batch)
        top = self(x).topk(min(5, self.num_classes), dim=1).indices
        hit = top == y[:, None]
        self.test_counts += torch.stack([hit[:, 0].sum(), hit.any(1).sum(), y.new_tensor(y.shape[0])])

    def on_validation_epoch_end(self) -> None:
        n = max(1, int(self.test_counts[2]))
        self.log("eval/top1", self.test_counts[0].item() / n, prog_bar=True)
        self.log("eval/top5", self.test_counts[1].item() / n)

    @property
    def test_metrics(self) -> dict[str, float]:
        n = max(1, int(self.test_counts[2]))
        return {"top1": self.test_counts[0].item() / n, "top5": self.test_counts[1].item() / n}

    def configure_optimizers(self):
        s = self.settings
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if p.requires_grad:
                (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        opt = make_optimizer(s["optimizer"], groups, s["lr"], s["weight_decay"], s.get("momentum", 0.9))
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(s.get("warmup_epochs", 0) * total / max(1, s["epochs"]))

        def schedule(step: int) -> float:  # linear warm-up, then cosine to 0 (per step)
            return warmup_cosine(step, total, warmup)

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


# --- data -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainTransform:
    """RandomResizedCrop + horizontal flip + normalise: the linear-probe / fine-tuning views."""

    size: int
    scale: tuple[float, float]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    def __call__(self, img) -> torch.Tensor:
        x = to_uint8_tensor(img)
        top, left, h, w = T.RandomResizedCrop.get_params(x, list(self.scale), [3 / 4, 4 / 3])
        x = TF.resized_crop(x, top, left, h, w, [self.size, self.size], antialias=True)
        if torch.rand(()) < 0.5:
            x = TF.horizontal_flip(x)
        return normalize(x, self.mean, self.std)


@dataclass
class EvalData:
    train: Dataset  # the labelled training split (raw)
    test: Dataset
    classes: list[str]
    cfg: DictConfig


def eval_data(data_cfg: DictConfig) -> EvalData:
    _, bank, test, classes = build_raw_datasets(data_cfg)
    bank = subset(bank, data_cfg.get("train_subset"), seed=0)
    test = subset(test, data_cfg.get("test_subset"), seed=1)
    return EvalData(bank, test, list(classes), data_cfg)


def _loader(ds: Dataset, batch_size: int, workers: int, train: bool, drop_last: bool = False) -> DataLoader:
    return DataLoader(ds, batch_size=batch_size, shuffle=train, drop_last=drop_last, num_workers=workers,
                      persistent_workers=False, pin_memory=torch.cuda.is_available())


def _eval_transform(d: DictConfig) -> EvalTransform:
    return EvalTransform(d.crop_size, d.eval_crop_ratio, tuple(d.mean), tuple(d.std))


# --- config -------------------------------------------------------------------------------------
def protocol_settings(p: DictConfig, method: str, dataset: str) -> dict[str, Any]:
    """The protocol's recipe for this checkpoint, with every non-null ``protocol.*`` key on top."""
    if p.name == "knn":
        ks = list(p.ks) if OmegaConf.is_list(p.ks) else p.ks
        return {"ks": ks, "temperature": p.temperature, "batch_size": p.batch_size}
    recipe = method if p.recipe == "auto" else p.recipe
    if p.name == "linear":
        if recipe not in p.recipes:
            fail("protocol.recipe", p.recipe, f"auto or one of {', '.join(p.recipes)}")
        base = dict(OmegaConf.to_container(p.recipes[recipe], resolve=True))  # type: ignore[arg-type]
    else:
        recipe = FINETUNE_TABLE.get(recipe, recipe) if p.recipe == "auto" else recipe
        if recipe not in p.tables:
            fail("protocol.recipe", p.recipe, f"auto or one of {', '.join(p.tables)}")
        table = p.tables[recipe]
        row = p.table_row if p.table_row != "auto" else (dataset if dataset in table.base_lr else "cifar10")
        if row not in table.base_lr:
            fail("protocol.table_row", p.table_row, f"auto or one of {', '.join(table.base_lr)}")
        base = {"optimizer": "adamw", "batch_size": table.batch_size, "weight_decay": table.weight_decay,
                "base_lr": table.base_lr[row], "epochs": table.epochs[row], "table_row": row}
    skip = {"name", "recipe", "recipes", "tables", "table_row"}
    for key, value in p.items():
        if key not in skip and value is not None:
            base[str(key)] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    base["recipe"] = recipe
    return base


def _validate_settings(s: dict[str, Any], protocol: str) -> None:
    node = OmegaConf.create({"protocol": {k: v for k, v in s.items()}})
    if protocol == "knn":
        ks = s["ks"]
        if not isinstance(ks, list) or not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
            fail("protocol.ks", ks, "a non-empty list of integers >= 1")
        if not isinstance(s["temperature"], (int, float)) or not s["temperature"] > 0:
            fail("protocol.temperature", s["temperature"], "expected > 0")
        int_at_least(node, "protocol.batch_size", 1)
        return
    for key in ("batch_size", "epochs", "lr_ref_batch"):
        int_at_least(node, f"protocol.{key}", 1)
    if s["optimizer"] not in OPTIMIZERS:
        fail("protocol.optimizer", s["optimizer"], f"one of {', '.join(OPTIMIZERS)}")
    if not isinstance(s["base_lr"], (int, float)) or not s["base_lr"] > 0:
        fail("protocol.base_lr", s["base_lr"], "expected > 0")
    if not isinstance(s["weight_decay"], (int, float)) or s["weight_decay"] < 0:
        fail("protocol.weight_decay", s["weight_decay"], "expected >= 0")
    scale = s["train_crop_scale"]
    if (not isinstance(scale, list) or len(scale) != 2 or not all(isinstance(v, (int, float)) for v in scale)
            or not 0 < scale[0] <= scale[1] <= 1):
        fail("protocol.train_crop_scale", s["train_crop_scale"], "two numbers 0 < min <= max <= 1")
    for key in ("momentum", "warmup_epochs"):
        if key in s and (isinstance(s[key], bool) or not isinstance(s[key], (int, float)) or s[key] < 0):
            fail(f"protocol.{key}", s[key], "a number >= 0")
    if protocol == "linear":
        int_at_least(node, "protocol.n_last_blocks", 1)
        if not (isinstance(s["augment"], bool) or s["augment"] == "auto"):
            fail("protocol.augment", s["augment"], "true, false or auto (false on CPU: cached features)")


def _eval_data_cfg(cfg: DictConfig, train_cfg: DictConfig) -> DictConfig:
    """The data to evaluate on: ``data=...`` if given, else the pretraining data; validated."""
    data = copy.deepcopy(cfg.data) if cfg.get("data") is not None else copy.deepcopy(train_cfg.data)
    with open_dict(data):
        if cfg.get("num_workers") is not None:
            data.num_workers = cfg.num_workers
    node = OmegaConf.create({"data": data, "backbone": train_cfg.backbone})
    validate_data(node)
    resolve_auto_crop(node.data)
    validate_backbone(node)
    return node.data


# --- logging ----------------------------------------------------------------------------------
def _logger(cfg: DictConfig, train_cfg: DictConfig, out_dir: Path, run_dir: Path, protocol: str):
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    from .train import wandb_logged_in

    lc = cfg.logger if cfg.get("logger") is not None else train_cfg.get("logger", {"name": "csv"})
    if lc.get("name", "csv") == "csv":
        (out_dir / "csv" / "metrics.csv").unlink(missing_ok=True)  # a new evaluation replaces the old one
        return CSVLogger(save_dir=str(out_dir), name="csv", version="")
    if lc.name != "wandb":
        fail("logger.name", lc.name, "csv or wandb")
    mode = os.environ.get("WANDB_MODE") or (lc.mode if lc.mode != "auto" else ("online" if wandb_logged_in() else "offline"))
    return WandbLogger(project=lc.project, entity=lc.entity, group=run_dir.name, job_type=f"eval-{protocol}",
                       name=f"{run_dir.name}-eval-{protocol}", save_dir=str(out_dir), mode=mode,
                       tags=[*lc.get("tags", []), "eval", protocol], config=OmegaConf.to_container(cfg, resolve=True))


def _finish_logger(logger, summary: dict[str, Any]) -> None:
    from lightning.pytorch.loggers import WandbLogger

    if isinstance(logger, WandbLogger):
        run = logger.experiment
        run.summary.update({f"eval/{k}": v for k, v in flatten(summary["metrics"]).items()})
        run.summary.update({"checkpoint": summary["checkpoint"], "protocol": summary["protocol"]})
        logger.finalize("success")
        run.finish()
    else:
        logger.save()
        logger.finalize("success")


def flatten(d: dict[str, Any], sep: str = "_", prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level, keys joined with ``sep`` (logger hyperparameters, config diffs)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, sep, f"{prefix}{k}{sep}"))
        else:
            out[f"{prefix}{k}"] = v
    return out


# --- the protocols ------------------------------------------------------------------------------
def _trainer(cfg: DictConfig, logger=False, max_epochs: int | None = None) -> L.Trainer:
    quiet = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # no "GPU available ..." per trainer
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        return L.Trainer(accelerator=cfg.accelerator, devices=cfg.devices, precision=cfg.precision, logger=logger,
                         max_epochs=max_epochs or 1, enable_checkpointing=False, enable_model_summary=False,
                         enable_progress_bar=bool(cfg.progress_bar), num_sanity_val_steps=0,
                         log_every_n_steps=1, check_val_every_n_epoch=10**9, deterministic=False)
    finally:
        quiet.setLevel(level)


def extract(cfg: DictConfig, net: FeatureNet, loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels of a whole loader (no gradients, network in eval mode)."""
    net.eval()
    out = _trainer(cfg).predict(_Extract(net), dataloaders=loader)
    feats, labels = zip(*out)  # type: ignore[arg-type]
    return torch.cat(feats), torch.cat(labels)


def run_knn(cfg: DictConfig, backbone: Backbone, data: EvalData, s: dict[str, Any], logger) -> dict[str, Any]:
    d = data.cfg
    net = FeatureNet(backbone)
    bank, bank_y = extract(cfg, net, _loader(EvalDataset(data.train, _eval_transform(d)), s["batch_size"], d.num_workers, False))
    query, query_y = extract(cfg, net, _loader(EvalDataset(data.test, _eval_transform(d)), s["batch_size"], d.num_workers, False))
    device = "cuda" if torch.cuda.is_available() and cfg.accelerator in ("gpu", "cuda", "auto") else "cpu"
    res = knn_accuracies(bank.to(device), bank_y.to(device), query.to(device), query_y.to(device),
                         len(data.classes), s["ks"], s["temperature"])
    ref = 20 if 20 in res else s["ks"][0]
    logger.log_metrics({f"eval/knn_k{k}_{m}": v for k, r in res.items() for m, v in r.items()}, step=0)
    return {"top1": res[ref]["top1"], "top5": res[ref]["top5"], "k_for_top1": ref,
            **{f"k{k}": v for k, v in sorted(res.items())}}


def run_classifier(cfg: DictConfig, backbone: Backbone, data: EvalData, s: dict[str, Any], logger,
                   finetune: bool) -> dict[str, Any]:
    d, n_cls = data.cfg, len(data.classes)
    if cfg.protocol.get("batch_size") is None:  # the recipe's batch, sized to this dataset
        s["batch_size"] = probe_batch_size(s["batch_size"], len(data.train))
    if s["batch_size"] > len(data.train):  # tiny data: one full batch per step
        log.warning("protocol.batch_size=%d > %d training images: using %d", s["batch_size"], len(data.train), len(data.train))
        s["batch_size"] = len(data.train)
    if s.get("augment") == "auto":
        s["augment"] = not runs_on_cpu(str(cfg.accelerator))
    s["lr"] = s["base_lr"] * s["batch_size"] / s["lr_ref_batch"]
    net = FeatureNet(copy.deepcopy(backbone) if finetune else backbone,
                     s.get("n_last_blocks") or 1, bool(s.get("avgpool_patchtokens")))
    if net.is_vit and net.n > len(backbone.trunk.blocks):
        fail("protocol.n_last_blocks", net.n, f"at most the backbone's depth ({len(backbone.trunk.blocks)})")
    if not net.is_vit:
        s["n_last_blocks"], s["avgpool_patchtokens"] = None, None  # ResNets: the pooled features
    test_tf = _eval_transform(d)
    test_ds = EvalDataset(data.test, test_tf)
    cached = not finetune and not s["augment"]
    per_image = forward_seconds(cfg, net, EvalDataset(data.train, test_tf), min(s["batch_size"], 64))
    forwards = len(data.test) + len(data.train) * (1 if cached else s["epochs"])
    log.info("%s: %d epochs x %d steps of batch %d on %s; %d images through the backbone at %.1f ms each: "
             "about %.0f s%s", "linear probe" if not finetune else "fine-tuning", s["epochs"],
             math.ceil(len(data.train) / s["batch_size"]), s["batch_size"],
             "cached features (augment=false)" if cached else "augmented views", forwards, 1e3 * per_image,
             forwards * per_image * (3 if finetune else 1), " + the head's steps (timed after epoch 1)" if cached else "")
    if cached:  # fast path: centre-crop features once, then a linear model on them
        train_x, train_y = extract(cfg, net, _loader(EvalDataset(data.train, test_tf), s["batch_size"], d.num_workers, False))
        test_x, test_y = extract(cfg, net, _loader(test_ds, s["batch_size"], d.num_workers, False))
        model = Classifier(None, net.feature_dim, n_cls, s)
        train_loader = DataLoader(TensorDataset(train_x, train_y), batch_size=s["batch_size"], shuffle=True)
        test_loader = DataLoader(TensorDataset(test_x, test_y), batch_size=s["batch_size"])
    else:
        train_tf = TrainTransform(d.crop_size, tuple(s["train_crop_scale"]), tuple(d.mean), tuple(d.std))
        model = Classifier(net, net.feature_dim, n_cls, s, finetune=finetune)
        # Fine-tuning trains BatchNorm: no batch of 1 (drop the incomplete last batch).
        train_loader = _loader(EvalDataset(data.train, train_tf), s["batch_size"], d.num_workers, True,
                               drop_last=finetune and len(data.train) > s["batch_size"])
        test_loader = _loader(test_ds, s["batch_size"], d.num_workers, False)
    return fit_classifier(cfg, model, train_loader, test_loader, s["epochs"], logger)


class FirstEpochETA(L.Callback):
    """Logs, after the first epoch, how long the remaining epochs will take at that pace."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0:
            self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0 and trainer.max_epochs:
            took = time.perf_counter() - self.start
            log.info("epoch 1 of %d took %.1f s: about %.0f s to go", trainer.max_epochs, took,
                     took * (trainer.max_epochs - 1))


def probe_batch_size(recipe_batch: int, num_train: int, min_steps: int = 16) -> int:
    """The recipe's batch, halved (not below 16) until an epoch has ``min_steps`` optimiser steps:
    the ImageNet recipes' 4,096 over a few thousand images would be one step per epoch."""
    batch = recipe_batch
    while batch > 16 and num_train < min_steps * batch:
        batch //= 2
    return batch


def forward_seconds(cfg: DictConfig, net: FeatureNet, ds: Dataset, batch_size: int) -> float:
    """Seconds per image of one timed, no-grad forward batch on the evaluation device (the
    start-up time estimate; the first call also pays the device's warm-up)."""
    device = torch.device("cuda" if not runs_on_cpu(str(cfg.accelerator)) and torch.cuda.is_available() else "cpu")
    x = torch.stack([ds[i]["image"] for i in range(min(batch_size, len(ds)))]).to(device)  # type: ignore[arg-type]
    was_training, first = net.training, next(net.parameters()).device
    net.eval().to(device)
    with torch.no_grad():
        net(x[:2])  # warm-up (kernel selection, allocations)
        start = time.perf_counter()
        net(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / x.shape[0]
    net.train(was_training).to(first)
    return seconds


def fit_classifier(cfg: DictConfig, model: Classifier, train_loader: DataLoader, test_loader: DataLoader,
                   epochs: int, logger=False) -> dict[str, Any]:
    """Train ``model`` for ``epochs``, then top-1/top-5 on ``test_loader`` (and the last
    epoch's training loss)."""
    trainer = _trainer(cfg, logger=logger, max_epochs=epochs)
    trainer.callbacks.append(FirstEpochETA())
    model.train()  # Lightning keeps the modes it is given; a probe's frozen features stay in eval mode
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")  # the test split: once, after training
        warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")  # the probe's frozen features
        trainer.fit(model, train_dataloaders=train_loader)
    train_loss = trainer.callback_metrics.get("train/loss_epoch")
    trainer.validate(model, dataloaders=test_loader, verbose=False)
    return {**model.test_metrics, "train_loss": float(train_loss) if train_loss is not None else None}


# --- entry point ----------------------------------------------------------------------------------
def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Run ``cfg.protocol`` on ``cfg.ckpt``; return the summary (also in eval_summary.json)."""
    start = time.time()
    if OmegaConf.is_missing(cfg, "ckpt") or not cfg.ckpt:
        fail("ckpt", "???", "a run dir or a .ckpt file: add ckpt=<path> to the command")
    protocol = cfg.protocol.name
    if protocol not in PROTOCOLS:
        fail("protocol.name", protocol, f"one of {', '.join(PROTOCOLS)}")
    if cfg.devices != 1:
        fail("devices", cfg.devices, "1 (evaluation runs on one device)")
    ckpt_path, run_dir = resolve_checkpoint(cfg.ckpt)
    ckpt = load_checkpoint(ckpt_path)
    train_cfg = checkpoint_config(ckpt)
    data_cfg = _eval_data_cfg(cfg, train_cfg)
    settings = protocol_settings(cfg.protocol, train_cfg.method.name, data_cfg.name)
    _validate_settings(settings, protocol)
    model = build_method(ckpt)
    # Our checkpoints are written at the end of an epoch, when Lightning's "epoch" is its index.
    pretrain = {"epochs": int(ckpt.get("epoch", -1)) + 1, "steps": ckpt.get("global_step")}
    del ckpt
    backbone = model.backbone if cfg.student else model.eval_backbone
    which = "student backbone" if cfg.student and backbone is not model.eval_backbone else (
        "teacher backbone" if backbone is not model.backbone else "backbone")
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    data = eval_data(data_cfg)
    if len(data.train) == 0 or len(data.test) == 0:
        raise ConfigError(f"data.name={data_cfg.name!r} is not allowed: its train or test split is empty")
    out_dir = Path(cfg.out_dir) if cfg.get("out_dir") else run_dir / "eval" / protocol
    out_dir.mkdir(parents=True, exist_ok=True)
    logger = _logger(cfg, train_cfg, out_dir, run_dir, protocol)
    log.info("%s evaluation of %s (%s, %s, %s) on %s: %d train / %d test images, %d classes; accelerator=%s",
             protocol, ckpt_path, train_cfg.method.name, train_cfg.backbone.name, which, data_cfg.name, len(data.train),
             len(data.test), len(data.classes), cfg.accelerator)
    if protocol == "knn":
        metrics = run_knn(cfg, backbone, data, settings, logger)
    else:
        metrics = run_classifier(cfg, backbone, data, settings, logger, finetune=protocol == "finetune")
    summary = {
        "protocol": protocol,
        "metrics": metrics,
        "checkpoint": str(ckpt_path.resolve()),
        "run_dir": str(run_dir.resolve()),
        "dataset": {"name": data_cfg.name, "train_images": len(data.train), "test_images": len(data.test),
                    "num_classes": len(data.classes), "crop_size": data_cfg.crop_size},
        "method": train_cfg.method.name,
        "backbone": train_cfg.backbone.name,
        "features": which,
        "pretrain_epochs": pretrain["epochs"],
        "pretrain_steps": pretrain["steps"],
        "settings": settings,
        "chance": 1 / len(data.classes),
        "wall_time_s": round(time.time() - start, 1),
    }
    (out_dir / "eval_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    OmegaConf.save(cfg, out_dir / "eval_config.yaml")
    _finish_logger(logger, summary)
    summary["out_dir"] = str(out_dir)
    return summary
