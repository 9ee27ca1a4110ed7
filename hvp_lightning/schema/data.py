"""``data``: the data set (one schema per kind, told apart by ``data.name``), its view
augmentation (``data.aug``, the ``data/aug`` presets) and the optional IoU policy
(``data.iou_policy``, ``+data/iou_policy=on``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from .base import (
    CHANNELS,
    COUNT,
    COUNT_OR_ZERO,
    NON_NEGATIVE,
    PROBABILITY,
    SEED,
    UNIT_RANGE,
    Section,
    integer,
    number,
    numbers,
)

# data.aug.blur_kind: PIL's ImageFilter.GaussianBlur (upstream SimSiam, DINO; iBOT) | SimCLR's
# 10%-of-crop kernel | torchvision's GaussianBlur(9, sigma) at every crop size (the HVP code's SimSiam, DINO)
BLUR_KINDS = ("pil", "simclr", "torchvision9")
# data.aug.interpolation: the crop's antialiased resize (SimSiam: bilinear; DINO, iBOT, SimCLR: bicubic)
INTERPOLATIONS = ("bilinear", "bicubic")
# data.iou_policy.schedule: the threshold over the epochs after warm-up
IOU_SCHEDULES = ("linear", "cosine")
# torchvision's data sets (their files under data.root: hvp_lightning/data/layout.py TORCHVISION_FILES)
TORCHVISION_DATASETS = ("cifar10", "cifar100", "stl10", "flowers102", "food101", "inat21")


class AugSettings(Section):
    """``data.aug``: every view's augmentation (the ``data/aug`` presets: cifar, imagenet, simclr, textures)."""

    scale: UNIT_RANGE
    """random-resized-crop area range [min, max]"""
    flip_p: PROBABILITY
    """horizontal flip probability"""
    jitter_p: PROBABILITY
    """colour jitter probability"""
    brightness: NON_NEGATIVE
    """colour jitter's brightness strength"""
    contrast: NON_NEGATIVE
    """colour jitter's contrast strength"""
    saturation: NON_NEGATIVE
    """colour jitter's saturation strength"""
    hue: number(0, 0.5)
    """colour jitter's hue strength (torchvision's ColorJitter: <= 0.5)"""
    gray_p: PROBABILITY
    """grayscale probability"""
    blur_p: PROBABILITY
    """Gaussian blur probability"""
    solarize_p: PROBABILITY
    """solarize probability"""
    blur_kind: Literal[BLUR_KINDS] = "simclr"
    """pil: PIL's GaussianBlur (SimSiam, DINO, iBOT); simclr: a kernel of 10% of the crop; torchvision9: torchvision's 9 px kernel (the HVP code)"""
    interpolation: Literal[INTERPOLATIONS] = "bilinear"
    """the crop's antialiased resize (SimSiam: bilinear; DINO, iBOT, SimCLR: bicubic)"""


class IoUPolicySettings(Section):
    """``data.iou_policy`` (``+data/iou_policy=on``): pairs whose crops overlap more than a
    threshold are redrawn (the paper's IoU policy; hvp_lightning/data/iou_policy.py)."""

    enabled: bool = True
    """the policy on (false: the key stays, the views are the plain ones)"""
    schedule: Literal[IOU_SCHEDULES] = "linear"
    """linear (np.linspace start -> end over the epochs after warm-up) or cosine (half cosine)"""
    start: number(0, 1) = 0.30
    """IoU threshold of the first epoch after warm-up"""
    end: number(0, 1) = 0.35
    """IoU threshold of the last epoch"""
    warmup_epochs: COUNT_OR_ZERO = 0
    """first epochs without the policy (threshold 1), < trainer.max_epochs"""
    skip_p: PROBABILITY = 0.0
    """each try is taken unchecked with this probability (the official msat_prob; 0: always checked)"""
    max_tries: COUNT = 512
    """tries per pair; after the last one its draw is kept and counted (data/iou_fallbacks)"""


