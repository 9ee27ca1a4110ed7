"""The datasets a loader worker runs: training items of N views, evaluation items. Lightning-free,
so that the loader workers' fork server need not import Lightning (:mod:`.workers`)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset, Subset

from . import cpu_kernels
from .augment import EvalTransform, MultiViewTransform, ViewAug
from .batched import finish_views


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
    their crops (CPU training): :func:`.batched.finish_views` on one image's views, whose
    float images the collate step then stacks straight into shared memory (colouring the
    collated batch instead costs one more copy of every float view on its way to the
    training process). Made in the main process, it builds the colour step's C kernels there
    (:func:`.cpu_kernels.kernels`, once: later only loaded), so the workers only load them."""

    def __init__(self, items: MultiViewDataset, augs: tuple[ViewAug, ...]) -> None:
        self.items, self.augs = items, augs
        cpu_kernels.kernels()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: tuple[int, int] | int) -> dict[str, Any]:
        return self._finish(self.items[key])

    def __getitems__(self, keys: list) -> list[dict[str, Any]]:
        return [self._finish(item) for item in self.items.__getitems__(keys)]

    def _finish(self, item: dict[str, Any]) -> dict[str, Any]:
        views = finish_views(
            [v[None] for v in item["views"]], {k: v[None] for k, v in item["params"].items()}, self.augs
        )
        return dict(item, views=[v[0] for v in views])
