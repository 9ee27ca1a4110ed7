"""The data an evaluation runs on: labelled splits, their transforms and loaders."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from ..config import data_preset_given, fail, preset_data, validate_data
from ..data.augment import EvalTransform
from ..data.datamodule import UNLABELLED, build_raw_datasets, subset
from ..data.layout import resolve_auto_crop
from ..data.workers import worker_options
from ..device import loader_workers
from ..schema import EvalConfig, TrainConfig
from ..schema.data import DataSettings
from ..schema.run import check_crop_for_backbone

log = logging.getLogger(__name__)


@dataclass
class EvalData:
    train: Dataset  # the labelled training split (raw)
    test: Dataset
    classes: list[str]
    cfg: DataSettings


def eval_data(data_cfg: DataSettings) -> EvalData:
    """The labelled splits (training split as the bank / probe data), ``*_subset`` applied."""
    _, bank, test, classes = build_raw_datasets(data_cfg)
    bank = subset(bank, data_cfg.train_subset, seed=0, key="data.train_subset")
    test = subset(test, data_cfg.test_subset, seed=1, key="data.test_subset")
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


def eval_transform(d: DataSettings, interpolation: str = "bilinear") -> EvalTransform:
    """Resize and centre crop (``data.eval_crop_ratio``): the views features are computed on
    (bilinear for k-NN, as the training run's monitor; the protocol's for a classifier)."""
    return EvalTransform(d.crop_size, d.eval_crop_ratio, tuple(d.mean), tuple(d.std), interpolation)


def own_data(train_cfg: TrainConfig, changes: Mapping[str, Any] | None) -> dict[str, Any]:
    """The pretraining data with the command's ``+data.<key>=`` ``changes`` (``+data.test_subset=50``),
    as plain values. conf/eval.yaml declares ``data.eval_root`` (so that ``data.eval_root=DIR``
    needs no ``+``): its null is no change, the run's own ``data.eval_root`` stays."""
    data = train_cfg.data.model_dump()
    changes = {k: v for k, v in (changes or {}).items() if not (k == "eval_root" and v is None)}
    for key, value in changes.items():
        if key not in data:
            fail(f"data.{key}", value, f"a key of the checkpoint's data ({', '.join(data)}), or data=<data set>")
    return _merged(data, changes)


def _merged(values: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with ``changes`` on top, nested mappings merged key by key (``+data.aug.hue=0.1``)."""
    out = dict(values)
    for key, value in changes.items():
        old = out[key] if key in out else None
        out[key] = _merged(old, value) if isinstance(old, dict) and isinstance(value, Mapping) else value
    return out


def eval_data_cfg(cfg: EvalConfig, train_cfg: TrainConfig) -> DataSettings:
    """The data to evaluate on: ``data=<data set>`` if given, else the pretraining data with the
    command's ``+data.<key>=`` changes; validated, ``auto`` crops resolved, the loader workers of
    this machine."""
    data = preset_data(cfg) if data_preset_given(cfg) else own_data(train_cfg, cfg.data)
    if cfg.num_workers is not None:
        data["num_workers"] = cfg.num_workers
    d = validate_data({"data": data})
    if d.name in UNLABELLED and not d.eval_root:
        why = f"data={d.name} has no test split"
        fail("data.eval_root", None, f"a labelled ImageNet-layout folder to evaluate on ({why})")
    d = resolve_auto_crop(d, train_cfg.backbone)
    check_crop_for_backbone(train_cfg.backbone, d.crop_size)
    workers, said = loader_workers(d.num_workers)  # auto, or capped at the usable cores
    log.info("eval data: %s", said)
    return d.model_copy(update={"num_workers": workers})
