"""Datasets held on the training device (``data.on_device``): crops against torchvision's,
batches against the loader's, the arrays taken from each dataset, a run that trains."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as tF
from torch.utils.data import Dataset, Subset
from torchvision.transforms.v2 import functional as F

from hvp_lightning.data.augment import (
    INTERPOLATION_MODES,
    PARAM_NAMES,
    UNIFORMS,
    ViewAug,
    crop_flip,
    draw_params,
    draw_view_params,
    to_uint8_tensor,
)
from hvp_lightning.data.batched import finish_views
from hvp_lightning.data.datamodule import SSLDataModule
from hvp_lightning.data.resident import ResidentImages, crop_flip_batch, resample_weights, stack_images
from hvp_lightning.data.seeds import view_keys
from hvp_lightning.data.textures import SyntheticTextures

from ..conftest import make_settings
from .test_batched_aug import record_host_reads


def _photos(n: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Half smooth (upsampled noise), half raw noise: both kinds of rounding cases."""
    g = torch.Generator().manual_seed(seed)
    smooth = tF.interpolate(torch.rand(n // 2, 3, h // 4, w // 4, generator=g), size=(h, w), mode="bilinear")
    noise = torch.rand(n - n // 2, 3, h, w, generator=g)
    return (torch.cat([smooth, noise]) * 255).round().to(torch.uint8)


CASES = [  # source h, w, view size, crop scale: up- and downscaling, square and not, multi-crop
    (32, 32, 32, (0.08, 1.0)),
    (96, 96, 64, (0.2, 1.0)),
    (120, 100, 32, (0.05, 1.0)),
    (200, 180, 96, (0.05, 0.4)),
]


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("h,w,size,scale", CASES)
def test_batched_crops_match_torchvision(
    h: int, w: int, size: int, scale: tuple[float, float], interpolation: str
) -> None:
    """Each crop equals torchvision's ``resized_crop`` (antialiased bilinear, or bicubic as
    DINO/iBOT/SimCLR crop) + flip of the same box: against its uint8 CPU kernel (fixed-point
    weights; what loader workers run) within one level (bicubic, rounded to 0..255 between its
    width and height passes as that kernel and PIL's: two levels on < 1e-4 of the pixels of
    noise images); bilinear against its float path (what it runs on a GPU) off by one level on
    at most 1e-3 of the pixels (float sums in another order)."""
    torch.manual_seed(0)
    imgs = _photos(48, h, w)
    p = draw_params(torch.rand(48, UNIFORMS, dtype=torch.float64), h, w, ViewAug(size=size, scale=scale))
    out = crop_flip_batch(imgs, p, size, interpolation)
    assert out.dtype == torch.uint8 and out.shape == (48, 3, size, size)
    rows = [{k: v[i] for k, v in p.items()} for i in range(48)]
    uint8 = torch.stack([crop_flip(img, r, size, interpolation) for img, r in zip(imgs, rows)])
    floats = torch.stack(
        [
            F.resized_crop(
                img.float(),
                int(r["crop_y"]),
                int(r["crop_x"]),
                int(r["crop_h"]),
                int(r["crop_w"]),
                [size, size],
                interpolation=INTERPOLATION_MODES[interpolation],
                antialias=True,
            )
            for img, r in zip(imgs, rows)
        ]
    )
    floats = torch.where(p["flip"].view(-1, 1, 1, 1) > 0, floats.flip(-1), floats).round().clamp(0, 255)
    d_float, d_uint8 = (out.float() - floats).abs(), (out.int() - uint8.int()).abs()
    if interpolation == "bilinear":
        assert d_float.max() <= 1 and (d_float > 0).float().mean() < 1e-3
        assert d_uint8.max() <= 1
    else:  # the uint8 kernel's rounded intermediate, through the cubic's negative lobes: 2 levels, rarely
        assert d_uint8.max() <= 2 and (d_uint8 > 1).float().mean() < 1e-4
    assert 0 < p["flip"].mean() < 1  # both branches ran


def test_resample_weights_are_the_interpolation_of_the_segment() -> None:
    """Rows sum to one, no weight outside the crop, and upscaling is plain bilinear
    (``align_corners=False``): the matrix times a signal is ``interpolate`` of its segment."""
    start, length = torch.tensor([0.0, 5.0, 17.0]), torch.tensor([40.0, 9.0, 23.0])
    w = resample_weights(start, length, 40, 16)
    torch.testing.assert_close(w.sum(2), torch.ones(3, 16, dtype=w.dtype))
    j = torch.arange(40)
    assert (w[(j[None, None] < start[:, None, None]).expand_as(w)] == 0).all()
    assert (w[(j[None, None] >= (start + length)[:, None, None]).expand_as(w)] == 0).all()
    signal = torch.rand(40, dtype=torch.float64)
    for k in range(3):
        a, n = int(start[k]), int(length[k])
        want = tF.interpolate(signal[a : a + n].view(1, 1, 1, -1), size=(1, 16), mode="bilinear", antialias=True)[
            0, 0, 0
        ]
        torch.testing.assert_close((w[k].double() @ signal), want, atol=1e-6, rtol=0)


def test_resident_batch_is_the_loader_batch_of_its_images() -> None:
    """``views`` gives what the loader path gives for the same images and parameters: view v of
    row k cut from image ``index[k]`` with row k's parameters (two sizes, multi-crop), labels
    and indices carried along; a fixed seed repeats the batch, another seed differs."""
    imgs, labels = _photos(20, 40, 36), torch.arange(20) % 7
    augs = (ViewAug(size=24),) * 2 + (ViewAug(size=12, scale=(0.05, 0.4)),) * 3
    res = ResidentImages(imgs, labels, augs, seed=5)
    index = torch.tensor([3, 17, 0, 3, 9])
    batch = res.views(index)
    assert set(batch["params"]) == {*PARAM_NAMES, "jitter_order"} and batch["params"]["crop_x"].shape == (5, 5)
    assert torch.equal(batch["label"], labels[index]) and torch.equal(batch["index"], index)
    for v, aug in enumerate(augs):
        assert batch["views"][v].shape == (5, 3, aug.size, aug.size)
        for k, i in enumerate(index.tolist()):
            want = crop_flip(imgs[i], {key: t[k, v] for key, t in batch["params"].items()}, aug.size)
            assert (batch["views"][v][k].int() - want.int()).abs().max() <= 1
    again = ResidentImages(imgs, labels, augs, seed=5).views(index)
    other = ResidentImages(imgs, labels, augs, seed=6).views(index)
    assert all(torch.equal(a, b) for a, b in zip(batch["views"], again["views"]))
    assert not torch.equal(batch["params"]["crop_x"], other["params"]["crop_x"])


def test_resident_draws_are_functions_of_seed_epoch_index_slot() -> None:
    """A view's parameters depend on (seed, epoch, image index, slot) alone: the same image in
    another batch, at another position, or after a resume (a fresh object, as after loading a
    checkpoint) gets the same parameters; other epochs, images and slots differ."""
    imgs, labels = _photos(16, 24, 24), torch.arange(16)
    augs = (ViewAug(size=16),) * 2
    running = ResidentImages(imgs, labels, augs, seed=3)
    batch = running.views(torch.arange(8), epoch=1)["params"]["crop_x"]
    resumed = ResidentImages(imgs, labels, augs, seed=3)
    other_batch = resumed.views(torch.tensor([12, 5, 2]), epoch=1)["params"]["crop_x"]
    assert torch.equal(other_batch[1:], batch[[5, 2]])
    assert not torch.equal(running.views(torch.arange(8), epoch=2)["params"]["crop_x"], batch)
    assert not torch.equal(batch[:, 0], batch[:, 1]) and len(set(batch[:, 0].tolist())) > 1


def test_run_dirs_from_before_the_key_still_resume() -> None:
    """``data.on_device: false`` is the behaviour of run dirs written before the key existed, so
    the resume check treats absent and false alike (true is a different run)."""
    from hvp_lightning.config import stored_config
    from hvp_lightning.schema.base import as_dict
    from hvp_lightning.training.checkpoint import config_differences

    cfg = make_settings()
    stored = as_dict(cfg)
    del stored["data"]["on_device"]  # a run dir written before the key
    old = stored_config(stored)
    assert config_differences(old, cfg) == []
    assert config_differences(old, cfg.with_values({"data.on_device": True})) == ["data.on_device"]


def test_draw_view_params_keeps_each_views_distribution() -> None:
    """Views of different augmentations (DINO's globals and locals) each get their own: local
    crops small, global crops large, in the views' order, for one image or for n."""
    augs = (ViewAug(size=24, scale=(0.4, 1.0)), ViewAug(size=12, scale=(0.05, 0.1)), ViewAug(size=24, scale=(0.4, 1.0)))
    p = draw_view_params(augs, 100, 100, view_keys(0, 0, torch.arange(400), 3))
    area = p["crop_w"] * p["crop_h"] / 1e4
    assert p["crop_w"].shape == (400, 3) and p["jitter_order"].shape == (400, 3, 4)
    assert (area[:, 1] <= 0.12).all() and (area[:, [0, 2]] >= 0.38).all()


class _CifarLike(Dataset):
    """torchvision CIFAR's layout: ``data`` uint8 ``[N, H, W, 3]``, ``targets`` a list."""

    def __init__(self, n: int) -> None:
        self.data = np.random.default_rng(0).integers(0, 256, (n, 8, 6, 3), dtype=np.uint8)
        self.targets = list(range(n))

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int):
        from PIL import Image

        return Image.fromarray(self.data[i]), self.targets[i]


class _Items(Dataset):
    """Only ``__getitem__``: the generic path."""

    def __init__(self, items: list) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def test_stack_images_takes_the_arrays_each_dataset_holds() -> None:
    """The arrays a dataset holds (textures, CIFAR's HWC, STL-10's CHW), a Subset of one, and the
    generic ``__getitem__`` path all give the images ``__getitem__`` gives; mixed sizes are
    refused with the key to change."""
    tex = SyntheticTextures(12, 16)
    for ds in (tex, _CifarLike(5), Subset(tex, [4, 1, 9])):
        images, labels = stack_images(ds)
        generic = stack_images(_Items([ds[i] for i in range(len(ds))]))
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        assert torch.equal(images, generic[0]) and torch.equal(labels, generic[1])
    stl = _CifarLike(4)
    stl.data, stl.labels = np.ascontiguousarray(stl.data.transpose(0, 3, 1, 2)), np.array([-1, 0, 1, 2])
    del stl.targets
    images, labels = stack_images(stl)
    assert images.shape == (4, 3, 8, 6) and labels.tolist() == [-1, 0, 1, 2]
    with pytest.raises(ValueError, match="data.on_device=true needs images of one size"):
        stack_images(
            _Items([(torch.zeros(3, 8, 8, dtype=torch.uint8), 0), (torch.zeros(3, 8, 9, dtype=torch.uint8), 1)])
        )


def test_a_folder_of_one_image_size_is_held_and_a_too_large_one_refused(tmp_path, cfg_factory, monkeypatch) -> None:
    """An image folder of one size (CIFAR-10 as JPEGs) can be held: its images, read through
    the folder's own loader, equal the loader path's; a set above the size limit is refused
    before it is read, naming the key."""
    from PIL import Image

    from hvp_lightning.data import resident

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(3):
                Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(
                    tmp_path / split / cls / f"{i}.jpg"
                )
    cfg = cfg_factory("data=imagefolder", f"data.root={tmp_path}", "data.on_device=true", "data.crop_size=12")
    dm = SSLDataModule(cfg.data, (ViewAug(size=12),) * 2, batch_size=2, num_workers=0)
    dm.setup("fit")
    assert dm.resident is not None and dm.resident.images.shape == (6, 3, 12, 12)
    assert all(torch.equal(dm.resident.images[i], to_uint8_tensor(dm.train_raw[i][0])) for i in range(6))
    assert dm.resident.labels.tolist() == [0, 0, 0, 1, 1, 1]
    monkeypatch.setattr(resident, "MAX_RESIDENT_BYTES", 1000)
    with pytest.raises(ValueError, match=r"data.on_device=true would hold 6 images .* set data.on_device=false"):
        stack_images(dm.train_raw)


@pytest.mark.slow  # the loader workers' fork server started
def test_datamodule_on_device_yields_indices_and_finishes_them_after_transfer(cfg_factory) -> None:
    """The training loader yields index batches (no workers); the transfer hook turns them into
    normalised float views with recorded parameters, labels of those images, as a loader batch."""
    cfg = cfg_factory("data.on_device=true")
    augs = (ViewAug(size=16),) * 3
    dm = SSLDataModule(cfg.data, augs, batch_size=8, num_workers=2)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.num_workers == 0
    index = next(iter(loader))
    assert index.dtype == torch.int64 and index.shape == (8,)
    batch = dm.on_after_batch_transfer(index, 0)
    assert [v.shape for v in batch["views"]] == [(8, 3, 16, 16)] * 3
    assert all(v.dtype == torch.float32 for v in batch["views"])
    assert batch["params"]["crop_w"].shape == (8, 3)
    want = torch.tensor([int(dm.train_raw[i][1]) for i in index.tolist()])
    assert torch.equal(batch["label"], want)
    mean, std = torch.tensor(augs[0].mean).view(3, 1, 1), torch.tensor(augs[0].std).view(3, 1, 1)
    levels = [(v * std + mean) * 255 for v in batch["views"]]  # integers 0..255 before normalising
    assert all(x.round().sub(x).abs().max() < 1e-3 and x.min() > -1e-3 and x.max() < 255 + 1e-3 for x in levels)
    evaluation = next(iter(dm.val_dataloader()[0]))
    assert dm.on_after_batch_transfer(evaluation, 0) is evaluation


def test_views_do_not_depend_on_the_rank(cfg_factory) -> None:
    """DDP: each rank (its own process, its own data module) cuts the views of an image with the
    draws of (seed, epoch, index, slot): the same on every rank, so the process layout does
    not change a view. (Ranks see different images: the sampler splits the order.)"""
    from types import SimpleNamespace

    cfg, index = cfg_factory("data.on_device=true"), torch.arange(8)

    def crops(rank: int, epoch: int = 0) -> torch.Tensor:
        dm = SSLDataModule(cfg.data, (ViewAug(size=16),) * 2, batch_size=8, num_workers=0)
        dm.setup("fit")  # no trainer yet, as in train.py
        dm.trainer = SimpleNamespace(global_rank=rank, current_epoch=epoch, training=True)
        return dm.on_after_batch_transfer(index, 0)["params"]["crop_x"]

    rank0 = crops(0)
    assert torch.equal(crops(1), rank0)
    assert not torch.equal(crops(0, epoch=1), rank0)


@pytest.mark.slow  # a run
def test_run_with_resident_images_trains_and_logs_views(cfg_factory, tmp_path: Path) -> None:
    """A short HVP run with ``data.on_device=true``: it trains, the selection works, and the
    hard-view analysis gets its per-view parameters."""
    from hvp_lightning.training.driver import run

    summary = run(cfg_factory("data.on_device=true", "+hvp=on", "hvp.num_views=3"), tmp_path)
    assert summary["steps"] == 4 and math.isfinite(summary["train_loss"])
    assert summary["hvp"]["selection_selected_loss_mean"] >= summary["hvp"]["selection_candidate_loss_mean"]
    steps = (tmp_path / "analysis" / "steps-r0.csv").read_text().splitlines()
    assert steps[0].startswith("step,") and "iou_selected" in steps[0] and len(steps) == 5


def test_resident_batch_makes_one_host_read(monkeypatch) -> None:
    """Cutting resident views calls no Python-level host read (``item``, ``tolist``,
    ``nonzero``, bool tests, copies to the CPU, new host tensors), and colouring them one: the
    op counts of the whole batch (:func:`.batched.plan_colour`). Syncs inside C++ (a bool-mask
    index, a host list as an index) are not visible here: the CUDA test (tests/test_gpu.py)
    counts them under ``torch.cuda.set_sync_debug_mode``."""
    imgs, labels = _photos(12, 40, 36), torch.arange(12)
    augs = (ViewAug(size=24, blur_p=0.5, solarize_p=0.3),) * 2 + (ViewAug(size=12, scale=(0.05, 0.4)),) * 2
    res = ResidentImages(imgs, labels, augs, seed=0)
    index = torch.tensor([5, 1, 7])
    res.views(index)  # moves the images and makes the generator (once per run)
    reads = record_host_reads(monkeypatch)
    batch = res.views(index)
    reads_of_crops = list(reads)
    out = finish_views(batch["views"], batch["params"], augs, sync_free=True)
    monkeypatch.undo()
    assert reads_of_crops == [] and reads == ["tolist"]
    assert [v.shape for v in out] == [(3, 3, 24, 24)] * 2 + [(3, 3, 12, 12)] * 2
