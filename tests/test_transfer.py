"""The transfer data sets (Flowers102, Food101, iNaturalist 2021) and transfer.py's table, on tiny
fakes in torchvision's on-disk layouts (nothing is downloaded)."""

from __future__ import annotations

import csv
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

from hvp_lightning.config import ConfigError, validate_data
from hvp_lightning.data.datamodule import build_raw_datasets
from hvp_lightning.evaluation.transfer import EVAL_KEYS, check_transfer_options, run_transfer
from hvp_lightning.options import TRANSFER_DATASETS, TRANSFER_PROTOCOLS
from hvp_lightning.run.directory import TransferDir
from hvp_lightning.training.driver import run

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, make_cfg

savemat = pytest.importorskip("scipy.io", reason="Flowers102 reads .mat files with scipy").savemat

# (train, test) labels of every fake: each split holds every class, in a different count.
TRAIN, TEST = [0, 0, 1, 1, 2, 2], [0, 1, 2, 2]


def grey(label: int) -> int:
    """A fake image's grey level: its label, readable back from the decoded pixels."""
    return 40 + 60 * label


def jpeg(path: Path, label: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (24, 20), (grey(label),) * 3).save(path, quality=95)


def fake_flowers102(root: Path) -> None:
    """flowers-102/jpg/image_%05d.jpg, imagelabels.mat (1-based labels), setid.mat (1-based ids)."""
    base = root / "flowers-102"
    val = [1, 0]  # torchvision's third split, unused by the preset
    labels = TRAIN + val + TEST
    for i, label in enumerate(labels, 1):
        jpeg(base / "jpg" / f"image_{i:05d}.jpg", label)
    ids = np.arange(1, len(labels) + 1)
    savemat(base / "imagelabels.mat", {"labels": np.array(labels) + 1})
    n, v = len(TRAIN), len(val)
    savemat(base / "setid.mat", {"trnid": ids[:n], "valid": ids[n : n + v], "tstid": ids[n + v :]})


def fake_food101(root: Path) -> None:
    """food-101/images/<class>/<id>.jpg and meta/{train,test}.json ({class: ["<class>/<id>", ...]})."""
    base, classes = root / "food-101", ["apple_pie", "bibimbap", "churros"]
    for split, labels in (("train", TRAIN), ("test", TEST)):
        meta: dict[str, list[str]] = {c: [] for c in classes}
        for i, label in enumerate(labels):
            name = f"{classes[label]}/{split}{i}"
            jpeg(base / "images" / f"{name}.jpg", label)
            meta[classes[label]].append(name)
        (base / "meta").mkdir(parents=True, exist_ok=True)
        (base / "meta" / f"{split}.json").write_text(json.dumps(meta))


def fake_inat21(root: Path) -> None:
    """2021_train_mini/<class>/*.jpg and 2021_valid/<class>/*.jpg, class folders named as released."""
    classes = [f"{i:05d}_Animalia_Chordata_Aves_Order{i}_Family{i}_Genus{i}_species{i}" for i in range(3)]
    for version, labels in (("2021_train_mini", TRAIN), ("2021_valid", TEST)):
        for i, label in enumerate(labels):
            jpeg(root / version / classes[label] / f"{i}.jpg", label)


def fake_cifar(root: Path, name: str) -> None:
    """torchvision's pickled batches (CIFAR-10: 5 train batches, test_batch, batches.meta)."""

    def batch(labels: list[int]) -> dict:
        data = np.stack([np.full(3 * 32 * 32, grey(label), np.uint8) for label in labels])
        return {"data": data, "labels" if name == "cifar10" else "fine_labels": labels}

    if name == "cifar10":
        base, meta = root / "cifar-10-batches-py", ("batches.meta", "label_names", 10)
        files = {f"data_batch_{k}": TRAIN[k - 1 : k] for k in range(1, 6)}
        files["data_batch_5"] = TRAIN[4:]
        files["test_batch"] = TEST
    else:
        base, meta = root / "cifar-100-python", ("meta", "fine_label_names", 100)
        files = {"train": TRAIN, "test": TEST}
    base.mkdir(parents=True)
    for file, labels in files.items():
        (base / file).write_bytes(pickle.dumps(batch(labels)))
    (base / meta[0]).write_bytes(pickle.dumps({meta[1]: [f"class{i}" for i in range(meta[2])]}))


FAKES = {
    "flowers102": fake_flowers102,
    "food101": fake_food101,
    "inat21": fake_inat21,
    "cifar10": lambda root: fake_cifar(root, "cifar10"),
    "cifar100": lambda root: fake_cifar(root, "cifar100"),
}


@pytest.fixture
def fakes_pass_checksums(monkeypatch):
    """torchvision checks the MD5 of the real CIFAR and Flowers102 files: the fakes only exist."""
    exists = lambda fpath, md5=None: os.path.isfile(fpath)  # noqa: E731
    monkeypatch.setattr("torchvision.datasets.cifar.check_integrity", exists)
    monkeypatch.setattr("torchvision.datasets.flowers102.check_integrity", exists)


