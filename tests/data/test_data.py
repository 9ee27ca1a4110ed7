"""Data pipeline: recorded augmentation parameters, ImageFolder robustness, unlabelled images
and their held-out monitor sample, real CIFAR-10."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from hvp_lightning.config import validate
from hvp_lightning.data.augment import PARAM_NAMES, MultiViewTransform, ViewAug, augment
from hvp_lightning.data.datamodule import SSLDataModule, eval_roles, monitor_split
from hvp_lightning.data.datasets import SafeImageFolder, note_skipped
from hvp_lightning.data.seeds import view_key
from hvp_lightning.data.textures import SyntheticTextures

from ..conftest import SHARED_CIFAR, write_images


def test_augment_records_crop_box_in_source_pixels():
    img = torch.zeros(3, 40, 60, dtype=torch.uint8)
    img[:, 10:20, 30:45] = 255  # a white block
    aug = ViewAug(size=16, scale=(0.05, 0.3), jitter_p=0, gray_p=0, blur_p=0, flip_p=0)
    torch.manual_seed(0)
    for _ in range(20):
        view, p = augment(img, aug, view_key(0, 0, _, 0))
        x, y, w, h = (int(p[k]) for k in ("crop_x", "crop_y", "crop_w", "crop_h"))
        assert (p["src_w"], p["src_h"]) == (60, 40) and 0 <= x and x + w <= 60 and 0 <= y and y + h <= 40
        inside = img[0, y : y + h, x : x + w].float().mean() / 255  # share of white pixels in the box
        seen = (view[0] * 0.229 + 0.485).clamp(0, 1).mean()  # de-normalised view intensity
        assert abs(inside.item() - seen.item()) < 0.08


def test_augment_parameters_are_consistent():
    torch.manual_seed(1)
    img = torch.randint(0, 255, (3, 32, 32), dtype=torch.uint8)
    views, params = MultiViewTransform((ViewAug(size=32, blur_p=0.5, solarize_p=0.5),) * 200)(img, 0, 0)
    assert set(params) == {*PARAM_NAMES, "jitter_order"} and params["jitter_order"].shape == (200, 4)
    jit = params["jitter"].bool()
    assert 0.65 < jit.float().mean() < 0.95  # p = 0.8
    assert ((params["brightness"][jit] - 1).abs() <= 0.4).all() and (params["hue"][jit].abs() <= 0.1).all()
    assert (params["jitter_order"][jit].sort(1).values == torch.arange(4)).all()  # a permutation
    assert (params["jitter_order"][~jit] == -1).all() and (params["brightness"][~jit] == 1).all()
    blurred = params["blur_sigma"] > 0
    assert ((params["blur_sigma"][blurred] >= 0.1) & (params["blur_sigma"][blurred] <= 2.0)).all()
    area = params["crop_w"] * params["crop_h"] / (32 * 32)
    assert (area >= 0.2 - 0.05).all() and (area <= 1.0).all()
    assert all(v.shape == (3, 32, 32) for v in views)


def test_synthetic_data_is_deterministic_and_balanced():
    a, b = SyntheticTextures(200, 32, seed=0), SyntheticTextures(200, 32, seed=0)
    assert torch.equal(a.images, b.images) and a.images.dtype == torch.uint8
    assert not torch.equal(a.images, SyntheticTextures(200, 32, seed=1).images)
    counts = torch.bincount(a.labels, minlength=10)
    assert counts.min() > 5


@pytest.fixture
def messy_tree(tmp_path):
    """ImageNet-layout tree with a corrupt file, a truncated JPEG, grayscale, RGBA, palette and tiny images."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("cats", "dogs"):
            d = tmp_path / split / cls
            d.mkdir(parents=True)
            for i in range(6):
                Image.fromarray(rng.integers(0, 255, (24, 20, 3), dtype=np.uint8)).save(d / f"{i}.jpg")
    train = tmp_path / "train" / "cats"
    Image.fromarray(rng.integers(0, 255, (30, 30), dtype=np.uint8), mode="L").save(train / "gray.png")
    Image.fromarray(rng.integers(0, 255, (30, 30, 4), dtype=np.uint8), mode="RGBA").save(train / "rgba.png")
    Image.fromarray(rng.integers(0, 255, (30, 30, 3), dtype=np.uint8)).convert("P").save(train / "palette.png")
    Image.fromarray(rng.integers(0, 255, (5, 7, 3), dtype=np.uint8)).save(train / "tiny.png")  # smaller than the crop
    (train / "corrupt.jpg").write_bytes(b"not an image at all")
    full = (train / "0.jpg").read_bytes()
    (tmp_path / "train" / "dogs" / "truncated.jpg").write_bytes(full[: len(full) // 2])
    return tmp_path


def test_imagefolder_skips_bad_files_and_reads_every_mode(messy_tree, caplog, cfg_factory):
    ds = SafeImageFolder(messy_tree / "train")
    bad = {str(messy_tree / "train" / "cats" / "corrupt.jpg"), str(messy_tree / "train" / "dogs" / "truncated.jpg")}
    items = [ds[i] for i in range(len(ds))]
    assert {path for _, _, path in items if path} == bad
    seen: set[str] = set()
    with caplog.at_level(logging.WARNING):
        note_skipped(seen, [path for _, _, path in items])
    assert seen == bad and all(n in caplog.text for n in ("corrupt.jpg", "truncated.jpg"))
    cfg = cfg_factory("data=imagefolder", f"data.root={messy_tree}", "data.crop_size=16", "data.num_workers=0")
    views = (ViewAug(size=16),) * 3
    dm = SSLDataModule(cfg.data, views, batch_size=4, num_workers=0)
    dm.setup()
    assert dm.num_classes == 2 and len(dm.eval_sets["test"]) == 12  # val/ is used when test/ is absent
    for i in range(len(dm.train_set)):
        sample = dm.train_set[i]
        assert len(sample["views"]) == 3 and all(v.shape == (3, 16, 16) for v in sample["views"])
        assert all(torch.isfinite(v).all() for v in sample["views"])
    batch = next(iter(dm.train_dataloader()))
    assert batch["params"]["crop_x"].shape == (4, 3) and len(batch["views"]) == 3


@pytest.mark.slow  # a run
def test_end_to_end_on_messy_imagefolder_counts_skips(messy_tree, cfg_factory, tmp_path):
    from hvp_lightning.training.driver import run

    cfg = cfg_factory(
        "data=imagefolder",
        f"data.root={messy_tree}",
        "data.crop_size=16",
        "method.batch_size=4",
        "+hvp=on",
        "hvp.num_views=3",
    )
    summary = run(cfg, tmp_path / "run")
    assert summary["skipped_images"] == 2 and all(
        f.endswith(("corrupt.jpg", "truncated.jpg")) for f in summary["skipped_files"]
    )


def test_images_hold_out_a_fixed_monitor_sample_and_train_on_the_rest(tmp_path, messy_tree, cfg_factory):
    """data=images: the training set and the monitor sample split the sorted images, the same
    split in every run (and for every seed); training items are the sorted images minus the
    held-out ones, in order (an image's index is its views' key); with data.eval_root the
    labelled bank and test loaders come first."""
    paths = [str(p) for p in write_images(tmp_path / "imgs", 30)]
    train_idx, held = monitor_split(30, 7)
    assert len(held) == 7 and sorted(train_idx + held) == list(range(30)) and (train_idx, held) == monitor_split(30, 7)
    for seed in (0, 5):
        cfg = cfg_factory("data=images", f"data.root={tmp_path / 'imgs'}", "data.monitor_size=7", f"seed={seed}")
        validate(cfg)
        dm = SSLDataModule(cfg.data, (ViewAug(size=16),) * 2, batch_size=4, num_workers=0, seed=seed)
        dm.setup()
        assert [p for p, _ in dm.train_raw.samples] == [paths[i] for i in train_idx]
        assert [p for p, _ in dm.eval_sets["monitor"].raw.samples] == [paths[i] for i in held]
        assert dm.num_classes == 0 and eval_roles(cfg.data) == ("monitor",) and len(dm.val_dataloader()) == 1
        item = dm.train_set[(0, 3)]
        assert item["label"] == -1 and item["index"] == 3 and len(item["views"]) == 2
    cfg = cfg_factory(
        "data=images", f"data.root={tmp_path / 'imgs'}", "data.monitor_size=7", f"data.eval_root={messy_tree}"
    )
    validate(cfg)
    dm = SSLDataModule(cfg.data, (ViewAug(size=16),) * 2, batch_size=4, num_workers=0)
    dm.setup()
    assert eval_roles(cfg.data) == ("bank", "test", "monitor") and dm.class_names == ["cats", "dogs"]
    assert [len(dm.eval_sets[r]) for r in ("bank", "test", "monitor")] == [18, 12, 7]


@pytest.mark.skipif(not (SHARED_CIFAR / "train").is_dir(), reason=f"shared CIFAR-10 not found at {SHARED_CIFAR}")
def test_shared_cifar10_imagefolder(cfg_factory):
    cfg = cfg_factory(
        "data=imagefolder",
        f"data.root={SHARED_CIFAR}",
        "data.crop_size=auto",
        "data.train_subset=64",
        "data.test_subset=32",
    )
    cfg = validate(cfg)  # resolves crop_size: auto from the images themselves
    assert (cfg.data.crop_size, cfg.data.eval_crop_ratio) == (32, 1.0)
    dm = SSLDataModule(cfg.data, (ViewAug(size=32),) * 4, batch_size=8, num_workers=0)
    dm.setup()
    assert dm.class_names == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    assert len(dm.train_set) == 64 and len(dm.eval_sets["test"]) == 32
    batch = next(iter(dm.train_dataloader()))
    assert len(batch["views"]) == 4 and batch["views"][0].shape == (8, 3, 32, 32)
    assert (batch["params"]["src_w"] == 32).all()
    ev = next(iter(dm.val_dataloader()[1]))
    assert ev["image"].shape == (8, 3, 32, 32) and ev["label"].max() < 10


def test_start_up_says_how_many_images_were_found_held_out_and_trained_on(tmp_path, caplog, cfg_factory):
    """A wrong root or extensions that do not count show at start-up, not as a short epoch."""
    write_images(tmp_path, 11)
    cfg = cfg_factory("data=images", f"data.root={tmp_path}", "data.monitor_size=3", "data.crop_size=16")
    dm = SSLDataModule(cfg.data, (ViewAug(size=16),) * 2, batch_size=4, num_workers=0)
    with caplog.at_level(logging.INFO, logger="hvp_lightning.data.datamodule"):
        dm.setup()
    assert "data: 8 training images (images), 3 held out for the monitors" in caplog.text
    caplog.clear()
    dm = SSLDataModule(cfg_factory().data, (ViewAug(size=16),) * 2, batch_size=4, num_workers=0)
    with caplog.at_level(logging.INFO, logger="hvp_lightning.data.datamodule"):
        dm.setup()
    assert "data: 64 training images (synthetic), 64 k-NN bank, 32 k-NN test" in caplog.text
