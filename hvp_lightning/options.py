"""The allowed values of the config's choice keys, one definition each, torch-free.

The command-line entry points check a config against these before they import torch,
Lightning or the model code (hvp_lightning/config.py ``check_options``), so a typo is
reported in a second, not after the heavy imports; the modules that implement the choices
import their names from here. Registries that map a name to code (``methods.METHODS``,
``backbones.BACKBONES``) are tested to hold exactly these names (tests/test_options.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

METHOD_NAMES = ("dino", "ibot", "simsiam", "simclr", "byol", "mocov3", "vicreg", "barlow_twins")
# backbone.name -> family (the keys a family's config group carries: hvp_lightning/nn/backbones.py)
BACKBONE_FAMILIES = {
    "resnet18": "resnet",
    "resnet34": "resnet",
    "resnet50": "resnet",
    "vit_tiny": "vit",
    "vit_small": "vit",
    "vit_base": "vit",
}
# backbone=timm (conf/backbone/timm.yaml): any timm model; its config carries ``model_args``
TIMM_FAMILY = "timm"
# backbone.init=<scheme>:<name> fetches released weights from a hub (hvp_lightning/nn/weights.py)
INIT_HUBS = ("timm", "torchvision")


def is_hub_init(source: str) -> bool:
    """``timm:<name>`` or ``torchvision:<name>`` (a hub), not a path."""
    scheme, sep, _ = source.partition(":")
    return bool(sep) and scheme in INIT_HUBS


def backbone_family(backbone: Mapping[str, Any]) -> str:
    """``resnet``, ``vit`` or ``timm``: a config from ``backbone=timm`` is told apart by its
    ``model_args`` key, as timm names overlap the presets' (``resnet18`` is both)."""
    if "model_args" in backbone:
        return TIMM_FAMILY
    return BACKBONE_FAMILIES.get(backbone["name"], "")


OPTIMIZERS = ("sgd", "adamw", "lars")

# images: unlabelled, every image under data.root or listed in data.files (docs/data.md "Your own images")
# shards: WebDataset tar shards, labels optional (docs/data.md "Shards")
DATASETS = (
    "synthetic",
    "imagefolder",
    "images",
    "shards",
    "cifar10",
    "cifar100",
    "stl10",
    "flowers102",
    "food101",
    "inat21",
)
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
# data.aug.blur_kind: PIL's ImageFilter.GaussianBlur (upstream SimSiam, DINO; iBOT) | SimCLR's
# 10%-of-crop kernel | torchvision's GaussianBlur(9, sigma) at every crop size (the HVP code's SimSiam, DINO)
BLUR_KINDS = ("pil", "simclr", "torchvision9")
# method.clip_grad_kind (DINO, iBOT): one norm over all parameters (the HVP code's DINO,
# clip_grad_norm_) | each parameter on its own (upstream DINO's and iBOT's utils.clip_gradients)
CLIP_GRAD_KINDS = ("global", "per_parameter")
# data.aug.interpolation: the crop's antialiased resize (SimSiam: bilinear; DINO, iBOT, SimCLR: bicubic)
INTERPOLATIONS = ("bilinear", "bicubic")
# torchvision's ImageFolder extensions (torchvision.datasets.folder.IMG_EXTENSIONS) plus GIF
# (its first frame is the image).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")

# hvp.*
MODES = ("hard", "easy", "random")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# Multi-crop methods: which pairs of global candidates are scored. ``cross`` pairs a crop of
# DINO's global pipeline 1 with one of pipeline 2 (the official HVP code); ``all`` = C(G,2).
GLOBAL_PAIRS = ("cross", "all")
# How candidates are coloured: each its own colour draw (per_view), or one per image, applied
# to the chosen pair after the selection pass saw the candidates uncoloured (static; paper section 6).
HVP_COLOURS = ("per_view", "static")

# data.iou_policy.* (hvp_lightning/data/iou_policy.py): the threshold's schedule over epochs.
IOU_SCHEDULES = ("linear", "cosine")

# trainer.precision: mixed precision keeps fp32 master weights, EMA teacher and centres;
# "*-true" half precision would run them in half precision too. ``auto`` is resolved per machine.
TRAINER_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
# trainer.precision resolved at start-up (hvp_lightning/device.py): ``auto`` = bf16-mixed on a bf16-native
# GPU, ``auto-16-mixed`` = 16-mixed on any GPU (the HVP code's fp16, SimSiam and SimCLR presets); both 32-true on CPU.
AUTO_PRECISIONS = ("auto", "auto-16-mixed")
# trainer.* keys train.py owns (checkpointing: hvp_lightning/training/checkpoint.py).
OWNED_TRAINER_KEYS = ("enable_checkpointing", "plugins")

LOGGERS = ("wandb", "csv")
WANDB_MODES = ("auto", "online", "offline", "disabled")

# eval.py
PROTOCOLS = ("knn", "linear", "finetune")
# trainer.accelerator and eval.py's accelerator: Lightning's but XLA's and Gaudi's (tpu, hpu: packages we lack)
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
# transfer.py: the paper's transfer table, its columns in the paper's order
TRANSFER_DATASETS = ("cifar10", "cifar100", "flowers102", "inat21", "food101")
TRANSFER_PROTOCOLS = ("linear", "finetune")