def compose_cfg(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(name, overrides=list(overrides))


@pytest.mark.parametrize("name", ["flowers102", "food101", "inat21"])
def test_preset_reads_torchvision_layout_splits_and_labels(name, tmp_path, fakes_pass_checksums):
    FAKES[name](tmp_path)
    cfg = compose_cfg("config", f"data={name}", f"data.root={tmp_path}")
    validate_data(cfg)  # the start-up check finds every file
    pre, bank, test, classes = build_raw_datasets(cfg.data)
    assert pre is bank and len(classes) == (102 if name == "flowers102" else 3)  # Flowers102 names all 102
    for ds, labels in ((bank, TRAIN), (test, TEST)):
        items = [ds[i] for i in range(len(ds))]
        assert sorted(label for _, label, *_ in items) == labels
        for img, label, *_ in items:  # each image is the one its label was written with
            assert isinstance(img, torch.Tensor) and img.dtype == torch.uint8 and img.shape[0] in (1, 3)
            assert abs(img.float().mean().item() - grey(label)) < 3


@pytest.mark.parametrize(
    "name,first_missing",
    [("flowers102", "flowers-102/jpg"), ("food101", "food-101/images"), ("inat21", "2021_train_mini")],
)
def test_missing_files_are_named_at_start_up(name, first_missing, tmp_path):
    cfg = compose_cfg("config", f"data={name}", f"data.root={tmp_path}")
    with pytest.raises(ConfigError, match=rf"data.root='{tmp_path}' is not allowed: .*\({first_missing} is not in it"):
        validate_data(cfg)


def test_files_torchvision_refuses_are_a_config_error(tmp_path):
    """Flowers102 with .mat files that are not the released ones (torchvision checks their MD5)."""
    fake_flowers102(tmp_path)
    cfg = compose_cfg("config", "data=flowers102", f"data.root={tmp_path}")
    validate_data(cfg)  # every file is there
    with pytest.raises(ConfigError, match=rf"data.root='{tmp_path}' is not allowed: torchvision's flowers102 rejects"):
        build_raw_datasets(cfg.data)


def test_transfer_config_carries_eval_keys():
    """transfer.py passes eval.py's keys to every evaluation: the same keys, the same defaults."""
    ev, tr = compose_cfg("eval", "ckpt=x"), compose_cfg("transfer", "ckpt=x")
    assert set(ev) - {"protocol", "data", "out_dir"} == set(EVAL_KEYS) - {"logger"}  # logger: a group, null
    assert {k: tr.get(k) for k in EVAL_KEYS} == {k: ev.get(k) for k in EVAL_KEYS}
    assert list(tr.datasets) == list(TRANSFER_DATASETS) and list(tr.protocols) == list(TRANSFER_PROTOCOLS)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("simsiam")
    run(make_cfg(), run_dir)
    return run_dir


def test_missing_root_names_its_key_and_path(tiny_run, tmp_path):
    fake_food101(tmp_path / "food101")
    cfg = compose_cfg("transfer", f"ckpt={tiny_run}", f"root={tmp_path}", "datasets=[food101,flowers102]")
    want = rf"data.flowers102.root='{tmp_path}/flowers102' is not allowed: .*flowers-102/jpg is not in it"
    want += r".*; or leave it out: datasets=\[food101\]"
    with pytest.raises(ConfigError, match=want):
        check_transfer_options(cfg)
    with pytest.raises(ConfigError, match=r"datasets=\['imagenet'\] is not allowed"):
        check_transfer_options(compose_cfg("transfer", f"ckpt={tiny_run}", "datasets=[imagenet]"))
    proc = subprocess.run(  # the command: one line, exit code 2, before any evaluation
        [sys.executable, "transfer.py", f"ckpt={tiny_run}", f"root={tmp_path}", "datasets=[flowers102]"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 2 and "config error: data.flowers102.root=" in proc.stderr, proc.stderr[-2000:]


def test_transfer_writes_the_paper_table(tiny_run, tmp_path, fakes_pass_checksums):
    for name, fake in FAKES.items():
        fake(tmp_path / name)
    out = tmp_path / "out"
    cfg = compose_cfg(
        "transfer",
        f"ckpt={tiny_run}",
        f"root={tmp_path}",
        f"out_dir={out}",
        "accelerator=cpu",
        "progress_bar=false",
        "num_workers=0",
        "logger=csv",
        "linear.epochs=1",
        "finetune.epochs=1",
    )
    row = run_transfer(cfg, check_transfer_options(cfg))
    with open(TransferDir(out).table_csv) as f:
        rows = list(csv.DictReader(f))
    assert rows == [{k: str(v) for k, v in row.items()}]
    pretrain = make_cfg()
    want = (pretrain.method.name, pretrain.backbone.name, pretrain.trainer.max_epochs)
    assert (row["method"], row["backbone"], row["pretrain_epochs"]) == want
    for name in TRANSFER_DATASETS:
        for protocol in TRANSFER_PROTOCOLS:
            summary = json.loads((out / name / protocol / "eval_summary.json").read_text())
            assert row[f"{name}_{protocol}"] == f"{100 * summary['metrics']['top1']:.2f}"
            assert (summary["dataset"]["train_images"], summary["dataset"]["test_images"]) == (len(TRAIN), len(TEST))
            assert summary["dataset"]["crop_size"] == pretrain.data.crop_size  # the pretraining crop
    md = TransferDir(out).table_md.read_text().splitlines()
    heads = [h.strip() for h in md[0].strip("|").split("|")]
    assert heads[:4] == ["Method", "Arch.", "CIFAR10 Lin.", "CIFAR10 F.T."] and heads[-1] == "Food101 F.T."
    assert len(heads) == 2 + 2 * len(TRANSFER_DATASETS) and md[2].count("|") == len(heads) + 1
