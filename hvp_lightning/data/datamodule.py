"""LightningDataModule: N candidate views per image for training, plain crops for k-NN."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.profiler import record_function
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from ..device import loader_workers
from ..schema import DATASETS
from ..settings import ViewSpec
from .augment import EvalTransform, MultiViewTransform, ViewAug
from .batched import finish_views
from .datasets import ImageFiles, SafeImageFolder, ShardImages, transfer_splits
from .iou_policy import IoUPolicy, IoUPolicyViews
from .items import EvalDataset, FinishedViews, MultiViewDataset, collate
from .layout import split_dir, training_images
from .resident import IndexDataset, ResidentImages, stack_images
from .sampler import EpochSampler, ResumableLoader
from .shard_index import run_index, storage_options
from .static_colour import coloured, share_colour, uncoloured
from .textures import SyntheticTextures
from .workers import worker_context, worker_options

log = logging.getLogger(__name__)


def finish_batch(batch: Any, augs: tuple[ViewAug, ...]) -> Any:
    """A training batch with its uint8 views coloured and normalised where they lie; any
    other batch unchanged."""
    if isinstance(batch, dict) and "views" in batch and batch["views"][0].dtype == torch.uint8:
        with record_function("hvp/colour"):  # a profiler range (benchmarks/step_profile.py); free otherwise
            return dict(batch, views=finish_views(batch["views"], batch["params"], augs))
    return batch


def subset(ds: Dataset, n: int | None, seed: int, key: str | None = None) -> Dataset:
    """A fixed random subset (same images for every arm and seed of a comparison). ``n`` at least
    the data set's size keeps all of it, said once (naming ``key``) when it is more: a subset
    size carried over from a larger data set would otherwise pass unnoticed."""
    if n is not None and n > len(ds) and key is not None and rank_zero_only.rank == 0:  # type: ignore[arg-type]
        log.warning("%s=%s is more than the %s images there: all of them are used", key, n, len(ds))  # type: ignore[arg-type]
    if n is None or n >= len(ds):  # type: ignore[arg-type]
        return ds
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:n]  # type: ignore[arg-type]
    return Subset(ds, idx.sort().values.tolist())


UNLABELLED = ("images", "shards")  # data sets that hold out a monitor sample and take data.eval_root
MONITOR_SEED = 2  # the held-out sample's permutation (subset() uses 0 and 1)


def monitor_split(n: int, size: int) -> tuple[list[int], list[int]]:
    """(training, held-out) indices of ``data=images``'s ``n`` images: ``size`` of them drawn
    by a fixed seed, the same for every run seed and arm of a comparison, so that all train
    on the same images and are monitored on the same others; both lists in the images' order."""
    held = torch.randperm(n, generator=torch.Generator().manual_seed(MONITOR_SEED))[:size].sort().values
    keep = torch.ones(n, dtype=torch.bool)
    keep[held] = False
    return keep.nonzero().flatten().tolist(), held.tolist()


def image_sets(cfg) -> tuple[Dataset, Dataset | None]:
    """``data=images`` and ``data=shards``: (training images, held-out monitor sample or None
    when ``data.monitor_size`` is 0). An image's index in the first is its views' key: the same
    image has the same key in a folder and in the shards ``hvp-make-shards`` makes of it."""
    if cfg.name == "shards":
        index, options = run_index(cfg), storage_options(cfg)
        n, make = len(index), lambda keep: ShardImages(index, options, keep)
    else:
        paths = training_images(cfg)
        n, make = len(paths), lambda keep: ImageFiles([paths[i] for i in keep])
    train, held = monitor_split(n, cfg.monitor_size)
    return make(train), make(held) if held else None


def eval_roles(cfg) -> tuple[str, ...]:
    """What the validation loaders of a ``data`` config hold, in loader order: the labelled
    k-NN ``bank`` and ``test`` queries (every data set but ``data=images`` without
    ``data.eval_root``), then ``data=images``'s held-out ``monitor`` sample when it has one.
    The label-free monitors use the monitor sample where there is one, else the test set."""
    unlabelled = cfg.name in UNLABELLED
    labelled = not unlabelled or bool(cfg.eval_root)
    held_out = unlabelled and bool(cfg.monitor_size)
    return ("bank", "test") * labelled + ("monitor",) * held_out


