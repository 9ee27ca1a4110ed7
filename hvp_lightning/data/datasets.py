"""Raw image datasets: ``ds[i] -> (image, label)`` with image a PIL image or uint8 tensor.

* :class:`~hvp_lightning.data.textures.SyntheticTextures` (its own module) -- the built-in offline
  default, generated in memory
  (hvp_lightning/data/textures.py: the class is a texture; colours, period, phase and shading vary).
* :class:`SafeImageFolder` -- ImageNet-layout folders that skip unreadable files with a
  warning instead of killing a multi-day run.
* :class:`ImageFiles` -- unlabelled images (``data=images``: every image under a folder, or a
  list of paths), skipping unreadable files the same way (:func:`first_readable`).
* :class:`ShardImages` -- the images of WebDataset tar shards (``data=shards``), read by byte
  range through :mod:`.shard_index`, skipping undecodable samples the same way.
* torchvision CIFAR-10/100 and STL-10 (downloaded only when asked to).
* :func:`transfer_splits` -- torchvision Flowers102, Food101 and iNaturalist 2021, the paper's
  transfer data sets, read through :func:`read_image` (downloaded only when asked to).
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torch.utils.data import Dataset
from torchvision import datasets as tvd
from torchvision.datasets import ImageFolder
from torchvision.io import ImageReadMode, decode_jpeg, read_file

from ..errors import ConfigError
from ..run.process_rank import env_rank
from .image_files import IMAGE_EXTENSIONS, is_image_file
from .shard_index import ShardIndex, ShardReader, is_local, is_shard_member

log = logging.getLogger(__name__)

ORIENTATION = 0x0112  # the EXIF tag
JPEG_SUFFIXES = (".jpg", ".jpeg")


MAX_RETRIES = 16  # unreadable files in a row before a sample gives up


def first_readable(
    samples: Sequence[tuple[str, int]], index: int, loader: Callable[[str], Any]
) -> tuple[Any, int, str]:
    """``(image, label, skipped)`` of sample ``index`` of ``(path, label)`` samples, or of the next
    readable one after it (wrapping around) when its file fails to decode: epochs keep their
    length, and ``skipped`` names the first unreadable file met ("" if none) for
    :func:`note_skipped`. Raises after :data:`MAX_RETRIES` unreadable files in a row."""
    return readable_from(len(samples), index, lambda j: (loader(samples[j][0]), samples[j][1]), lambda j: samples[j][0])


def readable_from(
    n: int, index: int, read: Callable[[int], tuple[Any, int]], name: Callable[[int], str]
) -> tuple[Any, int, str]:
    """:func:`first_readable` over any ``n`` samples: ``read(j)`` gives sample ``j``'s
    ``(image, label)`` or raises, ``name(j)`` names it in the skip report."""
    bad = ""
    for attempt in range(MAX_RETRIES):
        j = (index + attempt) % n
        try:
            image, label = read(j)
            return image, label, bad
        except Exception:  # noqa: BLE001 -- any decoder failure means "skip this sample"
            bad = bad or name(j)
    raise RuntimeError(f"{MAX_RETRIES} consecutive unreadable images from {name(index)}")


class SafeImageFolder(ImageFolder):
    """ImageFolder that survives real folders: empty class folders (kept as classes, so labels
    agree across splits; named once), files of any PIL mode (:func:`to_rgb8`), and unreadable
    or truncated files.

    A file that fails to decode is replaced by the next readable sample, so epochs keep their
    length; the third item of a sample names the skipped file ("" if none). The dataset itself
    stays silent (it runs in every loader worker): the training process names each skipped
    file once (:func:`note_skipped`) and the run summary counts them.
    """

    def __init__(self, root: str | Path) -> None:
        super().__init__(str(root), loader=read_image, is_valid_file=is_image_file, allow_empty=True)
        empty = sorted(set(self.classes) - {self.classes[label] for _, label in self.samples})
        if empty and env_rank() == 0:
            log.warning(
                "%s: %d class folder(s) without images (kept as classes): %s",
                root,
                len(empty),
                ", ".join(empty[:10]) + (", ..." if len(empty) > 10 else ""),
            )
        if not self.samples:
            raise FileNotFoundError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) in the class folders of {root}")

    def __getitem__(self, index: int) -> tuple[torch.Tensor | Image.Image, int, str]:  # type: ignore[override]
        return first_readable(self.samples, index, self.loader)


class ImageFiles(Dataset):
    """Unlabelled images at the given paths, in that order: item ``i`` is ``(image, -1, skipped)``
    as :class:`SafeImageFolder`'s, an unreadable file replaced by the next readable one. The
    order is the key of each image's views (:mod:`.seeds`), so callers pass a sorted or listed
    order, never the file system's."""

    def __init__(self, paths: Sequence[str]) -> None:
        if not paths:
            raise FileNotFoundError(f"no image files ({', '.join(IMAGE_EXTENSIONS)}) to read")
        self.samples = [(str(p), -1) for p in paths]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor | Image.Image, int, str]:
        return first_readable(self.samples, index, read_image)


