"""Small datasets held whole on the training device, with the views cut there too.

CIFAR-10/100 (150 MB of uint8), STL-10 (2.9 GB with its unlabelled split), the built-in
textures and image folders of one small image size (CIFAR-10 as JPEGs) fit in an
accelerator's memory many times over. Held there (``data.on_device=true``),
a training batch is a vector of indices: :class:`ResidentImages` draws every view's
parameters on the device (:func:`.augment.draw_view_params`, the distributions of
torchvision's samplers), cuts all crops of the batch at once (:func:`crop_flip_batch`), and
the colour step follows as for loader batches (:func:`.batched.finish_views`). No loader
workers, no host-to-device copies of images, no per-image Python.

The crop is a resampling written as two batched matrix products: output row ``i`` of a crop is
a weighted sum of source rows, with the weights of PyTorch's antialiased bilinear or bicubic
resize (``interpolate(..., antialias=True)``, which ``torchvision``'s ``resized_crop`` calls: a
triangle filter, or Keys' cubic with a = -0.5 as PIL's, stretched by the downscale factor and
normalised over the taps inside the crop), and likewise for columns; a flip reverses the
column weights. The products run in float64:
``train.py`` allows TF32 matmuls on GPUs (``set_float32_matmul_precision("high")``), whose
10-bit inputs would move 2-3% of the pixels by a level; in float64 (exact for uint8 inputs)
the result, rounded to uint8, is torchvision's float path up to its own float32 rounding, and
within one level (1/255) of its uint8 CPU kernel, which rounds fixed-point weights (the tests
measure both). At CIFAR sizes the float64 products cost next to nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from ..run.process_rank import env_rank
from .augment import ViewAug, draw_view_params, to_uint8_tensor
from .iou_policy import IoUPolicy, constrain_keys
from .seeds import view_keys
from .textures import SyntheticTextures
from .workers import worker_options

BOX_KEYS = ("crop_x", "crop_y", "crop_w", "crop_h", "flip")  # the parameters a crop needs
log = logging.getLogger(__name__)
MAX_RESIDENT_BYTES = 16 * 2**30  # STL-10 with its unlabelled split is 2.9 GB; ImageNet at 224 px ~190 GB


def resample_weights(
    start: torch.Tensor, length: torch.Tensor, in_size: int, out_size: int, interpolation: str = "bilinear"
) -> torch.Tensor:
    """``[n, out_size, in_size]`` weights that resize the segment ``[start, start + length)`` of
    each of ``n`` rows (or columns) of ``in_size`` pixels to ``out_size`` pixels, as
    ``interpolate(mode=interpolation, antialias=True, align_corners=False)`` of the cropped segment."""
    start, length = start.to(torch.float32)[:, None, None], length.to(torch.float32)[:, None, None]
    scale = length / out_size  # PyTorch's scale for a given output size: in / out
    centre = scale * (torch.arange(out_size, dtype=torch.float32, device=start.device)[None, :, None] + 0.5)
    j = torch.arange(in_size, dtype=torch.float32, device=start.device)[None, None, :] - start  # crop coordinates
    stretch = scale.clamp_min(1.0)  # the filter widens with the downscale factor only
    t = ((j - centre + 0.5) / stretch).abs()
    w = _cubic(t) if interpolation == "bicubic" else (1 - t).clamp_min_(0)
    w = w * ((j >= 0) & (j < length))
    return w / w.sum(dim=2, keepdim=True)


def _cubic(t: torch.Tensor, a: float = -0.5) -> torch.Tensor:
    """Keys' cubic convolution kernel at ``|x|`` = ``t`` (PyTorch's antialiased bicubic filter, PIL's a)."""
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = (((t - 5) * t + 8) * t - 4) * a
    return torch.where(t < 1, near, torch.where(t < 2, far, 0.0))


