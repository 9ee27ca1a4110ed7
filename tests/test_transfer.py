"""The transfer data sets (Flowers102, Food101, iNaturalist 2021) and transfer.py's table, on tiny
fakes in torchvision's on-disk layouts (nothing is downloaded)."""

from __future__ import annotations

import csv
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hvp_lightning.config import ConfigError, validate_data
from hvp_lightning.data.datamodule import build_raw_datasets
from hvp_lightning.evaluation.transfer import EVAL_KEYS, check_transfer_options, run_folder_name, run_transfer
from hvp_lightning.run.directory import RunDir, TransferDir
from hvp_lightning.schema import TRANSFER_DATASETS, TRANSFER_PROTOCOLS
from hvp_lightning.training.driver import run

from .conftest import compose_conf, help_groups, make_cfg

savemat = pytest.importorskip("scipy.io", reason="Flowers102 reads .mat files with scipy").savemat

# (train, test) labels of every fake: each split holds every class, in a different count.
TRAIN, TEST = [0, 0, 1, 1, 2, 2], [0, 1, 2, 2]


# eval.py's keys that keep a transfer test on the CPU, quiet, in-process and CSV-logged
QUIET_CPU = ("accelerator=cpu", "progress_bar=false", "num_workers=0", "logger=csv")


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
    return compose_conf(name, *overrides)


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


# A DINO ViT-S (width 384, the paper's transfer backbone) cut to the 4 blocks its features need.
VITS = [
    "method=dino_cifar",
    "backbone=vit_small",
    "backbone.patch_size=8",
    "backbone.img_size=16",
    "backbone.depth=4",
    "data.crop_size=16",
    "data.train_size=16",
    "method.local_crop_size=8",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("dino_vits")
    run(make_cfg(*VITS), run_dir)
    return run_dir


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_missing_root_names_its_key_and_path(simsiam_run, tmp_path):
    tiny_run = simsiam_run[0]  # any run: the checks come before the checkpoint is read
    fake_food101(tmp_path / "food101")
    cfg = compose_cfg("transfer", f"ckpt={tiny_run}", f"root={tmp_path}", "datasets=[food101,flowers102]")
    want = rf"data.flowers102.root='{tmp_path}/flowers102' is not allowed: .*flowers-102/jpg is not in it"
    want += r".*; or leave it out: datasets=\[food101\]"
    with pytest.raises(ConfigError, match=want):
        check_transfer_options(cfg)
    with pytest.raises(ConfigError, match=r"datasets=\['imagenet'\] is not allowed"):
        check_transfer_options(compose_cfg("transfer", f"ckpt={tiny_run}", "datasets=[imagenet]"))
    # transfer.py says a refused setting in one line, exit 2: tests/test_eval.py (checkpoint paths)


# What each cell must run with, from the paper and the official HVP code (automl/hvp):
#   linear: the DINO ImageNet recipe (paper line 821: "the same hyperparameters for linear evaluation on
#     ImageNet"): SGD base lr 0.00075 at batch 1024, lr = base * batch / 256 (dino:eval_linear.py line 128);
#   finetune: the paper's DINO ViT-S/16 table (hard-view-pretraining.tex lines 830-834): AdamW, batch 512,
#     weight decay 0.05, lr = table lr * batch / 256 (dino:eval_linear.py line 128);
#   both: the CLS tokens of the last 4 blocks (dino:eval_linear.py line 110, n_last_blocks 4 in
#     dino:configs/ImageNet/eval_linear_default.yaml): 4 x 384 for a ViT-S; bicubic resize and crop
#     (dino:data/__init__.py lines 100, 117); fp32 on a CPU;
#   normalisation (dino:eval_linear.py lines 32-37, dino:data/__init__.py lines 32-37): CIFAR-10 and
#     Flowers102 their own statistics, every other data set ImageNet's.
FINETUNE_LR = {"cifar10": 7.5e-6, "cifar100": 7.5e-6, "flowers102": 5e-5, "inat21": 5e-5, "food101": 5e-5}
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
NORMALISATION = {
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]),
    "flowers102": ([0.4353, 0.3773, 0.2872], [0.2966, 0.2455, 0.2698]),
    "cifar100": IMAGENET,
    "inat21": IMAGENET,
    "food101": IMAGENET,
}


