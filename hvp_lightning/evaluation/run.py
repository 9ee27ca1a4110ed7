"""Evaluation of pretrained checkpoints (``python eval.py``): weighted k-NN, linear probe,
full fine-tuning. Each writes ``eval_summary.json`` into ``<run_dir>/eval/<protocol>/`` (another
checkpoint file or data set: ``<run_dir>/eval/<variant>/<protocol>/``, :func:`eval_variant`) and
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
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, TensorDataset

from ..config import check_cpu_precision, check_eval_options, data_preset_given, fail
from ..data.augment import TrainTransform
from ..data.items import EvalDataset
from ..device import check_accelerator, runs_on_cpu, set_matmul_precision
from ..errors import ConfigError
from ..monitors.knn import knn_accuracies
from ..nn.backbones import Backbone
from ..run.atomic import atomic_write_text
from ..run.directory import EvalDir, eval_variant
from ..schema import EvalConfig
from ..training.checkpoint import build_method, checkpoint_config, load_checkpoint, pretrained_for, resolve_checkpoint
from ..warning_filters import quiet_console
from .data import EvalData, eval_data, eval_data_cfg, eval_loader, eval_transform
from .features import FeatureNet, eval_precision, extract, forward_seconds, is_vit
from .loggers import eval_logger, finish_logger
from .probe import Classifier, HeadRecipe, fit_classifier, warn_if_lars_cannot_fit
from .protocols import protocol_settings

log = logging.getLogger(__name__)


def run_knn(cfg: EvalConfig, backbone: Backbone, data: EvalData, s: dict[str, Any], logger) -> dict[str, Any]:
    d = data.cfg
    net = FeatureNet(backbone)
    bank, bank_y = extract(
        cfg,
        net,
        eval_loader(
            EvalDataset(data.train, eval_transform(d)), s["batch_size"], d.num_workers, False, wait_s=cfg.limits.wait_s
        ),
    )
    query, query_y = extract(
        cfg,
        net,
        eval_loader(
            EvalDataset(data.test, eval_transform(d)), s["batch_size"], d.num_workers, False, wait_s=cfg.limits.wait_s
        ),
    )
    device = "cuda" if torch.cuda.is_available() and cfg.accelerator in ("gpu", "cuda", "auto") else "cpu"
    res = knn_accuracies(
        bank.to(device),
        bank_y.to(device),
        query.to(device),
        query_y.to(device),
        len(data.classes),
        s["ks"],
        s["temperature"],
    )
    ref = 20 if 20 in res else s["ks"][0]
    if over := [k for k in s["ks"] if k > len(bank)]:
        log.warning("protocol.ks: k=%s above the %d training images: each votes with all of them", over, len(bank))
    logger.log_metrics({f"eval/knn_k{k}_{m}": v for k, r in res.items() for m, v in r.items()}, step=0)
    return {
        "top1": res[ref]["top1"],
        "top5": res[ref]["top5"],
        "k_for_top1": min(ref, len(bank)),  # the neighbours that voted: a k above the bank counts all of it
        **{f"k{k}": v for k, v in sorted(res.items())},
    }


def table_row_used(s: dict[str, Any], dataset: str) -> str:
    """Which row of the fine-tuning table set the lr and epochs: ``table_row: auto`` takes cifar10's
    for data the table does not list (imagefolder, synthetic, stl10), which should not pass unsaid."""
    row = f"{s['recipe']} table, row {s['table_row']}"
    return row if s["table_row"] == dataset else f"{row}, as {dataset} is not in it; protocol.table_row= picks another"


def run_classifier(
    cfg: EvalConfig, backbone: Backbone, data: EvalData, s: dict[str, Any], logger, finetune: bool
) -> dict[str, Any]:
    d, n_cls = data.cfg, len(data.classes)
    # The batch is the recipe's (or protocol.batch_size), whatever the data's size, and so is the
    # lr: a batch larger than the training split is one step of the whole split an epoch, its lr
    # still scaled from the batch asked for, as the official eval_linear.py does (its DataLoader
    # takes batch_size as given; init_lr = lr * batch_size / 256, dino:eval_linear.py line 128).
    if s.get("augment") == "auto":
        s["augment"] = not runs_on_cpu(cfg.accelerator)
    s["lr"] = s["base_lr"] * s["batch_size"] / s["lr_ref_batch"]
    # BatchNorm trains in fine-tuning: drop a last batch of one image only (the official loaders keep it).
    drop_last = finetune and len(data.train) % s["batch_size"] == 1
    n_train = len(data.train)
    s["steps_per_epoch"] = n_train // s["batch_size"] if drop_last else math.ceil(n_train / s["batch_size"])
    net = FeatureNet(
        copy.deepcopy(backbone) if finetune else backbone, s["n_last_blocks"], bool(s["avgpool_patchtokens"])
    )
    if net.is_vit and net.n > len(backbone.trunk.blocks):
        fail("protocol.n_last_blocks", net.n, f"at most the backbone's depth ({len(backbone.trunk.blocks)})")
    if not net.is_vit:
        s["n_last_blocks"], s["avgpool_patchtokens"] = None, None  # ResNets: the pooled features
    s["feature_dim"] = net.feature_dim
    recipe = HeadRecipe.of(s)
    test_tf = eval_transform(d, s["interpolation"])
    test_ds = EvalDataset(data.test, test_tf)
    cached = not finetune and not s["augment"]
    per_image = forward_seconds(cfg, net, EvalDataset(data.train, test_tf), min(s["batch_size"], 64))
    forwards = (len(data.test) + len(data.train)) * (1 if cached else s["epochs"])
    log.info(
        "%s: %d epochs x %d steps of batch %d (lr %.3g) on %s; %d images through the backbone at %.1f ms each: "
        "about %.0f s%s",
        "linear probe" if not finetune else f"fine-tuning ({table_row_used(s, d.name)})",
        s["epochs"],
        s["steps_per_epoch"],
        s["batch_size"],
        s["lr"],
        "cached features (augment=false)" if cached else "augmented views",
        forwards,
        1e3 * per_image,
        forwards * per_image * (3 if finetune else 1),
        " + the head's steps (timed after epoch 1)" if cached else "",
    )
    if cached:  # fast path: centre-crop features once, then a linear model on them
        train_x, train_y = extract(
            cfg,
            net,
            eval_loader(
                EvalDataset(data.train, test_tf), s["batch_size"], d.num_workers, False, wait_s=cfg.limits.wait_s
            ),
        )
        test_x, test_y = extract(
            cfg, net, eval_loader(test_ds, s["batch_size"], d.num_workers, False, wait_s=cfg.limits.wait_s)
        )
        model = Classifier(None, net.feature_dim, n_cls, recipe)
        train_loader = DataLoader(TensorDataset(train_x, train_y), batch_size=s["batch_size"], shuffle=True)
        test_loader = DataLoader(TensorDataset(test_x, test_y), batch_size=s["batch_size"])
    else:
        train_tf = TrainTransform(
            d.crop_size, tuple(s["train_crop_scale"]), tuple(d.mean), tuple(d.std), s["interpolation"]
        )
        model = Classifier(net, net.feature_dim, n_cls, recipe, finetune=finetune)
        train_loader = eval_loader(
            EvalDataset(data.train, train_tf),
            s["batch_size"],
            d.num_workers,
            True,
            drop_last=drop_last,
            wait_s=cfg.limits.wait_s,
        )
        test_loader = eval_loader(test_ds, s["batch_size"], d.num_workers, False, wait_s=cfg.limits.wait_s)
    warn_if_lars_cannot_fit(recipe, s["batch_size"], len(train_loader))
    return fit_classifier(cfg, model, train_loader, test_loader, s["epochs"], logger)


def evaluate(cfg: EvalConfig | DictConfig | Mapping[str, Any]) -> dict[str, Any]:
    """Run ``cfg.protocol`` on ``cfg.ckpt``; return the summary (also in eval_summary.json).
    ``cfg``: :func:`hvp_lightning.config.check_eval_options`'s validated config (the CLI runs it
    before the heavy imports), or a composed one, validated here first."""
    start = time.time()
    quiet_console()
    if not isinstance(cfg, EvalConfig):
        cfg = check_eval_options(cfg)
    check_accelerator("accelerator", cfg.accelerator)
    check_cpu_precision("precision", cfg.precision, cfg.accelerator)
    protocol = cfg.protocol.name
    ckpt_path, run_dir = resolve_checkpoint(cfg.ckpt)
    ckpt = load_checkpoint(ckpt_path)
    train_cfg = checkpoint_config(ckpt)
    data_cfg = eval_data_cfg(cfg, train_cfg)
    settings = protocol_settings(cfg.protocol, train_cfg.method.name, data_cfg.name)
    model = build_method(ckpt)
    pretrain = pretrained_for(ckpt)
    del ckpt
    backbone = model.backbone if cfg.student else model.eval_backbone
    on_gpu = not runs_on_cpu(cfg.accelerator) and torch.cuda.is_available()
    # precision: auto, resolved for this backbone and device
    cfg = cfg.model_copy(update={"precision": eval_precision(cfg.precision, protocol, is_vit(backbone), on_gpu)})
    which = (
        "student backbone"
        if cfg.student and backbone is not model.eval_backbone
        else ("teacher backbone" if backbone is not model.backbone else "backbone")
    )
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    set_matmul_precision()  # as in training: the run's k-NN monitor and this one agree on GPUs too
    data = eval_data(data_cfg)
    if len(data.train) == 0 or len(data.test) == 0:
        raise ConfigError(f"data.name={data_cfg.name!r} is not allowed: its train or test split is empty")
    other_data = data_preset_given(cfg) and data_cfg.name != train_cfg.data.name  # the run's own: its folder
    variant = eval_variant(ckpt_path, data_cfg.name if other_data else None)
    out = EvalDir(Path(cfg.out_dir)) if cfg.out_dir else run_dir.eval(protocol, variant)
    out.start()  # no earlier summary stays beside this evaluation's log
    logger = eval_logger(cfg, train_cfg, out, run_dir, protocol)
    log.info(
        "%s evaluation of %s (%s, %s, %s) on %s: %d train / %d test images, %d classes; accelerator=%s, precision=%s",
        protocol,
        ckpt_path,
        train_cfg.method.name,
        train_cfg.backbone.name,
        which,
        data_cfg.name,
        len(data.train),
        len(data.test),
        len(data.classes),
        cfg.accelerator,
        cfg.precision,
    )
    if protocol == "knn":
        metrics = run_knn(cfg, backbone, data, settings, logger)
    else:
        metrics = run_classifier(cfg, backbone, data, settings, logger, finetune=protocol == "finetune")
    summary = {
        "protocol": protocol,
        "metrics": metrics,
        "checkpoint": str(ckpt_path.resolve()),
        "run_dir": str(run_dir.path.resolve()),
        "dataset": {
            "name": data_cfg.name,
            "train_images": len(data.train),
            "test_images": len(data.test),
            "num_classes": len(data.classes),
            "crop_size": data_cfg.crop_size,
            "mean": list(data_cfg.mean),
            "std": list(data_cfg.std),
        },
        "method": train_cfg.method.name,
        "backbone": train_cfg.backbone.name,
        "features": which,
        "precision": cfg.precision,
        "pretrain_epochs": pretrain["epochs"],  # whole epochs; a checkpoint saved inside one: + batches
        "pretrain_batches": pretrain["batches"],
        "pretrain_steps": pretrain["steps"],
        "settings": settings,
        "chance": 1 / len(data.classes),
        "wall_time_s": round(time.time() - start, 1),
    }
    atomic_write_text(out.summary, json.dumps(summary, indent=2) + "\n")
    OmegaConf.save(cfg.model_dump(), out.config)
    finish_logger(logger, summary)
    summary["out_dir"] = str(out.path)
    return summary
