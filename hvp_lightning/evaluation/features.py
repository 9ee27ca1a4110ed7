"""Frozen features of a pretrained backbone: the feature function, extraction over a loader,
and the Trainer the evaluation runs under."""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..device import runs_on_cpu
from ..nn.backbones import Backbone
from ..schema import EvalConfig


def is_vit(backbone: Backbone) -> bool:
    """Whether the backbone is a ViT (it has per-block outputs), not a ResNet."""
    return hasattr(backbone.trunk, "get_intermediate_layers")


def eval_precision(precision: str, protocol: str, vit: bool, on_gpu: bool) -> str:
    """What ``precision: auto`` stands for in one evaluation. The official linear / fine-tuning
    code trains ViTs under fp16 autocast with loss scaling (automl/hvp dino:eval_linear.py line 145:
    ``GradScaler() if "vit" in cfg.arch``, line 238: ``autocast``), ResNets in fp32 (main:eval_linear.py
    has neither); its k-NN (dino:eval_knn.py) and every CPU run stay fp32 (no fp16 on CPU).
    Any other value is the user's and is kept."""
    if precision != "auto":
        return precision
    return "16-mixed" if vit and on_gpu and protocol in ("linear", "finetune") else "32-true"


class FeatureNet(nn.Module):
    """Image -> feature vector. ResNets: the pooled trunk output. ViTs: the final CLS token,
    or (DINO's linear evaluation) the CLS tokens of the last ``n_last_blocks`` blocks, each
    through the final norm, concatenated, optionally with the mean patch token of the last."""

    def __init__(self, backbone: Backbone, n_last_blocks: int = 1, avgpool_patchtokens: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.is_vit = is_vit(backbone)
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


def eval_trainer(cfg: EvalConfig, logger=False, max_epochs: int | None = None, validate: bool = False) -> L.Trainer:
    """The Lightning Trainer every evaluation step runs under (feature extraction, probe and
    fine-tuning): one device, no checkpoints; ``validate``: the test split after every epoch,
    as the official eval_linear.py (val_freq 1), else only when asked."""
    quiet = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # no "GPU available ..." per trainer
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        return L.Trainer(
            accelerator=cfg.accelerator,
            devices=cfg.devices,
            precision=cfg.precision,
            logger=logger,
            max_epochs=max_epochs or 1,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=bool(cfg.progress_bar),
            num_sanity_val_steps=0,
            log_every_n_steps=1,
            check_val_every_n_epoch=1 if validate else 10**9,
            deterministic=False,
        )
    finally:
        quiet.setLevel(level)


def extract(cfg: EvalConfig, net: FeatureNet, loader: DataLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels of a whole loader (no gradients, network in eval mode)."""
    net.eval()
    out = eval_trainer(cfg).predict(_Extract(net), dataloaders=loader)
    feats, labels = zip(*out)  # type: ignore[arg-type]
    return torch.cat(feats), torch.cat(labels)


def forward_seconds(cfg: EvalConfig, net: FeatureNet, ds: Dataset, batch_size: int) -> float:
    """Seconds per image of one timed, no-grad forward batch on the evaluation device (the
    start-up time estimate; the first call also pays the device's warm-up)."""
    device = torch.device("cuda" if not runs_on_cpu(cfg.accelerator) and torch.cuda.is_available() else "cpu")
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