class DataBase(Section):
    """What every data set has: crop, normalisation, loader, subsets, augmentation."""

    crop_size: integer(1) | Literal["auto"] | None
    """training crops' side in px; auto (folders of images): from the images' size (docs/data.md); null: transfer.py's "the checkpoint's\""""
    mean: CHANNELS
    """per-channel normalisation mean"""
    std: numbers(3, 0, open_low=True)
    """per-channel normalisation std"""
    eval_crop_ratio: number(0, 1, open_low=True) | Literal["auto"] | None
    """evaluation: resize to crop_size / ratio, centre-crop crop_size; auto: 1.0 for small images, else 0.875; null: transfer.py's "the checkpoint's\""""
    num_workers: integer(0) | Literal["auto"] = "auto"
    """loader worker processes; auto: one per usable CPU core of this process but one, at most 8 (resolved on each machine: docs/data.md)"""
    train_subset: integer(1) | None = None
    """train on a fixed random subset of this many images (the same for every seed)"""
    test_subset: integer(1) | None = None
    """a fixed random subset of the test split"""
    on_device: bool = False
    """hold the decoded training set on the training device and cut views there (one image size; docs/DESIGN.md section 8)"""
    aug: AugSettings
    iou_policy: IoUPolicySettings | None = None
    num_classes: integer(0) | None = None
    """written by the run: the labelled set's classes (0: none); not a setting"""


class SyntheticData(DataBase):
    """``data=synthetic``: 10 classes of generated textures, no files (hvp_lightning/data/textures.py)."""

    name: Literal["synthetic"] = "synthetic"
    image_size: COUNT
    """the textures' side in px"""
    train_size: integer(2)
    """training images"""
    test_size: COUNT
    """test images (k-NN queries)"""
    seed: SEED
    """the textures' seed (the test set uses seed + 1)"""


class ImageFolderData(DataBase):
    """``data=imagefolder``: a labelled ImageNet-layout folder (train/<class>/*, test/ or val/)."""

    name: Literal["imagefolder"] = "imagefolder"
    root: str
    """the folder holding train/ and test/ (or val/)"""


class UnlabelledData(DataBase):
    """Unlabelled images with a held-out monitor sample and an optional labelled k-NN folder."""

    monitor_size: integer(0) | Literal["auto"] = "auto"
    """images held out of training for the label-free monitors (RankMe, feature std), the same for every seed; auto: a fifth of the images, at most 512; 0: none (then data.eval_root is needed)"""
    eval_root: str | None = None
    """a labelled ImageNet-layout folder (train/, test/ or val/) for the k-NN monitor"""


class ImagesData(UnlabelledData):
    """``data=images``: every image under ``data.root`` at any depth, or those ``data.files`` lists."""

    name: Literal["images"] = "images"
    root: str | None = None
    """a folder of images, read at any depth (set this or data.files)"""
    files: str | None = None
    """a text file listing image paths, one a line (set this or data.root)"""


class ShardsData(UnlabelledData):
    """``data=shards``: WebDataset tar shards, local or in object storage (fsspec)."""

    name: Literal["shards"] = "shards"
    urls: str | list[str] | None = None
    """a brace pattern of tar shards, e.g. /data/train-{000000..000127}.tar (or a list of them)"""
    manifest: str | None = None
    """the shards' index (null: manifest.json beside the first shard, else the shards' headers are read at start)"""
    storage_options: dict[str, Any] = {}
    """fsspec options for object storage, e.g. {anon: true} or {client_kwargs: {endpoint_url: ...}}"""


class TorchvisionData(DataBase):
    """torchvision's data sets, read from their own files under ``data.root``."""

    name: Literal[TORCHVISION_DATASETS]
    root: str
    """the folder holding torchvision's files of the data set (docs/data.md)"""
    download: bool = False
    """fetch the files into data.root if they are missing (needs the internet)"""


DATA_SCHEMAS = (SyntheticData, ImageFolderData, ImagesData, ShardsData, TorchvisionData)
DATASETS = ("synthetic", "imagefolder", "images", "shards", *TORCHVISION_DATASETS)
DataSettings = Annotated[
    SyntheticData | ImageFolderData | ImagesData | ShardsData | TorchvisionData, Field(discriminator="name")
]


class DataConfig(Section):
    """A ``data`` config on its own (an evaluation's data set), its keys named ``data.*``."""

    data: DataSettings