class ShardImages(Dataset):
    """The images of WebDataset shards (``data=shards``), in index order or the given subset of
    it: item ``i`` is ``(image, label, skipped)`` as :class:`SafeImageFolder`'s (label -1 for
    unlabelled shards), an image whose bytes do not decode -- or lie past the end of a
    truncated shard -- replaced by the next readable one and named ``<shard url>#<key>``.
    Position ``i`` is the key of the image's views, as a folder's sorted position is."""

    def __init__(
        self, index: ShardIndex, storage_options: dict[str, Any] | None = None, keep: Sequence[int] | None = None
    ) -> None:
        self.index = index
        self.keep = list(range(len(index))) if keep is None else list(keep)
        if not self.keep:
            raise FileNotFoundError(f"no images in the {len(index.urls)} shards to read")
        self.reader = ShardReader(storage_options)
        self.classes = list(index.classes)
        self.fetched: dict[int, bytes | bytearray | None] = {}  # item -> bytes of the batch being read (prefetch)

    def __len__(self) -> int:
        return len(self.keep)

    def read(self, j: int) -> tuple[torch.Tensor | Image.Image, int]:
        """(image, label) of item ``j``; raises when its bytes do not decode."""
        k = self.keep[j]
        url, offset, size, suffix, label = self.index.member(k)
        data = self.fetched[j] if j in self.fetched else self.reader.read(url, offset, size)
        if data is None:
            raise OSError(f"{self.index.name(k)}: its bytes could not be read")
        return image_from_bytes(data, suffix), label

    def prefetch(self, items: Sequence[int]) -> None:
        """Fetch the bytes of a batch's items together (object storage: concurrent ranged GETs,
        :meth:`.shard_index.ShardReader.read_many`) for the reads that follow; the previous
        batch's bytes are dropped. Local shards read on demand."""
        members = {j: self.index.member(self.keep[j]) for j in items}
        wanted = [j for j in items if not is_local(members[j][0])]
        requests = [members[j][:3] for j in wanted]
        self.fetched = dict(zip(wanted, self.reader.read_many(requests), strict=True)) if wanted else {}

    def __getitem__(self, i: int) -> tuple[torch.Tensor | Image.Image, int, str]:
        return readable_from(len(self.keep), i, self.read, lambda j: self.index.name(self.keep[j]))


def transfer_splits(name: str, root: str, download: bool) -> tuple[Dataset, Dataset, list[str]]:
    """(train, test, class names) of a transfer data set, split as the official HVP code
    (automl/hvp data.py): Flowers102 ``train`` (10 images a class) and ``test``; Food101
    ``train`` and ``test``; iNaturalist 2021 ``2021_train_mini`` (50 images a class) and
    ``2021_valid``, all 10,000 species. Files that torchvision rejects (Flowers102 checks the
    .mat files' MD5) raise a :class:`ConfigError` naming ``data.root``."""
    try:
        return _torchvision_splits(name, root, download)
    except RuntimeError as err:  # torchvision: "Dataset not found or corrupted"
        raise ConfigError(
            f"data.root={root!r} is not allowed: torchvision's {name} rejects the files there ({err}); "
            "they must be the released ones (docs/data.md)"
        ) from None


