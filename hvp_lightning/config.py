"""Start-up validation: every bad value ends in one message naming the key, the value and
what is allowed -- before any data is read or a Lightning Trainer exists. Two passes:

* :func:`check_options` (and :func:`check_eval_options` for eval.py): everything the config
  and the file system can tell. This module imports neither torch nor Lightning, so the
  command-line entry points run it before the heavy imports (hvp_lightning/cli.py): a typo
  costs a second, not the ~15 s those imports take.
* :func:`validate`: :func:`check_options` plus what needs them -- ``trainer.*`` keys against
  ``lightning.Trainer``'s signature, ``trainer.precision`` against the machine -- and the
  start-up warning about upsampled crops. :func:`hvp_lightning.training.driver.run` calls it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .config_rules import RULES, Rule, check_known_keys, check_rules
from .data.layout import (
    auto_crop_size,
    crop_multiple,
    is_image_file,
    resolve_auto_crop,
    split_dir,
    training_image_side,
    training_images,
)
from .errors import ConfigError
from .options import (
    ACCELERATORS,
    AUTO_PRECISIONS,
    BACKBONE_FAMILIES,
    BLUR_KINDS,
    CLIP_GRAD_KINDS,
    DATASETS,
    GLOBAL_PAIRS,
    HVP_COLOURS,
    IMAGE_EXTENSIONS,
    IMAGE_SIDES,
    INIT_HUBS,
    INTERPOLATIONS,
    IOU_SCHEDULES,
    LOGGERS,
    METHOD_NAMES,
    MODES,
    OPTIMIZERS,
    OWNED_TRAINER_KEYS,
    PRECISIONS,
    PROTOCOLS,
    TIMM_FAMILY,
    TORCHVISION_FILES,
    TRAINER_PRECISIONS,
    WANDB_MODES,
    backbone_family,
    is_hub_init,
)
from .run.directory import resolve_checkpoint

log = logging.getLogger(__name__)


def fail(key: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def int_at_least(cfg: DictConfig, key: str, low: int) -> None:
    value = _get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        fail(key, value, f"expected an integer >= {low}")


def _int_in(cfg: DictConfig, key: str, low: int, high: int) -> None:
    value = _get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        fail(key, value, f"expected an integer in [{low}, {high}]")


def _prob(cfg: DictConfig, key: str) -> None:
    value = _get(cfg, key)
    if not isinstance(value, (int, float)) or not 0 <= value <= 1:
        fail(key, value, "expected a probability in [0, 1]")


def seconds_above_zero(cfg: DictConfig, key: str) -> None:
    value = _get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        fail(key, value, "expected a number of seconds > 0")


def check_limits(cfg: DictConfig) -> None:
    """``limits.*`` (hvp_lightning/cluster/waits.py), where the config has them (a run dir from before
    the keys resumes with their defaults)."""
    for key in ("limits.wait_s", "limits.stop_grace_s"):
        if OmegaConf.select(cfg, key) is not None:
            seconds_above_zero(cfg, key)


def _get(cfg: DictConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, DictConfig) else None
    return node


def check_multicrop(cfg: DictConfig) -> None:
    """DINO/iBOT multi-crop settings (``method.*`` crops against the backbone; types and ranges:
    the rules table, which :func:`check_options` applies to every key; here, where a method is built
    from a stored run's config too (eval, export, resume), only to the keys checked here before it)."""
    check_rules(cfg, rules_for(MULTICROP_KEYS))
    m = cfg.method
    b = cfg.backbone  # a timm ViT's patch: check_timm_backbone
    if backbone_family(b) == "vit" and int(m.num_local_crops) > 0 and m.local_crop_size % b.patch_size:
        fail(
            "method.local_crop_size",
            m.local_crop_size,
            f"a multiple of backbone.patch_size={b.patch_size} for {b.name}",
        )
    if m.get("clip_grad_kind", "per_parameter") not in CLIP_GRAD_KINDS:
        fail("method.clip_grad_kind", m.clip_grad_kind, f"one of {', '.join(CLIP_GRAD_KINDS)}")


def check_ibot(cfg: DictConfig) -> None:
    """iBOT's own settings: a ViT backbone (patch tokens), the masking and loss weights (their rules)."""
    check_rules(cfg, rules_for(IBOT_KEYS))
    b = cfg.backbone
    if backbone_family(b) not in ("vit", TIMM_FAMILY):  # which timm models have tokens: check_timm_backbone
        raise ConfigError(
            f"backbone.name={b.name!r} is not allowed for method=ibot: a ViT (patch tokens), "
            f"one of {', '.join(n for n, f in BACKBONE_FAMILIES.items() if f == 'vit')} or a timm ViT (backbone=timm)"
        )


# the rules :func:`check_multicrop` and :func:`check_ibot` apply when a method is built
MULTICROP_KEYS = ("num_local_crops", "local_crop_size", "global_scale", "local_scale", "clip_grad")
IBOT_KEYS = ("mask_ratio", "mask_prob", "mask_min_aspect", "lambda1", "lambda2")


def rules_for(keys: tuple[str, ...]) -> dict[str, Rule]:
    """The rules of ``method.<key>`` for ``keys``."""
    return {f"method.{k}": RULES[f"method.{k}"] for k in keys}


def check_options(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` on the first setting the config itself (or the data root it
    names) shows to be invalid. Resolves ``data.crop_size: auto`` (ImageFolder) once the data
    root is known to be valid. Torch-free."""
    if cfg.method.name not in METHOD_NAMES:
        fail("method.name", cfg.method.name, f"one of {', '.join(METHOD_NAMES)}")
    _int_in(cfg, "seed", 0, 2**32 - 1)  # what NumPy's and Lightning's seeding accept
    check_rules(cfg)  # every plain value's type and range, before anything below compares it
    if not cfg.get("resume"):  # a resumed run's config may hold keys of an older version
        check_known_keys(cfg)
    if cfg.method.optimizer.name not in OPTIMIZERS:
        fail("method.optimizer.name", cfg.method.optimizer.name, f"one of {', '.join(OPTIMIZERS)}")
    _validate_lr_end(cfg)
    validate_data(cfg)
    if "eval_crop_ratio" in cfg.data and cfg.data.eval_crop_ratio is None:  # null: transfer.py's "the checkpoint's"
        fail("data.eval_crop_ratio", None, "a number in (0, 1] or auto (null is transfer.py's: the checkpoint's)")
    resolve_auto_crop(cfg.data, cfg.backbone)
    validate_backbone(cfg)
    _check_init(cfg.backbone, resuming=bool(cfg.get("resume")))
    _validate_hvp(cfg)
    _validate_iou_policy(cfg)
    if cfg.method.name in ("dino", "ibot"):
        check_multicrop(cfg)
    if cfg.method.name == "ibot":
        check_ibot(cfg)
    check_candidate_counts(cfg)
    _check_trainer(cfg)
    _validate_distributed(cfg)
    check_limits(cfg)
    _check_logger(cfg.logger)


def validate(cfg: DictConfig, options_checked: bool = False) -> None:
    """:func:`check_options` (unless ``options_checked``: the CLI has run it on ``cfg`` before
    the heavy imports), then the checks that need Lightning and the machine; resolves
    ``trainer.precision: auto`` / ``auto-16-mixed``. Warns once when crops are larger than the images."""
    if not options_checked:
        check_options(cfg)
    if backbone_family(cfg.backbone) == TIMM_FAMILY:
        check_timm_backbone(cfg)
    _validate_trainer_keys(cfg)
    _validate_precision(cfg)
    _validate_deterministic(cfg)
    _warn_upsampled_crops(cfg.data, cfg.backbone)
    _warn_long_warmup(cfg)
    _warn_small_monitor(cfg.data)
    _warn_cpu_oversubscription(cfg.trainer)


def check_eval_options(cfg: DictConfig) -> None:
    """eval.py's settings that need no checkpoint (the rest: hvp_lightning/evaluation/). Torch-free."""
    if OmegaConf.is_missing(cfg, "ckpt") or not cfg.ckpt:
        fail("ckpt", "???", "a run dir or a .ckpt file: add ckpt=<path> to the command")
    resolve_checkpoint(cfg.ckpt)  # the path exists (its contents are checked when it is loaded)
    if cfg.protocol.name not in PROTOCOLS:
        fail("protocol.name", cfg.protocol.name, f"one of {', '.join(PROTOCOLS)}")
    if cfg.devices != 1:
        fail("devices", cfg.devices, "1 (evaluation runs on one device)")
    if not isinstance(cfg.get("student", False), bool):
        fail("student", cfg.student, "true or false (DINO/iBOT: evaluate the student instead of the teacher)")
    if str(cfg.accelerator) not in ACCELERATORS:
        fail("accelerator", cfg.accelerator, f"one of {', '.join(ACCELERATORS)}")
    precision = cfg.get("precision", "32-true")
    if precision != "auto" and precision not in TRAINER_PRECISIONS:
        fail("precision", precision, f"auto or one of {', '.join(TRAINER_PRECISIONS)}")
    _int_in(cfg, "seed", 0, 2**32 - 1)
    if cfg.get("num_workers") not in (None, "auto"):
        int_at_least(cfg, "num_workers", 0)
    check_limits(cfg)
    if data_preset_given(cfg):  # else the checkpoint's data, checked once it is loaded
        validate_data(cfg)
    if cfg.get("logger") is not None:
        _check_logger(cfg.logger)


def data_preset_given(cfg: DictConfig) -> bool:
    """Whether an evaluation's ``data`` is a data set (``data=<name>``), not only ``+data.<key>=``
    changes to the checkpoint's own data (conf/eval.yaml has no ``data`` without a preset)."""
    return cfg.get("data") is not None and "name" in cfg.data


def _check_logger(lc: DictConfig) -> None:
    if lc.name not in LOGGERS:
        fail("logger.name", lc.name, f"one of {', '.join(LOGGERS)}")
    if lc.name == "wandb" and lc.mode not in WANDB_MODES:
        fail("logger.mode", lc.mode, f"one of {', '.join(WANDB_MODES)}")
    gallery = lc.get("gallery_images", 0)
    if lc.name == "wandb" and (isinstance(gallery, bool) or not isinstance(gallery, int) or gallery < 0):
        fail("logger.gallery_images", gallery, "expected an integer >= 0 (0: no live HVP gallery)")


def validate_backbone(cfg: DictConfig) -> None:
    b, crop = cfg.backbone, cfg.data.crop_size
    family = backbone_family(b)
    if family == TIMM_FAMILY:
        _check_timm_keys(cfg)
    elif b.name not in BACKBONE_FAMILIES:
        fail("backbone.name", b.name, f"one of {', '.join(BACKBONE_FAMILIES)} (any timm model: backbone=timm)")
    int_at_least(cfg, "data.crop_size", 1)
    if family == TIMM_FAMILY:
        return
    if family == "resnet":
        smallest = 8 if b.cifar_stem else 32  # the trunk downsamples 8x (CIFAR stem) or 32x
        if crop < smallest:
            fail("data.crop_size", crop, f">= {smallest} px for {b.name} with cifar_stem={b.cifar_stem}")
    elif crop % b.patch_size:
        fail("data.crop_size", crop, f"a multiple of backbone.patch_size={b.patch_size} for {b.name}")


def _check_timm_keys(cfg: DictConfig) -> None:
    """``backbone=timm``'s keys that the config alone shows (the name against timm's list and the
    model's patch size: :func:`check_timm_backbone`, which imports timm)."""
    b = cfg.backbone
    if OmegaConf.is_missing(b, "name") or not isinstance(b.name, str) or not b.name:
        fail("backbone.name", b.get("name", "???"), "a timm model name: backbone=timm backbone.name=<name>")
    if b.model_args is not None and not isinstance(b.model_args, DictConfig):
        fail("backbone.model_args", b.model_args, "null or a mapping of timm.create_model keywords, e.g. {depth: 6}")


def _check_init(b: DictConfig, resuming: bool = False) -> None:
    """``backbone.init``: null, ``timm:<name>`` / ``torchvision:<name>``, or a path that exists
    (what the file holds is checked when it is loaded: hvp_lightning/nn/weights.py). Not the
    path on ``resume=``: a resumed run starts from its checkpoint, not from ``backbone.init``."""
    init = b.get("init")
    if init is None:
        return
    allowed = "null, a weights file (.pth, .pt, .safetensors), an hvp-export folder, a run dir, " + " or ".join(
        f"{hub}:<name>" for hub in INIT_HUBS
    )
    if not isinstance(init, str) or not init:
        fail("backbone.init", init, allowed)
    if is_hub_init(init):
        if not init.partition(":")[2]:
            fail("backbone.init", init, f"{init.partition(':')[0]}:<model name>")
        return
    if not resuming and not Path(init).expanduser().exists():
        fail("backbone.init", init, f"{allowed} (no such file or folder)")


def check_timm_backbone(cfg: DictConfig) -> None:
    """``backbone=timm`` against timm itself: the name (else the closest names timm knows), iBOT's
    need for a ViT with a class token, and the model run at every crop size of the run (a ViT's
    patch size, a fixed input size, kernels larger than the image; a pooled ``[batch, features]``
    output). The model is built and run on the meta device: no memory, no initialisation, no compute."""
    from .nn.backbones import check_timm_name, meta_output_shape, meta_timm, runs_on_meta, timm_layout, timm_size_fix

    b, m = cfg.backbone, cfg.method
    check_timm_name(b.name)
    layout = timm_layout(b)
    if m.name == "ibot" and not layout.tokens:
        raise ConfigError(
            f"backbone.name={b.name!r} is not allowed for method=ibot: {b.name} is a {layout.kind}, and iBOT "
            "needs patch tokens, a class token and a mask token (a timm ViT, e.g. vit_small_patch16_224)"
        )
    sizes = {"data.crop_size": cfg.data.crop_size}
    if m.name in ("dino", "ibot") and int(m.get("num_local_crops") or 0) > 0:
        sizes["method.local_crop_size"] = m.local_crop_size
    for key, size in sizes.items():
        if layout.patch_size is not None and size % layout.patch_size:
            fail(key, size, f"a multiple of {b.name}'s patch size {layout.patch_size}")
    backbone = meta_timm(b)
    for key, size in sizes.items():
        try:
            shape = meta_output_shape(backbone, size)
        except Exception as err:  # the model's own code refuses this size (an assertion, a shape mismatch)
            # a model that fails at the size it is built for cannot be judged on the meta device
            if not runs_on_meta(backbone, b.get("img_size") or layout.img_size or layout.default_size):
                log.debug("backbone.name=%s: not checked on the meta device (%s)", b.name, err)
                return
            fix = timm_size_fix(b, list(sizes.values()))
            said = (str(err).splitlines() or [type(err).__name__])[0]
            why = f"{b.name} fails on {size} px images ({said if len(said) <= 120 else said[:117] + '...'})"
            if fix is None:
                fail(key, size, f"a size {b.name} takes (its default: {layout.default_size}): {why}")
            fail(key, size, f"{why}; set {fix}")
        if len(shape) != 2:
            fail(
                "backbone.model_args",
                OmegaConf.to_container(b.model_args) if b.model_args is not None else None,
                f"a global_pool that pools: {b.name} gives {list(shape)} at {size} px, not [batch, features] "
                "(leave global_pool out, or e.g. avg)",
            )


def _validate_lr_end(cfg: DictConfig) -> None:
    """Where the cosine ends: ``min_lr`` (absolute, DINO/iBOT) or ``final_lr_ratio`` (of the peak)."""
    o = cfg.method.optimizer
    min_lr, ratio = o.get("min_lr"), o.get("final_lr_ratio")
    if (min_lr is None) == (ratio is None):
        fail(
            "method.optimizer.min_lr",
            min_lr,
            "set exactly one of method.optimizer.min_lr (absolute end lr) "
            "and method.optimizer.final_lr_ratio (end lr / peak lr)",
        )


def _warn_long_warmup(cfg: DictConfig) -> None:
    """A learning-rate warm-up as long as the run never reaches the peak lr (base_lr x batch / 256):
    allowed (a short trial of a long recipe), but said once at start-up."""
    from lightning.pytorch.utilities import rank_zero_only

    warmup, epochs = cfg.method.optimizer.get("warmup_epochs"), cfg.trainer.get("max_epochs")
    if isinstance(warmup, int) and isinstance(epochs, int) and warmup >= epochs and rank_zero_only.rank == 0:
        log.warning(
            "method.optimizer.warmup_epochs=%s is not shorter than trainer.max_epochs=%s: the learning rate "
            "never reaches its peak (it warms up over the whole run)",
            warmup,
            epochs,
        )


def _warn_small_monitor(d: DictConfig) -> None:
    """RankMe on n images is at most n, so below 3 held-out images it is always under the collapse
    floor of 2 (hvp_lightning/nn/health.py): allowed, but every pass would signal collapse."""
    from lightning.pytorch.utilities import rank_zero_only

    from .nn.health import RANKME_COLLAPSE

    size = d.get("monitor_size") if d.name in ("images", "shards") else None
    if isinstance(size, int) and 0 < size <= RANKME_COLLAPSE and rank_zero_only.rank == 0:
        log.warning(
            "data.monitor_size=%s: RankMe on %s images is at most %s, under the collapse floor of %g, so every "
            "monitor pass will signal collapse; hold out more images (the default is 512)",
            size,
            size,
            size,
            RANKME_COLLAPSE,
        )


def _validate_distributed(cfg: DictConfig) -> None:
    """DDP settings Lightning would only reject once processes are launched (or never)."""
    t = cfg.trainer
    sync = t.get("sync_batchnorm", "auto")
    if not (sync == "auto" or isinstance(sync, bool)):
        fail("trainer.sync_batchnorm", sync, "auto (on when the model has BatchNorm), true or false")


def validate_data(cfg: DictConfig) -> None:
    """``data.*`` (types and ranges: the rules table, checked here too for eval.py's data)."""
    check_rules(cfg)
    d = cfg.data
    if d.name not in DATASETS:
        fail("data.name", d.name, f"one of {', '.join(DATASETS)}")
    if d.aug.get("blur_kind", "simclr") not in BLUR_KINDS:
        fail("data.aug.blur_kind", d.aug.blur_kind, f"one of {', '.join(BLUR_KINDS)}")
    if d.aug.get("interpolation", "bilinear") not in INTERPOLATIONS:
        fail("data.aug.interpolation", d.aug.interpolation, f"one of {', '.join(INTERPOLATIONS)}")
    if d.name == "synthetic":
        return
    if d.name == "images":
        check_images(cfg)
        return
    if d.name == "shards":
        check_shards(cfg)
        return
    if OmegaConf.is_missing(d, "root"):
        fail("data.root", "???", f"the folder holding {d.name}: add data.root=<path> to the command")
    if d.name == "imagefolder":
        check_imagenet_layout("data.root", d.root)
    elif d.name in TORCHVISION_FILES and not d.download:
        check_torchvision_root(d, "data")


def check_imagenet_layout(key: str, value: Any) -> None:
    """``value`` is an ImageNet-layout folder (``train/<class>/*`` and ``test/`` or ``val/``
    class folders holding images), or one message naming ``key``."""
    root = Path(str(value)).expanduser()
    for split in ("train", "test"):
        folder = split_dir(root, split)
        want = "<root>/train/<class>/*" if split == "train" else "<root>/test/<class>/* or <root>/val/<class>/*"
        if not folder.is_dir() or not any(p.is_dir() for p in folder.iterdir()):
            fail(key, str(value), f"an ImageNet-layout folder with {want} (no class folders in {folder})")
        if not any(p.is_file() and is_image_file(p.name) for p in folder.glob("*/**/*")):
            fail(
                key,
                str(value),
                f"an ImageNet-layout folder with {want} (no image files "
                f"({', '.join(IMAGE_EXTENSIONS)}) in the class folders of {folder})",
            )


IMAGE_FILES = f"image files ({', '.join(IMAGE_EXTENSIONS)}, any case)"


def check_images(cfg: DictConfig) -> None:
    """``data=images``: exactly one of ``data.root`` (a folder with images at any depth) and
    ``data.files`` (a list of existing image files); ``data.monitor_size`` held out of them,
    leaving some to train on; ``data.eval_root`` an ImageNet-layout folder when given."""
    d = cfg.data
    root, files = d.get("root"), d.get("files")
    if bool(root) == bool(files):
        fail(
            "data.root",
            root,
            "set exactly one of data.root=<folder of images> and data.files=<text file listing image paths>",
        )
    if root:
        if not Path(str(root)).expanduser().is_dir():
            what = (
                "a file, not a folder; a list of paths goes in data.files"
                if Path(str(root)).expanduser().is_file()
                else "no folder there"
            )
            fail("data.root", str(root), f"a folder holding {IMAGE_FILES} at any depth ({what})")
        if not training_images(d):
            fail(
                "data.root",
                str(root),
                f"a folder holding {IMAGE_FILES} at any depth (none found under it; hidden files and folders "
                "do not count)",
            )
    else:
        _check_image_list(str(files), training_images(d) if Path(str(files)).expanduser().is_file() else None)
    check_monitor(cfg, len(training_images(d)))


def check_shards(cfg: DictConfig) -> None:
    """``data=shards``: ``data.urls`` names shards that open and hold images (their index is
    built here, from the manifest or by reading them, and kept for the run); the held-out
    monitor sample and ``data.eval_root`` as for ``data=images``."""
    from .data.shard_index import ShardError, run_index

    d = cfg.data
    if not d.get("urls"):
        fail(
            "data.urls",
            d.get("urls"),
            f"a brace pattern of WebDataset tar shards, e.g. 'data.urls=\"{EXAMPLE_URLS}\"' (quoted for Hydra)",
        )
    options = d.get("storage_options")
    if options is not None and not OmegaConf.is_dict(options):
        fail("data.storage_options", options, "a mapping of fsspec options, e.g. {anon: true}")
    try:
        index = run_index(d)
    except ShardError as err:
        fail("data.urls", str(d.urls), f"shards that can be read: {err}")
    if not len(index):
        fail("data.urls", str(d.urls), f"shards holding {IMAGE_FILES} (none in the {len(index.urls)} shards)")
    check_monitor(cfg, len(index))


EXAMPLE_URLS = "/data/train-{000000..000127}.tar"


def check_monitor(cfg: DictConfig, n: int) -> None:
    """``data.monitor_size`` of ``n`` images is held out, leaving some to train on, and is at
    least 1 unless ``data.eval_root`` (an ImageNet-layout folder) gives the k-NN monitor."""
    d = cfg.data
    int_at_least(cfg, "data.monitor_size", 0)
    if d.monitor_size >= n:
        fail("data.monitor_size", d.monitor_size, f"fewer than the {n} images (it is held out of training)")
    if d.get("eval_root"):
        check_imagenet_layout("data.eval_root", d.eval_root)
    elif d.monitor_size == 0:
        fail(
            "data.monitor_size",
            0,
            "an integer >= 1 without data.eval_root (the held-out sample is then the run's only monitor)",
        )


def _check_image_list(files: str, paths: tuple[str, ...] | None) -> None:
    """``data.files``: a text file whose listed paths all exist and are image files."""
    if paths is None:
        fail("data.files", files, "a text file listing image paths, one a line (no file there)")
    if not paths:
        fail("data.files", files, "a text file listing image paths, one a line (it lists none)")
    not_images = [p for p in paths if not is_image_file(p)]
    if not_images:
        fail("data.files", files, f"a list of {IMAGE_FILES} ({len(not_images)} are not, the first: {not_images[0]})")
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        fail(
            "data.files",
            files,
            f"a list of existing files ({len(missing)} of {len(paths)} are missing, the first: {missing[0]}; "
            "relative paths are relative to the list's folder)",
        )


def check_torchvision_root(d: DictConfig, key: str) -> None:
    """The files torchvision's class for data set ``d`` reads are under ``d.root``, or one
    message naming ``<key>.root``, the path and the first file missing (torchvision itself
    only says "Dataset not found", and ``INaturalist`` makes the missing root first)."""
    root = Path(str(d.root)).expanduser()
    for rel in TORCHVISION_FILES[d.name]:
        if not (root / rel).exists():
            fail(
                f"{key}.root",
                str(d.root),
                f"a folder holding torchvision's {d.name} files ({rel} is not in it; "
                f"set {key}.download=true to fetch them)",
            )


def _warn_upsampled_crops(d: DictConfig, backbone: DictConfig) -> None:
    """Crops larger than the images are upsampled (blurry training views): allowed (e.g.
    CIFAR at 224 px for a ViT), but said once at start-up, with the crop that would not upsample
    (``crop_size: auto``'s for these images and backbone)."""
    if d.name == "synthetic":
        side = d.image_size
    elif d.name in ("imagefolder", "images", "shards"):
        side = training_image_side(d)
    else:
        side = IMAGE_SIDES.get(d.name)
    from lightning.pytorch.utilities import rank_zero_only

    if side is not None and d.crop_size > side and rank_zero_only.rank == 0:
        fits = auto_crop_size(side, crop_multiple(backbone))
        log.warning(
            "data.crop_size=%s is larger than the images (shorter side %s px): every crop is upsampled%s",
            d.crop_size,
            side,
            f"; set data.crop_size={fits} to crop them at their own size" if fits < d.crop_size else "",
        )


def _warn_cpu_oversubscription(t: DictConfig) -> None:
    """``trainer.devices=N`` on CPU starts N processes: more than there are cores is allowed (the
    results are those of N devices) but they take turns on the cores, so each step is slower than
    with one process per core. Said once at start-up, with the key and the core count."""
    from lightning.pytorch.utilities import rank_zero_only

    from .device import cpu_processes, runs_on_cpu, usable_cpu_cores

    n, cores = cpu_processes(t.get("devices", 1)), usable_cpu_cores()
    if runs_on_cpu(str(t.get("accelerator", "auto"))) and n is not None and n > cores and rank_zero_only.rank == 0:
        log.warning(
            "trainer.devices=%s starts %s CPU processes on %s usable cores: allowed, but they share the "
            "cores, so each step is slower than with trainer.devices<=%s",
            n,
            n,
            cores,
            cores,
        )


def _validate_hvp(cfg: DictConfig) -> None:
    h = cfg.get("hvp")
    if h is not None and "enabled" not in h and len(h) > 0:
        # `+hvp.num_views=8` (Hydra's advice for `hvp.num_views=8` without `+hvp=on`) makes an hvp
        # node without conf/hvp/on.yaml: it would train a baseline without a word.
        key = next(iter(h))
        fail(
            f"hvp.{key}",
            h[key],
            f"set only with +hvp=on (HVP is off without it): add +hvp=on and write hvp.{key}=... without the +",
        )
    if h is None or not h.get("enabled", False):
        return
    if h.mode not in MODES:
        fail("hvp.mode", h.mode, f"one of {', '.join(MODES)}")
    if h.selection_precision not in PRECISIONS:
        fail("hvp.selection_precision", h.selection_precision, f"one of {', '.join(PRECISIONS)}")
    if h.get("max_combinations") is not None and cfg.method.name != "dino":
        fail(
            "hvp.max_combinations",
            h.max_combinations,
            f"only with method dino (it samples (global pair, "
            f"locals) combinations); {cfg.method.name} scores every candidate combination",
        )
    if h.get("global_pairs", "cross") not in GLOBAL_PAIRS:
        fail("hvp.global_pairs", h.global_pairs, f"one of {', '.join(GLOBAL_PAIRS)}")
    if cfg.method.name not in ("dino", "ibot"):
        for key, default in MULTICROP_HVP_DEFAULTS.items():
            if h.get(key, default) != default:
                fail(
                    f"hvp.{key}",
                    h[key],
                    f"{'null' if default is None else default} for method {cfg.method.name}: only DINO and iBOT "
                    "have global and local candidates",
                )
    colour = h.get("colour", "per_view")
    if colour not in HVP_COLOURS:
        fail("hvp.colour", colour, f"one of {', '.join(HVP_COLOURS)}")
    if colour == "static" and cfg.method.name in ("dino", "ibot"):
        fail(
            "hvp.colour",
            colour,
            f"per_view for method {cfg.method.name} (static colour shares one colour draw between the "
            "candidates of a pair method; DINO/iBOT's global pipelines differ in blur and solarize)",
        )


# conf/hvp/on.yaml's multi-crop keys, which a pair method would ignore: refused there unless at these
MULTICROP_HVP_DEFAULTS = {"global_pairs": "cross", "num_global_candidates": None, "num_local_candidates": None}

IOU_POLICY_KEYS = ("enabled", "schedule", "start", "end", "warmup_epochs", "skip_p", "max_tries")


def _validate_iou_policy(cfg: DictConfig) -> None:
    """``data.iou_policy`` (hvp_lightning/data/iou_policy.py): every key of
    conf/data/iou_policy/on.yaml present and in range; warm-up shorter than the run."""
    p = cfg.data.get("iou_policy")
    if p is None:
        return
    for key in IOU_POLICY_KEYS:
        if key not in p:
            fail(f"data.iou_policy.{key}", None, "set it, or add +data/iou_policy=on for the whole policy")
    if not isinstance(p.enabled, bool):
        fail("data.iou_policy.enabled", p.enabled, "true or false")
    if not p.enabled:
        return
    if p.schedule not in IOU_SCHEDULES:
        fail("data.iou_policy.schedule", p.schedule, f"one of {', '.join(IOU_SCHEDULES)}")
    for key in ("start", "end"):
        value = p[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            fail(f"data.iou_policy.{key}", value, "an IoU threshold in [0, 1] (pairs above it are redrawn)")
    _prob(cfg, "data.iou_policy.skip_p")
    int_at_least(cfg, "data.iou_policy.max_tries", 1)
    epochs = _get(cfg, "trainer.max_epochs")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        fail("trainer.max_epochs", epochs, "an integer >= 1 with data.iou_policy (its schedule spans the epochs)")
    _int_in(cfg, "data.iou_policy.warmup_epochs", 0, epochs - 1)


def check_candidate_counts(cfg: DictConfig) -> None:
    """DINO/iBOT with HVP: ``hvp.num_global_candidates`` >= 2 (default ``hvp.num_views``);
    ``hvp.num_local_candidates`` >= ``method.num_local_crops`` for DINO, and for iBOT, which
    selects among global views only, unset or equal to it."""
    h = cfg.get("hvp")
    if cfg.method.name not in ("dino", "ibot") or h is None or not h.get("enabled", False):
        return
    g = h.get("num_global_candidates") or h.num_views
    if int(g) < 2:
        fail("hvp.num_global_candidates", g, "expected an integer >= 2")
    num_local, lc = int(cfg.method.num_local_crops), h.get("num_local_candidates")
    if lc is None:
        return
    if cfg.method.name == "ibot" and int(lc) != num_local:
        raise ConfigError(
            f"hvp.num_local_candidates={lc!r} is not allowed for method=ibot: it selects among "
            f"global views only (leave it unset or = method.num_local_crops={num_local})"
        )
    if int(lc) < num_local:
        fail("hvp.num_local_candidates", lc, f"expected an integer >= method.num_local_crops={num_local}")


def _check_trainer(cfg: DictConfig) -> None:
    for key in OWNED_TRAINER_KEYS:
        if key in cfg.trainer:
            fail(
                f"trainer.{key}",
                cfg.trainer[key],
                "not set here: checkpoints are always written (checkpoint.every_n_epochs sets the kept ones)",
            )
    precision = cfg.trainer.get("precision", "32-true")
    if precision not in AUTO_PRECISIONS + TRAINER_PRECISIONS:
        fail("trainer.precision", precision, f"one of {', '.join(AUTO_PRECISIONS + TRAINER_PRECISIONS)}")


def _validate_trainer_keys(cfg: DictConfig) -> None:
    """Every ``trainer.*`` key is a ``lightning.Trainer`` argument (of the installed version)."""
    import inspect

    import lightning as L

    allowed = set(inspect.signature(L.Trainer.__init__).parameters) - {
        "self",
        "logger",
        "callbacks",
        "default_root_dir",
    }
    for key in cfg.trainer:
        if key not in allowed:
            fail(f"trainer.{key}", cfg.trainer[key], "not a lightning.Trainer argument")


def _validate_deterministic(cfg: DictConfig) -> None:
    """``trainer.deterministic=true`` on a GPU: Lightning turns on
    ``torch.use_deterministic_algorithms``, under which torch raises at the first backward
    through an op without a deterministic CUDA kernel. The CPU kernels are deterministic, so a
    CPU run (the tests' resumes) cannot show it; refused at start-up instead of after it.
    ``warn`` keeps those ops, with a warning. (A ResNet's global average pooling is fine: at
    output size 1 torch computes it as a mean.)"""
    from .device import runs_on_cpu

    t = cfg.trainer
    if t.get("deterministic") is not True or runs_on_cpu(str(t.get("accelerator", "auto"))):
        return
    blocker = nondeterministic_cuda_backward(cfg)
    if blocker is not None:
        fail(
            "trainer.deterministic",
            True,
            f"false or warn on a GPU: {blocker} has no deterministic CUDA "
            "backward, so torch would raise at the first training step",
        )


def nondeterministic_cuda_backward(cfg: DictConfig) -> str | None:
    """The op of this run's network whose CUDA backward torch refuses in deterministic mode, or
    None: a ViT's antialiased bicubic resize of its position embedding
    (``_upsample_bicubic2d_aa_backward``), which timm runs for crops of another size than
    ``backbone.img_size`` (DINO/iBOT's local crops, or global crops resized)."""
    b, m = cfg.backbone, cfg.method
    family, img_size = backbone_family(b), b.get("img_size")
    if family == TIMM_FAMILY:
        from .nn.backbones import timm_layout

        layout = timm_layout(b)
        if layout.patch_size is None:
            return None
        img_size = layout.img_size
    elif family != "vit":
        return None
    sizes = [cfg.data.crop_size]
    if m.name in ("dino", "ibot") and int(m.get("num_local_crops") or 0) > 0:
        sizes.append(m.local_crop_size)
    other = [s for s in sizes if isinstance(s, int) and s != img_size]
    if other:
        return (
            f"the position-embedding resize of {b.name} (F.interpolate, bicubic) for {other[0]} px crops "
            f"(backbone.img_size={img_size})"
        )
    return None


def _validate_precision(cfg: DictConfig) -> None:
    """Lightning has no fp16 AMP on CPU: it would silently train in bf16-mixed instead.
    Resolves ``auto`` (bf16-mixed on a bf16-capable GPU, else 32-true) and ``auto-16-mixed``
    (16-mixed on a GPU, else 32-true): hvp_lightning/device.py."""
    from .device import auto_precision

    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    precision = cfg.trainer.get("precision", "32-true")
    if precision in AUTO_PRECISIONS:
        precision = cfg.trainer.precision = auto_precision(accelerator, precision)
    check_cpu_precision("trainer.precision", precision, accelerator)


def check_cpu_precision(key: str, precision: str, accelerator: str) -> None:
    """Lightning has no fp16 AMP on CPU: ``16-mixed`` there would silently run bf16-mixed.
    Training (``trainer.precision``) and evaluation (``precision``) both refuse it."""
    from .device import runs_on_cpu

    if precision == "16-mixed" and runs_on_cpu(accelerator):
        fail(key, precision, "on CPU one of 32-true, bf16-mixed (no fp16 mixed precision on CPU)")