def build_raw_datasets(cfg) -> tuple[Dataset, Dataset | None, Dataset | None, list[str]]:
    """(pretraining set, labelled k-NN bank, test set, class names) for a ``data`` config; no
    bank, test set or classes for ``data=images`` without ``data.eval_root``."""
    name = cfg.name
    if name == "synthetic":
        train = SyntheticTextures(cfg.train_size, cfg.image_size, seed=cfg.seed)
        test = SyntheticTextures(cfg.test_size, cfg.image_size, seed=cfg.seed + 1)
        return train, train, test, train.classes
    if name == "imagefolder":
        root = Path(cfg.root)
        train = SafeImageFolder(split_dir(root, "train"))
        test = SafeImageFolder(split_dir(root, "test"))
        return train, train, test, train.classes
    if name in UNLABELLED:
        pre, _ = image_sets(cfg)
        if not cfg.eval_root:
            return pre, None, None, []
        root = Path(str(cfg.eval_root)).expanduser()
        bank = SafeImageFolder(split_dir(root, "train"))
        return pre, bank, SafeImageFolder(split_dir(root, "test")), bank.classes
    from torchvision import datasets as tvd

    if name in ("cifar10", "cifar100"):
        cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
        train = cls(cfg.root, train=True, download=cfg.download)
        test = cls(cfg.root, train=False, download=cfg.download)
        return train, train, test, list(train.classes)
    if name == "stl10":
        pre = tvd.STL10(cfg.root, split="train+unlabeled", download=cfg.download)
        bank = tvd.STL10(cfg.root, split="train", download=cfg.download)
        test = tvd.STL10(cfg.root, split="test", download=cfg.download)
        return pre, bank, test, list(bank.classes)
    if name in ("flowers102", "food101", "inat21"):
        train, test, classes = transfer_splits(name, cfg.root, cfg.download)
        return train, train, test, classes
    raise ValueError(f"data.name={name!r}; allowed: {', '.join(DATASETS)}")


def data_counts(name: str, train: Dataset, given: dict[str, Dataset | None], roles: tuple[str, ...]) -> str:
    """One start-up line of what was found: a wrong root or extensions that do not count show at
    once, not as a step count that is too small (``data=images`` scans a whole tree)."""
    words = {"bank": "k-NN bank", "test": "k-NN test", "monitor": "held out for the monitors"}
    parts = [f"{len(train)} training images ({name})"]  # type: ignore[arg-type]
    parts += [f"{len(given[r])} {words[r]}" for r in roles]  # type: ignore[arg-type]
    return ", ".join(parts)


def view_aug(cfg) -> ViewAug:
    """A ``data`` config's view augmentation: its crop size and normalisation, and every key of
    its ``aug`` (the :class:`~hvp_lightning.schema.AugSettings` keys are :class:`ViewAug`'s fields)."""
    aug = cfg.aug.model_dump()
    return ViewAug(
        size=cfg.crop_size,
        mean=tuple(cfg.mean),
        std=tuple(cfg.std),
        **{k: tuple(v) if isinstance(v, list) else v for k, v in aug.items()},
    )


def view_augs(views: Sequence[ViewSpec], data) -> tuple[ViewAug, ...]:
    """The augmentation of each view a method asks for (:meth:`~hvp_lightning.methods.base.SSLMethod.views`):
    the data's (:func:`view_aug`) with the view's own size, crop scale, blur, solarize and jitter
    saturation where it sets them (DINO's global pipelines and local crops)."""
    base = view_aug(data)
    out = []
    for v in views:
        changes = {k: getattr(v, k) for k in ("size", "scale", "blur_p", "solarize_p", "saturation")}
        out.append(dataclasses.replace(base, **{k: value for k, value in changes.items() if value is not None}))
    return tuple(out)


class StaticColour:
    """HVP's static colour (:mod:`.static_colour`) for a method's training step: what the
    selection scores (the loader's uint8 crops normalised without colour, every candidate of an
    image given its view 0's colour draw) and the chosen views coloured with that draw. Set as the
    method's ``static_colour`` (:class:`~hvp_lightning.methods.base.SSLMethod`)."""

    def __init__(self, aug: ViewAug) -> None:
        self.aug = aug

    def uncoloured(self, batch: dict[str, Any]) -> dict[str, Any]:
        return dict(batch, views=uncoloured(batch["views"], self.aug), params=share_colour(batch["params"]))

    def coloured(self, batch: dict[str, Any]) -> dict[str, Any]:
        return dict(batch, views=coloured(batch["views"], batch["params"], self.aug))