def crop_flip_batch(
    images: torch.Tensor, params: dict[str, torch.Tensor], size: int, interpolation: str = "bilinear"
) -> torch.Tensor:
    """The crops of ``n`` images, uint8: ``images`` uint8 ``[n, 3, H, W]``, ``params`` crop boxes
    and flips as drawn by :func:`.augment.draw_params`, ``[n]`` (one view of each image ->
    ``[n, 3, size, size]``) or ``[n, K]`` (K views of each -> ``[n, K, 3, size, size]``: the
    column weights of all K stack into one product per image, so the images are not copied K
    times). ``interpolation``: ``ViewAug.interpolation``."""
    n, _, h, w = images.shape
    per_image = params["crop_x"].dim() == 2
    k = params["crop_x"].shape[1] if per_image else 1
    box = {key: params[key].reshape(-1) for key in BOX_KEYS}  # image-major: image i's K views together
    rows = resample_weights(box["crop_y"], box["crop_h"], h, size, interpolation).double()  # [n * K, S, H]
    cols = resample_weights(box["crop_x"], box["crop_w"], w, size, interpolation).double()  # [n * K, S, W]
    cols = torch.where(box["flip"].view(-1, 1, 1) > 0, cols.flip(1), cols)
    # along the width first, then the height, as PIL and PyTorch's uint8 kernel; a bicubic crop
    # is rounded to 0..255 in between as theirs (its overshoot at edges is cut there)
    x = torch.matmul(images.to(torch.float64), cols.view(n, 1, k * size, w).transpose(-1, -2))  # [n, 3, H, K * S]
    if interpolation == "bicubic":
        x = x.round_().clamp_(0, 255)
    x = x.view(n, 3, h, k, size).permute(0, 3, 1, 2, 4)  # [n, K, 3, H, S]
    x = torch.matmul(rows.view(n, k, 1, size, h), x)  # [n, K, 3, S, S]
    out = x.round_().clamp_(0, 255).to(torch.uint8)
    return out if per_image else out[:, 0]


def stack_images(raw: Dataset, workers: int = 0, wait_s: float = 600.0) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``[N, 3, H, W]`` images and int64 ``[N]`` labels of an in-memory dataset (CIFAR,
    STL-10, the textures, an image folder of one image size, or a ``Subset`` of one). The
    arrays a dataset holds are taken as they are, a subset's rows picked before the copy
    (50,000 CIFAR images cost milliseconds); others are read once, by ``workers`` processes
    (:mod:`.workers`; each wait for a batch at most ``wait_s`` seconds)."""
    base, index = (raw.dataset, list(raw.indices)) if isinstance(raw, Subset) else (raw, None)
    held = held_arrays(base)
    if held is None:
        return read_images(raw, workers, wait_s)
    images, labels = held
    if index is not None:
        rows = torch.as_tensor(index, dtype=torch.int64)
        images, labels = images[rows], labels[rows]
    return images.contiguous(), labels


def read_images(raw: Dataset, workers: int = 0, wait_s: float = 600.0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`stack_images` through ``__getitem__`` (decoded in ``workers`` loader processes),
    for datasets that hold no arrays; refuses more than :data:`MAX_RESIDENT_BYTES` before
    reading them all, and images of another size than the first."""
    n = len(raw)  # type: ignore[arg-type]
    if n == 0:
        raise ValueError("data.on_device=true: the training set is empty")
    first = to_uint8_tensor(raw[0][0])
    need = n * first.numel()
    if need > MAX_RESIDENT_BYTES:
        raise ValueError(
            f"data.on_device=true would hold {n} images of {tuple(first.shape[1:])} px: "
            f"{need / 2**30:.1f} GiB, more than {MAX_RESIDENT_BYTES / 2**30:.0f} GiB; set data.on_device=false"
        )
    say = log.info if env_rank() == 0 else (lambda *args: None)  # every rank reads; one says so
    say("data.on_device: reading %d training images (%.0f MiB) into one tensor", n, need / 2**20)
    images = torch.empty((n, *first.shape), dtype=torch.uint8)
    labels = torch.empty(n, dtype=torch.int64)
    start, i = time.monotonic(), 0
    for batch, batch_labels in DataLoader(
        raw, batch_size=256, collate_fn=uint8_items, **worker_options(workers, wait_s)
    ):
        if isinstance(batch, list) or batch.shape[1:] != first.shape:  # a list: sizes differ within the batch
            odd = next(k for k, img in enumerate(batch) if img.shape != first.shape)
            raise ValueError(
                f"data.on_device=true needs images of one size: image 0 is {tuple(first.shape[1:])}, "
                f"image {i + odd} is {tuple(batch[odd].shape[1:])}; set data.on_device=false"
            )
        images[i : i + len(batch)] = batch
        labels[i : i + len(batch)] = batch_labels
        i += len(batch)
        if i // 256 % 40 == 0 and i < n:  # about every 10,000 images
            say("data.on_device: %d/%d images read (%.0f s)", i, n, time.monotonic() - start)
    return images, labels