def _torchvision_splits(name: str, root: str, download: bool) -> tuple[Dataset, Dataset, list[str]]:
    if name == "flowers102":
        train = tvd.Flowers102(root, split="train", download=download, loader=read_image)
        test = tvd.Flowers102(root, split="test", download=download, loader=read_image)
        return train, test, list(train.classes)
    if name == "food101":
        train = tvd.Food101(root, split="train", download=download, loader=read_image)
        test = tvd.Food101(root, split="test", download=download, loader=read_image)
        return train, test, list(train.classes)
    if name == "inat21":
        train = tvd.INaturalist(root, version="2021_train_mini", download=download, loader=read_image)
        test = tvd.INaturalist(root, version="2021_valid", download=download, loader=read_image)
        if train.all_categories != test.all_categories:
            raise ValueError(f"{root}: 2021_train_mini and 2021_valid have different class folders")
        for ds in (train, test):  # torchvision lists each class folder in os.listdir's order
            ds.index.sort()  # file-system order would make data.*_subset pick other images elsewhere
        return train, test, list(train.all_categories)
    raise ValueError(f"not a transfer data set: {name!r}")


def read_image(path: str | os.PathLike) -> torch.Tensor | Image.Image:
    """What :class:`SafeImageFolder` loads. A JPEG of grey or YCbCr pixels goes through
    torchvision's libjpeg-turbo decoder straight into a uint8 tensor ``[1 or 3, H, W]``, EXIF
    orientation applied: :func:`load_image`'s pixels (tested) in about 2/3 of its time, with
    no PIL-to-tensor copy (benchmarks/RESULTS.md). Anything else -- other formats, CMYK JPEGs,
    files that are not what their name says, unreadable files (which then raise) -- goes
    through :func:`load_image`."""
    path = os.fspath(path)  # torchvision's datasets pass Paths
    if path.lower().endswith(JPEG_SUFFIXES):
        img = jpeg_tensor(read_file(path))
        if img is not None:
            return img
    return load_image(path)


def image_from_bytes(data: bytes | bytearray, suffix: str) -> torch.Tensor | Image.Image:
    """:func:`read_image` of a file's bytes (a shard member with this file suffix): the same
    pixels as the file it was made from."""
    if f".{suffix.lower()}" in JPEG_SUFFIXES:
        img = jpeg_tensor(torch.frombuffer(data if isinstance(data, bytearray) else bytearray(data), dtype=torch.uint8))
        if img is not None:
            return img
    return pil_image(io.BytesIO(data))


def jpeg_tensor(data: torch.Tensor) -> torch.Tensor | None:
    """A JPEG's pixels ``[1 or 3, H, W]`` decoded by libjpeg-turbo, or None where PIL must read
    it (not a JPEG after all, damaged -- PIL then names why --, or CMYK)."""
    try:
        img = decode_jpeg(data, mode=ImageReadMode.UNCHANGED, apply_exif_orientation=True)
    except RuntimeError:
        return None
    return img if img.shape[0] in (1, 3) else None


def load_image(path: str) -> Image.Image:
    """The image at ``path`` as 8-bit RGB, upright: its EXIF orientation applied (unlike
    torchvision's loader), a GIF's first frame, any mode converted by :func:`to_rgb8`."""
    with open(path, "rb") as f:
        return pil_image(f)


def pil_image(f: Any) -> Image.Image:
    """:func:`load_image` of an open binary file."""
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
                if is_shard_member(path):
                    raise ValueError("its bytes in the shard do not decode as an image, or the shard ends before them")
                load_image(path)
                why = "it failed to decode when loaded"
            except Exception as err:  # noqa: BLE001 -- the reason is reported, not handled
                why = f"{type(err).__name__}: {err}"
            log.warning("skipping unreadable image %s (%s)", path, why)
