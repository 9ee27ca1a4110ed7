"""Where a dataset's images are on disk: ImageNet-layout split folders, the images of an
unlabelled folder or list (``data=images``), which files are images, and their typical size.
Torch-free, so start-up validation (hvp_lightning/config.py) can check a data root before the
heavy imports."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

from ..schema import TIMM_FAMILY, backbone_family
from .image_files import is_image_file

# What torchvision's dataset class reads under data.root (the first path missing is named at
# start-up), and the images' side in pixels where it is fixed.
TORCHVISION_FILES = {
    "cifar10": ("cifar-10-batches-py",),
    "cifar100": ("cifar-100-python",),
    "stl10": ("stl10_binary",),
    "flowers102": ("flowers-102/jpg", "flowers-102/imagelabels.mat", "flowers-102/setid.mat"),
    "food101": ("food-101/images", "food-101/meta/train.json", "food-101/meta/test.json"),
    "inat21": ("2021_train_mini", "2021_valid"),
}
IMAGE_SIDES = {"cifar10": 32, "cifar100": 32, "stl10": 96}


def is_hidden(name: str) -> bool:
    """Dot files and folders (``.ipynb_checkpoints``, macOS ``._x.jpg`` resource forks) are no images."""
    return name.startswith(".")


@functools.lru_cache(maxsize=4)
def images_under(root: Path) -> tuple[str, ...]:
    """Every image file under ``root`` at any depth (a flat folder included), sorted by path so
    that an image's index -- the key its views are drawn from -- is the same in every process
    and session. Symbolic links are followed, to files and to folders (a data set assembled from
    links to other folders is common); a folder reached twice (a link cycle, or two links to one
    folder) is read once. Hidden files and folders are left out. Cached: start-up validation, the
    crop size and the dataset ask for the same list."""
    found, seen = [], set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = [d for d in dirs if not is_hidden(d)]
        found += [os.path.join(folder, f) for f in files if not is_hidden(f) and is_image_file(f)]
    return tuple(sorted(found))


def listed_images(list_file: Path) -> tuple[str, ...]:
    """The paths listed in ``list_file``, one a line, in the file's order; relative ones are
    relative to the list's folder; blank lines and lines starting with ``#`` are skipped. Read
    once per version of the file (start-up and the dataset ask for it several times)."""
    stat = list_file.stat()
    return _read_list(list_file, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _read_list(list_file: Path, mtime_ns: int, size: int) -> tuple[str, ...]:
    base = list_file.parent
    lines = (line.strip() for line in list_file.read_text(encoding="utf-8-sig").splitlines())  # a BOM is no path
    return tuple(str(base / Path(line).expanduser()) for line in lines if line and not line.startswith("#"))


def split_dir(root: Path, split: str) -> Path:
    """``train/`` for training; ``test/`` or else ``val/`` for evaluation (ImageNet layout)."""
    if split == "train":
        return root / "train"
    return root / "test" if (root / "test").is_dir() else root / "val"


@functools.lru_cache(maxsize=8)
def typical_image_side(folder: Path, sample: int = 32) -> int:
    """Median shorter side of a few images (headers only), to size crops for unknown folders.
    Cached: start-up asks twice (``crop_size: auto`` and the upsampling warning), and listing
    an ImageNet-sized tree takes a while."""
    return median_side(tuple(str(p) for p in sorted(folder.rglob("*")) if p.is_file()), sample)


@functools.lru_cache(maxsize=8)
def median_side(paths: tuple[str, ...], sample: int = 32) -> int:
    """Median shorter side of ``sample`` images spread over ``paths`` (headers only; 224 if
    none of them opens)."""
    from PIL import Image

    sides = []
    for path in _spread(list(paths), sample):
        try:
            with Image.open(path) as img:
                sides.append(min(img.size))
        except Exception:  # noqa: BLE001 -- unreadable files are skipped at load time too
            continue
    return int(sorted(sides)[len(sides) // 2]) if sides else 224


def _spread(items: list, k: int) -> list:
    """k items spread over the list (every class folder, not only the first)."""
    step = max(1, len(items) // k)
    return items[::step][:k]


def training_images(d) -> tuple[str, ...]:
    """``data=images``: the images of ``data.files`` if set, else those under ``data.root``."""
    if d.files:
        return listed_images(Path(str(d.files)).expanduser().resolve())
    return images_under(Path(str(d.root)).expanduser())


def training_image_side(d) -> int:
    """Median shorter side of a folder or shard data set's training images
    (``data=imagefolder``, ``data=images``, ``data=shards``)."""
    if d.name == "images":
        return median_side(training_images(d))
    if d.name == "shards":
        from .shard_index import sample_side

        return sample_side(d)
    return typical_image_side(split_dir(Path(str(d.root)).expanduser(), "train"))


AUTO_CROP_MAX = 224  # crop_size: auto never exceeds the ImageNet protocol's crop
SMALL_CROP = 96  # up to this crop (CIFAR, STL), eval_crop_ratio: auto evaluates the whole image


def crop_multiple(backbone: Any) -> int:
    """What a crop size must be a multiple of for ``backbone``: a ViT's patch size (the preset's
    ``backbone.patch_size``; for ``backbone=timm``, ``model_args.patch_size`` or the ``patch<N>`` of
    its name, which hvp_lightning/config.py ``check_timm_backbone`` then checks against timm's
    model), else 1 (a CNN takes any size)."""
    if backbone is None:
        return 1
    family = backbone_family(backbone)
    if family == "vit":
        return int(backbone.patch_size)
    if family == TIMM_FAMILY:
        size = (backbone.model_args or {}).get("patch_size")  # timm's keyword arguments, as given
        found = re.search(r"patch(\d+)", backbone.name)
        return int(size) if size else int(found.group(1)) if found else 1
    return 1


def auto_crop_size(side: int, multiple: int = 1) -> int:
    """``crop_size: auto``: the images' median shorter side ``side``, at most 224 px, rounded down to
    ``multiple`` (:func:`crop_multiple`): half the images or more are cropped without upsampling.
    Only images smaller than one patch get a larger crop (one patch)."""
    return max(multiple, min(side, AUTO_CROP_MAX) // multiple * multiple)


def auto_eval_crop_ratio(crop: int, side: int) -> float:
    """``eval_crop_ratio: auto`` (evaluation: resize the shorter side to ``crop / ratio``, centre-crop
    ``crop``): up to 96 px crops, 1.0 (the whole image); above, the ImageNet protocol's 0.875 (resize
    256, crop 224) where the images are that large, else the ratio that keeps their own size
    (``crop / side``, at most 1.0): the evaluation upsamples no image the crop does not."""
    if crop <= SMALL_CROP:
        return 1.0
    return round(min(1.0, max(0.875, crop / side)), 4)


def resolve_auto_crop(d: Any, backbone: Any = None) -> Any:
    """The data section ``d`` with ``crop_size: auto`` (:func:`auto_crop_size`) and
    ``eval_crop_ratio: auto`` (:func:`auto_eval_crop_ratio`) resolved from its training images'
    median shorter side (a changed copy; ``d`` itself where neither is auto); ``backbone``: the
    run's backbone section, for a ViT's patch multiple."""
    changes: dict[str, Any] = {}
    crop = d.crop_size
    if crop == "auto":
        crop = changes["crop_size"] = auto_crop_size(training_image_side(d), crop_multiple(backbone))
    if d.eval_crop_ratio == "auto":  # the images' side matters only above SMALL_CROP
        side = training_image_side(d) if crop > SMALL_CROP else crop
        changes["eval_crop_ratio"] = auto_eval_crop_ratio(crop, side)
    return d.model_copy(update=changes) if changes else d
