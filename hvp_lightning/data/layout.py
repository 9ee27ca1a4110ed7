"""Where a dataset's images are on disk: ImageNet-layout split folders, which files are
images, and their typical size. Torch-free, so start-up validation (hvp_lightning/config.py)
can check a data root before the heavy imports."""

from __future__ import annotations

import functools
from pathlib import Path

from ..options import IMAGE_EXTENSIONS


def is_image_file(path: str) -> bool:
    return path.lower().endswith(IMAGE_EXTENSIONS)


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
    from PIL import Image

    sides = []
    for path in _spread(sorted(p for p in folder.rglob("*") if p.is_file()), sample):
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


def resolve_auto_crop(cfg) -> None:
    """``crop_size: auto``: small images (<= 96 px, CIFAR/STL-like) are cropped at their own
    size and evaluated uncropped; larger ones get the ImageNet 224 / 0.875 protocol."""
    if cfg.get("crop_size") == "auto":
        side = typical_image_side(split_dir(Path(cfg.root), "train"))
        cfg.crop_size = side if side <= 96 else 224
    if cfg.get("eval_crop_ratio") == "auto":
        cfg.eval_crop_ratio = 1.0 if cfg.crop_size <= 96 else 0.875