def uint8_items(items: list) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
    """Collate for :func:`read_images`: the images as uint8 ``[3, H, W]``, stacked into one
    tensor when they share a size (one shared-memory transfer per batch instead of one per
    image), and the labels."""
    imgs = [to_uint8_tensor(item[0]) for item in items]
    same = all(img.shape == imgs[0].shape for img in imgs)
    return torch.stack(imgs) if same else imgs, torch.tensor([int(item[1]) for item in items])


def held_arrays(raw: Dataset) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The images ``[N, 3, H, W]`` (a view, not a copy) and labels a dataset keeps whole, or
    None: the textures' tensors, and the uint8 arrays of torchvision's CIFAR (``data``
    ``[N, H, W, 3]``, ``targets``) and STL-10 (``data`` ``[N, 3, H, W]``, ``labels``)."""
    if isinstance(raw, SyntheticTextures):
        return raw.images, raw.labels.to(torch.int64)
    data, labels = getattr(raw, "data", None), getattr(raw, "targets", getattr(raw, "labels", None))
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 4 and labels is not None):
        return None
    images = torch.from_numpy(data)
    if images.shape[-1] == 3 and images.shape[1] != 3:
        images = images.permute(0, 3, 1, 2)
    return images, torch.as_tensor(np.asarray(labels), dtype=torch.int64)


class IndexDataset(Dataset):
    """Training items that are indices alone: the loader batches them in the sampler's order
    (:class:`.sampler.EpochSampler`, this rank's share) with no worker processes."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: tuple[int, int] | int) -> int:
        return key[1] if isinstance(key, tuple) else key  # (epoch, index): the epoch is the trainer's


class ResidentImages:
    """A training set held as one uint8 tensor, moved to the device of the first batch of
    indices it serves; :meth:`views` makes a training batch there.

    The parameters of view ``slot`` of image ``index`` in ``epoch`` come from the counter-based
    key ``(seed, epoch, index, slot)`` (:func:`.seeds.view_keys`, computed on the device): the
    same numbers a loader worker draws for that view (:func:`.augment.sample_params`), whatever
    the batch, the rank or the step a run resumed at. With an ``iou_policy`` the constrained
    pairs' keys are those of their accepted tries (:func:`.iou_policy.constrain_keys`, the tries
    a loader worker accepts), and ``params["iou_fallback"]`` flags the pairs that kept their last."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        augs: Sequence[ViewAug],
        seed: int,
        iou_policy: IoUPolicy | None = None,
    ) -> None:
        self.images, self.labels, self.augs = images, labels, tuple(augs)
        self.seed, self.iou_policy = seed, iou_policy

    def __len__(self) -> int:
        return self.images.shape[0]

    def views(self, index: torch.Tensor, epoch: int = 0) -> dict[str, Any]:
        """The batch a loader would have made for images ``index`` ``[B]`` in ``epoch``: uint8
        views ``[B, 3, S, S]`` per view, ``params`` ``{name: [B, V, ...]}``, labels and indices."""
        if self.images.device != index.device:
            self.images, self.labels = self.images.to(index.device), self.labels.to(index.device)
        images = self.images[index]
        h, w = images.shape[-2:]
        keys = view_keys(self.seed, epoch, index, len(self.augs))
        if self.iou_policy is not None:
            keys, fallback = constrain_keys(self.iou_policy, self.augs, keys, h, w, epoch)
        params = draw_view_params(self.augs, h, w, keys)
        if self.iou_policy is not None:
            params["iou_fallback"] = fallback
        by_size: dict[tuple[int, str], list[int]] = {}
        for v, aug in enumerate(self.augs):
            by_size.setdefault((aug.size, aug.interpolation), []).append(v)
        views: list[torch.Tensor] = [images] * len(self.augs)  # each replaced below
        for (size, interpolation), idx in by_size.items():  # one resampling for all views of a size
            box = {k: torch.stack([params[k][:, v] for v in idx], dim=1) for k in BOX_KEYS}  # [B, K]: no index tensor
            crops = crop_flip_batch(images, box, size, interpolation)  # [B, K, 3, S, S]
            for j, v in enumerate(idx):
                views[v] = crops[:, j]
        return {"views": views, "params": params, "label": self.labels[index], "index": index}