class SSLDataModule(L.LightningDataModule):
    """Training loader yields ``{"views": [N x [B,3,H,W]], "params": {name: [B,N,...]}, ...}``;
    the validation loaders (k-NN bank, test queries, and for ``data=images`` its held-out monitor
    sample: :func:`eval_roles`) yield ``{"image", "label", "index"}``.

    Loader workers crop and flip (uint8 views); the colour ops and normalisation run batched
    (:func:`.batched.finish_views`) on the accelerator the batch is moved to
    (:meth:`on_after_batch_transfer`). When training runs on the CPU, the same batched code
    runs in the loader workers instead (per image, :class:`FinishedViews`), where it overlaps
    the model's step rather than adding to it. ``colour_in_workers`` forces one or the other; ``None``
    decides from the trainer's device when the training loader is built.

    With ``data.on_device=true`` the training images are held whole on the training device
    (:class:`.resident.ResidentImages`): the loader yields indices only, and the crops are cut
    there as well, in :meth:`on_after_batch_transfer`.

    ``num_workers``: a number (capped at the usable cores) or ``auto``, resolved here on this
    machine for the ``processes`` it runs (hvp_lightning/device.py ``loader_workers``) and said in the
    data start-up line. Workers start from a clean fork server, never from the training process, and every wait
    for a batch is limited to ``wait_s`` seconds (:mod:`.workers`). The k-NN loaders keep their
    workers from one pass to the next (the at-start pass, the passes inside the fit and the
    final one are the same two loaders).

    ``iou_policy`` redraws the crops of view pairs as :mod:`.iou_policy` says (both paths);
    ``defer_colour`` leaves training views uint8 (uncoloured) for the training step to colour
    (HVP's static colour: :class:`~hvp_lightning.selection.HardViewMixin`).
    """

    # The views made on the device for a training batch, timed by a fit's timer
    # (:class:`~hvp_lightning.run.perf.PerfMonitor` sets it for the fit; a no-op otherwise): the
    # colour step's share of a step is then in every run's ``perf/*``, not inside "data".
    augment_phase: Callable[[], AbstractContextManager[Any]] = nullcontext

    def __init__(
        self,
        cfg,
        views: tuple[ViewAug, ...],
        batch_size: int,
        num_workers: int | str,
        seed: int = 0,
        colour_in_workers: bool | None = None,
        wait_s: float = 600.0,
        iou_policy: IoUPolicy | None = None,
        defer_colour: bool = False,
        processes: int = 1,
    ) -> None:
        super().__init__()
        self.cfg, self.views, self.batch_size, self.seed = cfg, views, batch_size, seed
        self.num_workers, self.workers_said = loader_workers(num_workers, processes)
        self.wait_s = wait_s
        if self.num_workers > 0:
            worker_context()  # the fork server imports while this process sets up
        self._val_loaders: dict[tuple[int, int], list[DataLoader]] = {}  # (rank, world) -> bank, test
        self.colour_in_workers = colour_in_workers
        self.iou_policy, self.defer_colour = iou_policy, defer_colour
        self.class_names: list[str] = []
        self.resident: ResidentImages | None = None
        self.resume_position: list[int] | None = None  # (epoch, batches trained) of the checkpoint resumed

    def setup(self, stage: str | None = None) -> None:
        if hasattr(self, "train_set"):
            return
        pre, bank, test, self.class_names = build_raw_datasets(self.cfg)
        pre = subset(pre, self.cfg.train_subset, seed=0, key="data.train_subset")
        bank = pre if bank is pre or bank is getattr(pre, "dataset", None) else bank
        test = subset(test, self.cfg.test_subset, seed=1, key="data.test_subset") if test is not None else None
        self.train_raw = pre  # what the logged ``index`` of a training view points into
        if self.cfg.on_device:
            images, labels = stack_images(pre, self.num_workers, self.wait_s)
            self.resident = ResidentImages(images, labels, self.views, self.seed, self.iou_policy)
            self.train_set: Dataset = IndexDataset(len(self.resident))
        else:
            transform = (
                MultiViewTransform(self.views, self.seed)
                if self.iou_policy is None
                else IoUPolicyViews(self.views, self.iou_policy, self.seed)
            )
            self.train_set = MultiViewDataset(pre, transform)
        evaluate = EvalTransform(
            self.cfg.crop_size, self.cfg.eval_crop_ratio, tuple(self.cfg.mean), tuple(self.cfg.std)
        )
        held_out = image_sets(self.cfg)[1] if "monitor" in eval_roles(self.cfg) else None
        given = {"bank": bank, "test": test, "monitor": held_out}
        self.eval_sets = {role: EvalDataset(given[role], evaluate) for role in eval_roles(self.cfg)}  # type: ignore[arg-type]
        if rank_zero_only.rank == 0:
            log.info("data: %s; %s", data_counts(self.cfg.name, pre, given, eval_roles(self.cfg)), self.workers_said)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def _loader_options(self, workers: bool = True) -> dict[str, Any]:
        # A generator of its own: each iterator draws its workers' base seed from it, not from
        # the training process's global RNG (whose state a checkpoint restores at the step).
        return dict(
            batch_size=self.batch_size,
            pin_memory=torch.cuda.is_available(),
            generator=torch.Generator().manual_seed(self.seed),
            **worker_options(self.num_workers if workers else 0, self.wait_s, persistent=True),
        )

    def trained_position(self) -> tuple[int, int]:
        """(epoch, batches of it trained) at this moment of the fit: where a run resumed from a
        checkpoint written now continues (a finished epoch: the next one, from its start).
        Lightning counts a batch as processed once its training step has run."""
        trainer = self.trainer
        assert trainer is not None
        epoch, done = trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return (epoch + 1, 0) if done >= trainer.num_training_batches else (epoch, done)

    def state_dict(self) -> dict[str, Any]:
        """Where training stands (:meth:`trained_position`), in every checkpoint. Lightning
        restores a data module before the model's ``configure_optimizers``, whose
        ``estimated_stepping_batches`` builds the training loader and starts iterating it; the
        fit loop's own loader state (:class:`.sampler.ResumableLoader`) is loaded after that
        start, too late to move it."""
        return {"train_position": list(self.trained_position())} if self.trainer is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.resume_position = state_dict.get("train_position")

    def _workers_colour(self) -> bool:
        if self.defer_colour:
            return False
        if self.colour_in_workers is not None:
            return self.colour_in_workers
        return self.trainer is None or self.trainer.strategy.root_device.type == "cpu"

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Finish the uint8 training views on their device (evaluation batches pass through);
        with resident images, a batch of indices becomes its views here first."""
        trainer = self.trainer  # None outside a fit (tests, benchmarks): epoch 0
        with self.augment_phase() if trainer is not None and trainer.training else nullcontext():
            if self.resident is not None and isinstance(batch, torch.Tensor):
                batch = self.resident.views(batch, epoch=trainer.current_epoch if trainer is not None else 0)
            return batch if self.defer_colour else finish_batch(batch, self.views)

    def train_dataloader(self) -> DataLoader:
        """The epoch's order is a function of (seed, epoch), this rank's share of it
        (:class:`.sampler.EpochSampler`); the loader resumes at the batch a checkpoint was
        written at (:class:`.sampler.ResumableLoader`)."""
        trainer = self.trainer  # None outside a fit (tests, benchmarks): one process
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        options = self._loader_options(workers=self.resident is None)
        if self.resident is not None:  # indices only, no workers needed; pinned: a truly asynchronous copy
            ds: Dataset = self.train_set
        else:
            ds = FinishedViews(self.train_set, self.views) if self._workers_colour() else self.train_set
        sampler = EpochSampler(ds, self.batch_size, self.seed, rank, world)
        if self.resume_position:  # the first loader of a resumed fit starts where the checkpoint stood
            sampler.resume_at(*self.resume_position)
            self.resume_position = None
        return ResumableLoader(ds, sampler, self.trained_position, drop_last=True, collate_fn=collate, **options)

    def val_dataloader(self) -> list[DataLoader]:
        """The evaluation loaders (:func:`eval_roles`), the same objects on every call for this rank,
        so that their persistent workers serve every pass. Each rank reads its ``DistributedSampler``
        share (in order, padded, as Lightning's own would be: Lightning keeps a sampler that is one
        instead of re-making the loader, and its workers, for every pass)."""
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if (rank, world) not in self._val_loaders:
            self._val_loaders[rank, world] = [
                DataLoader(ds, sampler=self._eval_sampler(ds, rank, world), **self._loader_options())
                for ds in self.eval_sets.values()
            ]
        return self._val_loaders[rank, world]

    @staticmethod
    def _eval_sampler(ds: Dataset, rank: int, world: int) -> Any:
        if world == 1:
            return None  # in order
        return DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
