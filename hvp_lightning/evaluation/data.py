"""The data an evaluation runs on: labelled splits, their transforms and loaders."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.utils.data import DataLoader, Dataset

from ..config import check_crop_for_backbone, data_preset_given, fail, preset_data, validate_data
from ..data.augment import EvalTransform
from ..data.datamodule import build_raw_datasets, subset
from ..data.layout import resolve_auto_crop
from ..data.workers import worker_options
from ..device import loader_workers

log = logging.getLogger(__name__)


@dataclass
class EvalData:
    train: Dataset  # the labelled training split (raw)
    test: Dataset
    classes: list[str]
    cfg: DictConfig


def eval_data(data_cfg: DictConfig) -> EvalData:
    """The labelled splits (training split as the bank / probe data), ``*_subset`` applied."""
    _, bank, test, classes = build_raw_datasets(data_cfg)
    bank = subset(bank, data_cfg.get("train_subset"), seed=0, key="data.train_subset")
    test = subset(test, data_cfg.get("test_subset"), seed=1, key="data.test_subset")
    return EvalData(bank, test, list(classes), data_cfg)


def eval_loader(
    ds: Dataset, batch_size: int, workers: int, train: bool, drop_last: bool = False, wait_s: float = 600.0
) -> DataLoader:
    """Shuffled for training (workers kept from epoch to epoch), in order for features and
    testing; workers from the clean fork server, each wait for a batch at most ``wait_s``
    seconds (:mod:`hvp_lightning.data.workers`)."""
    return DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=train,
        drop_last=drop_last,
        pin_memory=torch.cuda.is_available(),
        **worker_options(workers, wait_s, persistent=train),
    )


def eval_transform(d: DictConfig, interpolation: str = "bilinear") -> EvalTransform:
    """Resize and centre crop (``data.eval_crop_ratio``): the views features are computed on
    (bilinear for k-NN, as the training run's monitor; the protocol's for a classifier)."""
    return EvalTransform(d.crop_size, d.eval_crop_ratio, tuple(d.mean), tuple(d.std), interpolation)


def own_data(train_cfg: DictConfig, changes: DictConfig | None) -> DictConfig:
    """The pretraining data with the command's ``+data.<key>=`` ``changes`` (``+data.test_subset=50``).
    conf/eval.yaml declares ``data.eval_root`` (so that ``data.eval_root=DIR`` needs no ``+``): its
    null is no change, the run's own ``data.eval_root`` stays."""
    data = copy.deepcopy(train_cfg.data)
    changes = OmegaConf.create({k: v for k, v in (changes or {}).items() if not (k == "eval_root" and v is None)})
    for key, value in changes.items():
        if key not in data:
            fail(f"data.{key}", value, f"a key of the checkpoint's data ({', '.join(data)}), or data=<data set>")
    return OmegaConf.merge(data, changes) if changes else data


def eval_data_cfg(cfg: DictConfig, train_cfg: DictConfig) -> DictConfig:
    """The data to evaluate on: ``data=<data set>`` if given, else the pretraining data with the
    command's ``+data.<key>=`` changes; validated."""
    data = preset_data(cfg) if data_preset_given(cfg) else own_data(train_cfg, cfg.get("data"))
    with open_dict(data):
        if cfg.get("num_workers") is not None:
            data.num_workers = cfg.num_workers
    data = validate_data(OmegaConf.create({"data": data}))
    if data.name in ("images", "shards") and not data.get("eval_root"):
        why = f"data={data.name} has no test split"
        fail("data.eval_root", None, f"a labelled ImageNet-layout folder to evaluate on ({why})")
    resolve_auto_crop(data, train_cfg.backbone)
    check_crop_for_backbone(train_cfg.backbone, data.crop_size)
    data.num_workers, said = loader_workers(data.num_workers)  # auto, or capped at the usable cores
    log.info("eval data: %s", said)
    return data