@pytest.mark.slow  # a ViT-S run, then a linear probe and a fine-tuning per data set
@pytest.mark.parametrize(
    "datasets",
    [
        pytest.param(["cifar10", "cifar100"], id="cifar"),  # each normalisation kind
        pytest.param(list(TRANSFER_DATASETS), id="all"),  # each ViT-S build costs ~0.5 s
    ],
)
def test_transfer_writes_the_paper_table(datasets, tiny_run, tmp_path, fakes_pass_checksums):
    """Both protocols on a ViT-S: each cell's lr, batch, feature width, interpolation,
    normalisation and precision are the official ones, and the table holds the best epoch's and
    the last epoch's top-1 and the batch; the data sets not run stay empty."""
    for name in datasets:
        FAKES[name](tmp_path / name)
    out = tmp_path / "out"
    cfg = compose_cfg(
        "transfer",
        f"ckpt={tiny_run}",
        f"root={tmp_path}",
        f"out_dir={out}",
        *QUIET_CPU,
        "linear.epochs=2",
        "finetune.epochs=1",
        f"datasets=[{','.join(datasets)}]",
    )
    row = run_transfer(*check_transfer_options(cfg))
    with open(TransferDir(out).table_csv) as f:
        rows = list(csv.DictReader(f))
    assert rows == [{k: str(v) for k, v in row.items()}]
    pretrain = make_cfg(*VITS)
    want = (pretrain.method.name, pretrain.backbone.name, pretrain.trainer.max_epochs)
    assert (row["method"], row["backbone"], row["pretrain_epochs"]) == want
    for name in TRANSFER_DATASETS:
        for protocol in TRANSFER_PROTOCOLS:
            col = f"{name}_{protocol}"
            if name not in datasets:
                assert row[f"{col}_best"] == row[f"{col}_last"] == row[f"{col}_batch"] == ""
                continue
            summary = json.loads(
                (out / run_folder_name(RunDir(tiny_run)) / name / protocol / "eval_summary.json").read_text()
            )
            s, m = summary["settings"], summary["metrics"]
            base_lr, batch = (0.00075, 1024) if protocol == "linear" else (FINETUNE_LR[name], 512)
            assert (s["base_lr"], s["batch_size"], s["lr_ref_batch"]) == (base_lr, batch, 256), col
            assert s["lr"] == pytest.approx(base_lr * batch / 256)
            assert (s["optimizer"], s["weight_decay"]) == (("sgd", 0.0) if protocol == "linear" else ("adamw", 0.05))
            assert (s["n_last_blocks"], s["avgpool_patchtokens"], s["feature_dim"]) == (4, False, 4 * 384)
            assert (s["interpolation"], summary["precision"]) == ("bicubic", "32-true")
            assert (summary["dataset"]["mean"], summary["dataset"]["std"]) == NORMALISATION[name]
            assert s["steps_per_epoch"] == 1  # 6 images in a batch of 512 or 1024: one step, the batch unchanged
            # both accuracy columns: the best of the per-epoch test top-1s and the last of them
            assert len(m["top1_per_epoch"]) == s["epochs"] and m["top1"] == m["top1_per_epoch"][-1]
            assert m["best_top1"] == max(m["top1_per_epoch"])
            assert row[f"{col}_best"] == f"{100 * m['best_top1']:.2f}"
            assert row[f"{col}_last"] == f"{100 * m['top1']:.2f}"
            assert row[f"{col}_batch"] == str(batch)
            assert row[f"{col}_epochs"] == str(s["epochs"]) == ("2" if protocol == "linear" else "1")  # as asked
            assert (summary["dataset"]["train_images"], summary["dataset"]["test_images"]) == (len(TRAIN), len(TEST))
            assert summary["dataset"]["crop_size"] == pretrain.data.crop_size  # the pretraining crop
    md = TransferDir(out).table_md.read_text().splitlines()
    heads = [h.strip() for h in md[0].strip("|").split("|")]
    assert heads[:5] == ["Method", "Arch.", "", "CIFAR10 Lin.", "CIFAR10 F.T."] and heads[-1] == "Food101 F.T."
    assert len(heads) == 3 + 2 * len(TRANSFER_DATASETS)
    best, last, batch = ([c.strip() for c in line.strip("|").split("|")] for line in md[2:5])
    assert "best epoch (the paper's" in best[2] and "last epoch" in last[2] and batch[2] == "batch"
    assert best[3] == row["cifar10_linear_best"] and last[4] == row["cifar10_finetune_last"] and batch[4] == "512"


@pytest.mark.slow  # python <script> --help: ~3 s of CPU (Hydra lists the groups)
def test_transfer_help_lists_only_the_groups_transfer_takes():
    assert help_groups("transfer.py") == {"logger"}


@pytest.mark.slow  # a ViT-S run and two linear probes
def test_checkpoints_sharing_out_dir_keep_their_cells_and_stack_rows(tiny_run, tmp_path, fakes_pass_checksums):
    """Two checkpoints into one ``out_dir``: the second used to overwrite the first's cells and
    table row; each now has its cells under its own subfolder and the table a row per checkpoint."""
    FAKES["cifar10"](tmp_path / "cifar10")
    base = tmp_path / "other" / tiny_run.name / "checkpoints" / "last.ckpt"  # another run of the same name
    base.parent.mkdir(parents=True)
    shutil.copy(tiny_run / "checkpoints" / "last.ckpt", base)
    out = tmp_path / "out"
    for ckpt in (tiny_run, base.parent.parent):
        cfg = compose_cfg(
            "transfer",
            f"ckpt={ckpt}",
            f"root={tmp_path}",
            f"out_dir={out}",
            *QUIET_CPU,
            "linear.epochs=1",
            "datasets=[cifar10]",
            "protocols=[linear]",
        )
        run_transfer(*check_transfer_options(cfg))
    with open(TransferDir(out).table_csv) as f:
        rows = list(csv.DictReader(f))
    runs = [tiny_run, base.parent.parent]
    assert [r["checkpoint"] for r in rows] == [str((r / "checkpoints" / "last.ckpt").resolve()) for r in runs]
    assert all(r["cifar10_linear_last"] for r in rows)
    for r in runs:
        assert (out / run_folder_name(RunDir(r)) / "cifar10" / "linear" / "eval_summary.json").is_file()
    assert TransferDir(out).table_md.read_text().count("| top-1, last epoch |") == 2


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_protocol_setting_errors_name_the_transfer_key(simsiam_run, tmp_path, fakes_pass_checksums):
    """``linear.epochs=0`` was refused as ``protocol.epochs=0``, a key transfer.py does not have."""
    tiny_run = simsiam_run[0]  # any run: the checks come before the checkpoint is read
    FAKES["cifar10"](tmp_path / "cifar10")
    cfg = compose_cfg("transfer", f"ckpt={tiny_run}", f"root={tmp_path}", "datasets=[cifar10]", "linear.epochs=0")
    with pytest.raises(ConfigError, match=r"^linear.epochs=0 is not allowed: an integer >= 1 or null"):
        run_transfer(*check_transfer_options(cfg))
