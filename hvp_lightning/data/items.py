"""The datasets a loader worker runs: training items of N views, evaluation items. Lightning-free,
so that the loader workers' fork server need not import Lightning (:mod:`.workers`)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.data import Dataset, Subset, default_collate, get_worker_info

from . import cpu_kernels
from .augment import EvalTransform, MultiViewTransform, ViewAug
from .batched import finish_image_into


def unpack_item(item: tuple) -> tuple[Any, int, str]:
    """(image, label, skipped file or "") from any raw dataset."""
    return item[0], int(item[1]), item[2] if len(item) > 2 else ""


def prefetch(raw: Dataset, indices: list[int]) -> None:
    """Let ``raw`` read a batch's images together where it can (:meth:`.datasets.ShardImages.prefetch`),
    through a ``Subset`` (``data.train_subset``) too."""
    if isinstance(raw, Subset):
        prefetch(raw.dataset, [int(raw.indices[i]) for i in indices])
        return
    fetch = getattr(raw, "prefetch", None)
    if fetch is not None:
        fetch(indices)


class MultiViewDataset(Dataset):
    def __init__(self, raw: Dataset, transform: MultiViewTransform) -> None:
        self.raw, self.transform = raw, transform

    def __len__(self) -> int:
        return len(self.raw)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple[int, int] | int) -> dict[str, Any]:
        """Item ``(epoch, index)`` (what :class:`.sampler.EpochSampler` yields; a bare index is
        epoch 0): the views of image ``index`` as that epoch draws them."""
        epoch, i = key if isinstance(key, tuple) else (0, key)
        img, label, bad = unpack_item(self.raw[i])
        views, params = self.transform(img, epoch, i)
        return {"views": views, "params": params, "label": label, "index": i, "bad_file": bad}

    def __getitems__(self, keys: list) -> list[dict[str, Any]]:
        """A batch of items (the loader's batched fetch): the raw images' bytes fetched
        together first where the raw dataset can (shards in object storage)."""
        prefetch(self.raw, [k[1] if isinstance(k, tuple) else k for k in keys])
        return [self[k] for k in keys]


class EvalDataset(Dataset):
    def __init__(self, raw: Dataset, transform: EvalTransform) -> None:
        self.raw, self.transform = raw, transform

    def __len__(self) -> int:
        return len(self.raw)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> dict[str, Any]:
        img, label, bad = unpack_item(self.raw[i])
        return {"image": self.transform(img), "label": label, "index": i, "bad_file": bad}

    def __getitems__(self, keys: list[int]) -> list[dict[str, Any]]:
        prefetch(self.raw, keys)
        return [self[k] for k in keys]


class FinishedViews(Dataset):
    """Training items whose views are coloured and normalised in the loader worker right after
    their crops (CPU training). A batch (:meth:`__getitems__`) is made whole here: every image's
    float views are written straight into the batch's tensors, in shared memory inside a worker
    (:func:`.batched.finish_image_into`), and :func:`collate` passes them on instead of copying
    every float view once more. Made in the main process, it builds the colour step's C kernels
    there (:func:`.cpu_kernels.kernels`, once: later only loaded), so the workers only load them."""

    def __init__(self, items: MultiViewDataset, augs: tuple[ViewAug, ...]) -> None:
        self.items, self.augs = items, augs
        cpu_kernels.kernels()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: tuple[int, int] | int) -> dict[str, Any]:
        item = self.items[key]
        views = [torch.empty(v.shape, dtype=torch.float32) for v in item["views"]]
        finish_image_into(item["views"], item["params"], self.augs, views)
        return dict(item, views=views)

    def __getitems__(self, keys: list) -> dict[str, Any]:
        """The whole batch (a dict, which :func:`collate` hands on), not a list of items."""
        items = self.items.__getitems__(keys)
        views = [batch_tensor((len(items), *v.shape)) for v in items[0]["views"]]
        for b, item in enumerate(items):
            finish_image_into(item["views"], item["params"], self.augs, [v[b] for v in views])
        rest = default_collate([{k: v for k, v in item.items() if k != "views"} for item in items])
        return dict(views=views, **rest)


def collate(items: list[Any] | dict[str, Any]) -> Any:
    """The training loader's collate step: ``default_collate`` of a list of items; a batch that
    the dataset's ``__getitems__`` made whole (a dict: :class:`FinishedViews`) as it is."""
    return items if isinstance(items, dict) else default_collate(items)


def batch_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised float32 tensor for a batch: in shared memory inside a loader worker (as
    ``default_collate`` allocates its output there), so sending it to the training process
    copies nothing; a plain one in the main process."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch.float32)
    nbytes = math.prod(shape) * torch.float32.itemsize
    storage = torch.UntypedStorage._new_shared(nbytes)  # noqa: SLF001 -- as default_collate: no copy
    return torch.empty(0, dtype=torch.float32).set_(storage, 0, shape)
