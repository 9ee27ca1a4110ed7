"""Raw image datasets: ``ds[i] -> (image, label)`` with image a PIL image or uint8 tensor.

* :class:`SyntheticShapes` -- the built-in offline default: 10 classes of procedurally
  drawn shapes on noisy backgrounds. Class identity is geometric, so it survives colour
  jitter and grayscale (what SSL augmentations leave invariant), and needs no files.
* :class:`SafeImageFolder` -- ImageNet-layout folders that skip unreadable files with a
  warning instead of killing a multi-day run.
* torchvision CIFAR-10/100 and STL-10 (downloaded only when asked to).
"""

from __future__ import annotations

import colorsys
import logging
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only
from PIL import Image, ImageOps
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

log = logging.getLogger(__name__)

ORIENTATION = 0x0112  # the EXIF tag
SHAPES = ("disc", "ring", "square", "diamond", "plus", "cross", "triangle", "hbars", "vbars", "checker")


def _shape_mask(kind: int, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Mask of a unit shape in normalised coordinates (|dx|, |dy| <= 1 is the bounding box)."""
    ax, ay = np.abs(dx), np.abs(dy)
    rho = np.sqrt(dx**2 + dy**2)
    box = (ax < 1) & (ay < 1)
    name = SHAPES[kind]
    if name == "disc":
        return rho < 1
    if name == "ring":
        return (rho < 1) & (rho > 0.55)
    if name == "square":
        return (ax < 0.8) & (ay < 0.8)
    if name == "diamond":
        return ax + ay < 1
    if name == "plus":
        return ((ax < 0.3) & (ay < 1)) | ((ay < 0.3) & (ax < 1))
    if name == "cross":
        return ((np.abs(dx - dy) < 0.4) | (np.abs(dx + dy) < 0.4)) & (rho < 1)
    if name == "triangle":
        return (dy > -0.8) & (dy < 0.8) & (ax < (dy + 0.8) * 0.6)
    if name == "hbars":
        return box & (np.floor((dy + 1) * 2.5) % 2 == 0)
    if name == "vbars":
        return box & (np.floor((dx + 1) * 2.5) % 2 == 0)
    return box & ((np.floor((dx + 1) * 2) + np.floor((dy + 1) * 2)) % 2 == 0)  # checker


class SyntheticShapes(Dataset):
    """Deterministic, learnable, offline image classification data (generated in memory).

    Each image holds 2-4 copies of its class's shape at random positions and sizes, coloured
    around its class's hue, over a noisy gray gradient, so random crops still see the class.
    """

    num_classes = len(SHAPES)

    def __init__(self, num_images: int, image_size: int = 32, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        s = image_size
        yy, xx = np.mgrid[0:s, 0:s].astype(np.float32)
        self.labels = torch.from_numpy(rng.integers(0, self.num_classes, num_images))
        images = np.empty((num_images, s, s, 3), dtype=np.float32)
        for i, label in enumerate(self.labels.tolist()):
            # Gray gradient background; the shapes' hue is drawn around a class hue, so that, as
            # in natural classes, colour statistics and shape both carry the class.
            g0, g1 = rng.uniform(0.1, 0.9, 2)
            angle = rng.uniform(0, 2 * np.pi)
            t = ((xx * np.cos(angle) + yy * np.sin(angle)) / s + 1) / 2
            img = np.repeat((g0 + (g1 - g0) * t)[..., None], 3, axis=2)
            img += rng.normal(0, 0.05, (s, s, 1))
            for _ in range(rng.integers(2, 5)):
                cx, cy = rng.uniform(0.15, 0.85, 2) * s
                r = rng.uniform(0.16, 0.3) * s
                mask = _shape_mask(label, (xx - cx) / r, (yy - cy) / r)
                hue = (label / self.num_classes + rng.uniform(-0.04, 0.04)) % 1.0
                img[mask] = colorsys.hsv_to_rgb(hue, rng.uniform(0.5, 1.0), rng.uniform(0.55, 1.0))
            images[i] = img
        self.images = torch.from_numpy((np.clip(images, 0, 1) * 255).astype(np.uint8)).permute(0, 3, 1, 2).contiguous()
        self.classes = list(SHAPES)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.labels[i])


# torchvision's ImageFolder extensions plus GIF (its first frame is the image).
IMAGE_EXTENSIONS = (*IMG_EXTENSIONS, ".gif")


def is_image_file(path: str) -> bool:
    return path.lower().endswith(IMAGE_EXTENSIONS)


class SafeImageFolder(ImageFolder):
    """ImageFolder that survives real folders: empty class folders (kept as classes, so labels
    agree across splits; named once), files of any PIL mode (:func:`to_rgb8`), and unreadable
    or truncated files.

    A file that fails to decode is replaced by the next readable sample, so epochs keep their
    length; the third item of a sample names the skipped file ("" if none). The dataset itself
    stays silent (it runs in every loader worker): the training process names each skipped
    file once (:func:`note_skipped`) and the run summary counts them.
    """

    max_retries = 16

    def __init__(self, root: str | Path) -> None:
        super().__init__(str(root), loader=load_image, is_valid_file=is_image_file, allow_empty=True)
        empty = sorted(set(self.classes) - {self.classes[label] for _, label in self.samples})
        if empty and rank_zero_only.rank == 0:
            log.warning("%s: %d class folder(s) without images (kept as classes): %s", root, len(empty),
                        ", ".join(empty[:10]) + (", ..." if len(empty) > 10 else ""))
        if not self.samples:
            raise FileNotFoundError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in the class folders of {root}")

    def __getitem__(self, index: int) -> tuple[Image.Image, int, str]:  # type: ignore[override]
        bad = ""
        for attempt in range(self.max_retries):
            i = (index + attempt) % len(self.samples)
            path, label = self.samples[i]
            try:
                return self.loader(path), label, bad
            except Exception:  # noqa: BLE001 -- any decoder failure means "skip this file"
                bad = bad or path
        raise RuntimeError(f"{self.max_retries} consecutive unreadable images from {self.samples[index][0]}")


def load_image(path: str) -> Image.Image:
    """The image at ``path`` as 8-bit RGB, upright: its EXIF orientation applied (unlike
    torchvision's loader), a GIF's first frame, any mode converted by :func:`to_rgb8`."""
    with open(path, "rb") as f:
        img = Image.open(f)
        img.load()  # decode now, so truncation raises here and not later in a transform
    if img.getexif().get(ORIENTATION, 1) != 1:
        img = ImageOps.exif_transpose(img)
    return to_rgb8(img)


def to_rgb8(img: Image.Image) -> Image.Image:
    """8-bit RGB of a PIL image of any mode, intensities kept. PIL's own conversion clips
    16/32-bit integer images at 255 (nearly white), so those are scaled from 16 bits
    (``I;16*``; ``I``, the mode of 16-bit PNGs in older Pillow, is taken as 16-bit too, values
    clipped to [0, 65535]); float (``F``) images are scaled from [0, 1] when their values lie
    there, else clipped to [0, 255]. Palette, LA/PA and RGBA images drop their transparency
    (through RGBA, so every palette image is handled alike); CMYK, 1-bit and others use PIL."""
    if img.mode == "RGB":
        return img
    if img.mode.startswith("I") or img.mode == "F":
        a = np.asarray(img, dtype=np.float64)
        if img.mode.startswith("I"):
            a = np.clip(a, 0, 65535) * (255 / 65535)
        elif a.size and np.nanmax(a) <= 1.0:
            a = a * 255
        a = np.nan_to_num(np.clip(np.rint(a), 0, 255)).astype(np.uint8)
        return Image.fromarray(a).convert("RGB")  # mode L -> RGB
    if img.mode in ("P", "PA", "LA", "RGBA", "La", "RGBa"):
        return img.convert("RGBA").convert("RGB")
    return img.convert("RGB")


def note_skipped(seen: set[str], files: Iterable[str]) -> None:
    """Add the skipped ``files`` of a batch to ``seen``, naming each new one once (with the
    reason it cannot be read now). Runs in the training process, not in loader workers,
    so a file is named once however many workers or retries met it."""
    for path in files:
        if path and path not in seen:
            seen.add(path)
            try:
                load_image(path)
                why = "it failed to decode when loaded"
            except Exception as err:  # noqa: BLE001 -- the reason is reported, not handled
                why = f"{type(err).__name__}: {err}"
            log.warning("skipping unreadable image %s (%s)", path, why)
