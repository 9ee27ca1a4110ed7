"""Start-up validation: every bad value ends in one line naming the key, the value and what is
allowed -- before any data is read or a Lightning Trainer exists -- and every problem is said at
once, not the first one per try.

Each key's type, range and choices, and the rules that tie several keys together, are the
schema's (:mod:`hvp_lightning.schema`: a section's validators); here is what needs more than the
config: the disk, the data and the machine.

* :func:`check_options` (and :func:`check_eval_options` for eval.py): the schema, then what the
  file system can tell (``backbone.init``, ``budget.match``, data roots, the images found, a batch
  and a monitor sample that fit them, crops a backbone takes once ``auto`` is resolved).
  Torch-free: the command-line entry points run it before the heavy imports
  (hvp_lightning/cli.py), so a typo costs a second, not the ~15 s those imports take. It returns
  the validated config (:class:`~hvp_lightning.schema.TrainConfig`: every declared key with its
  declared type; ``auto`` values the data decides resolved) that the run then reads.
* :func:`validate`: what needs Lightning and the machine (``trainer.*`` against
  ``lightning.Trainer``'s signature, ``trainer.precision`` on this device) and the start-up
  warnings. :func:`hvp_lightning.training.driver.run` calls it.
"""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from .data.image_files import IMAGE_EXTENSIONS, is_image_file
from .data.layout import (
    IMAGE_SIDES,
    TORCHVISION_FILES,
    auto_crop_size,
    crop_multiple,
    resolve_auto_crop,
    split_dir,
    training_image_side,
    training_images,
)
from .errors import ConfigError, fail
from .hub_reach import hub_out_of_reach
from .run.directory import RunDir, resolve_checkpoint
from .schema import (
    AUTO_PRECISIONS,
    MULTI_CROP,
    TIMM_FAMILY,
    DataConfig,
    EvalConfig,
    TrainConfig,
    backbone_family,
    container,
    is_hub_init,
    settings,
)
from .schema.backbone import INIT_ALLOWED, TimmSettings
from .schema.base import Problems, chosen_model, discriminator, model_choices, strip_unknown
from .schema.data import DataSettings, UnlabelledData
from .schema.run import TrainerSettings, check_crop_for_backbone, trainer_extras
from .schema.stored import with_earlier_values
from .settings import SettingError, selection_side

log = logging.getLogger(__name__)


# --- train.py ---------------------------------------------------------------------------------------
def check_options(cfg: DictConfig | Mapping[str, Any]) -> TrainConfig:
    """The validated config of a training command (a composed config), or a :class:`ConfigError`
    with one line per problem: the schema's (every key, and the rules that tie keys together: the
    sections' validators), then, once the config holds together, those the files it names show
    (all at once). ``auto`` values that the data decides (``data.crop_size``,
    ``data.eval_crop_ratio``, ``data.monitor_size``) are resolved. Torch-free. A resumed run's
    config may hold keys of an older version: they are left out (the code no longer reads them),
    where a new command's unknown key is refused."""
    data = container(cfg)
    refuse_group_keys_without_group(data)
    if data.get("resume"):
        dropped = strip_unknown(TrainConfig, data)
        if dropped:
            log.info("the run's config holds keys this version does not read: %s", ", ".join(dropped))
    s = settings(TrainConfig, data)
    problems = Problems()
    with problems.check():
        check_init(s)
    with problems.check():
        check_matched_run(s)
    with problems.check():
        images = check_data(s.data)
        with problems.check():
            s = check_fit(s, images)
        s = s.model_copy(update={"data": resolve_auto_crop(s.data, s.backbone)})
        with problems.check():
            check_crops(s)
    problems.raise_any()
    return s


def stored_config(raw: Mapping[str, Any] | DictConfig) -> TrainConfig:
    """A run's config as its checkpoint stores it, read by this version: keys it no longer
    declares left out, keys added since at the value the run's version used
    (:mod:`hvp_lightning.schema.stored`) or else their defaults, every value of its declared type."""
    data = container(raw)
    strip_unknown(TrainConfig, data)
    with_earlier_values(data, declares)
    return settings(TrainConfig, data)


def declares(section: str, values: dict[str, Any], key: str) -> bool:
    """Whether the section ``section`` of a training config with ``values`` declares ``key``."""
    field = TrainConfig.model_fields[section]
    model = chosen_model(field.annotation, values, discriminator(field)) if model_choices(field.annotation) else None
    return model is not None and key in model.model_fields


# optional groups added whole by a command-line group (the key, its option)
OPTIONAL_GROUPS = (("hvp", "+hvp=on"), ("data.iou_policy", "+data/iou_policy=on"))


def refuse_group_keys_without_group(cfg: DictConfig | Mapping[str, Any]) -> None:
    """``+hvp.num_views=8`` (Hydra's advice for ``hvp.num_views=8`` without ``+hvp=on``) makes an
    ``hvp`` node without ``+hvp=on``'s keys: it would turn HVP on with a key's worth of settings, or
    read as the baseline. The same for ``data.iou_policy`` without ``+data/iou_policy=on``. Of the
    composed config, before the schema reads it."""
    values = container(cfg)
    for path, option in OPTIONAL_GROUPS:
        node: Any = values
        for part in path.split("."):
            node = node[part] if isinstance(node, Mapping) and part in node else None
        if isinstance(node, Mapping) and "enabled" not in node and len(node) > 0:
            key = next(iter(node))
            fail(
                f"{path}.{key}",
                node[key],
                f"set only with {option} (off without it): add {option} and write {path}.{key}=... without the +",
            )


def check_init(s: TrainConfig) -> None:
    """``backbone.init``'s path exists, or its hub can be reached (its form is the schema's; what
    the file holds is checked when it is loaded: hvp_lightning/training/weights.py). Not on
    ``resume=``: a resumed run starts from its checkpoint, not from ``backbone.init``."""
    init = s.backbone.init
    if init is None or s.resume:
        return
    if is_hub_init(init):
        if (why := hub_out_of_reach(init)) is not None:  # seconds, before the heavy imports
            fail("backbone.init", init, f"released weights in the local cache or a hub to fetch them from ({why}): "
                 "fetch them where there is a network, or pass the file as backbone.init=<path>")  # fmt: skip
        return
    if not Path(init).expanduser().exists():
        fail("backbone.init", init, f"{INIT_ALLOWED} (no such file or folder)")


def check_matched_run(s: TrainConfig) -> None:
    """``budget.match`` a finished run that counted its FLOPs (not read again on ``resume=``: the
    run keeps the epochs it derived)."""
    if s.budget.match is not None and not s.resume:
        matched_flops(s.budget.match)


def matched_flops(run_dir: str) -> float:
    """``budget.match``: the model FLOPs the run in ``run_dir`` trained for (its summary.json
    ``cost.total_flops``), or one line saying why there are none."""
    allowed = "a finished run's dir, holding summary.json with cost.total_flops"
    path = Path(run_dir).expanduser()
    if not path.is_dir():
        fail("budget.match", run_dir, f"{allowed} (no such folder)")
    summary = RunDir(path).summary
    if not summary.is_file():
        fail("budget.match", run_dir, f"{allowed} (no summary.json in it: the run has not ended)")
    try:
        total = (json.loads(summary.read_text()).get("cost") or {}).get("total_flops")
    except (json.JSONDecodeError, AttributeError, UnicodeDecodeError) as err:
        fail("budget.match", run_dir, f"{allowed} (its summary.json does not read: {err})")
    if isinstance(total, bool) or not isinstance(total, (int, float)) or total <= 0:
        fail("budget.match", run_dir, f"{allowed} (its summary.json has no cost.total_flops: a run from before "
             "cost reporting, or one whose FLOPs could not be counted); give budget.flops=<FLOPs> instead")  # fmt: skip
    return float(total)


def check_crops(cfg: TrainConfig) -> None:
    """Once ``auto`` is resolved: the crop fits the built-in backbone."""
    check_crop_for_backbone(cfg.backbone, cfg.data.crop_size)


# --- the data and what fits it ---------------------------------------------------------------------
IMAGE_FILES = f"image files ({', '.join(IMAGE_EXTENSIONS)}, any case)"
AUTO_MONITOR_SHARE, AUTO_MONITOR_MAX = 5, 512  # data.monitor_size=auto: a fifth of the images, at most 512


def check_data(d: DataSettings) -> int | None:
    """The files the ``data`` section ``d`` names exist and hold images: the training images found
    (before the held-out monitor sample), where start-up can count them, else None."""
    if d.name == "synthetic":
        return int(d.train_size)
    if d.name == "images":
        return check_images(d)
    if d.name == "shards":
        return check_shards(d)
    if d.name == "imagefolder":
        check_imagenet_layout("data.root", d.root)
        return None
    if not d.download:
        check_torchvision_root(d, "data")
    return None


def check_fit(cfg: TrainConfig, images: int | None) -> TrainConfig:
    """The held-out monitor sample and the batch fit the images found: ``data.monitor_size`` (auto:
    a fifth, at most 512) leaves some to train on, and every rank gets a whole batch per epoch.
    Each problem names a value that would work; all are said together. Returns ``cfg`` with
    ``data.monitor_size: auto`` resolved."""
    d, problems = cfg.data, Problems()
    if images is None:
        return cfg
    held = 0
    if isinstance(d, UnlabelledData):
        held = auto_monitor_size(images)  # the batch is judged against the sample that would fit
        with problems.check():
            held = resolve_monitor_size(d, images)
        cfg = cfg.with_values({"data.monitor_size": held})
    n = images - held
    if d.train_subset is not None:
        n = min(n, d.train_subset)
    world = processes(cfg.trainer)
    batch = int(cfg.method.batch_size)
    if world is not None and batch > n // world:
        fits = largest_power_of_two(n // world)
        what = f"the {n} training images" + (f" ({images} found, {held} held out for the monitors)" if held else "")
        per = f" over {world} processes" if world > 1 else ""
        with problems.check():
            fail(
                "method.batch_size",
                batch,
                f"at most {n // world}: batches are full (drop_last) and {what}{per} give fewer; e.g. "
                f"method.batch_size={fits}"
                if fits >= 2
                else f"more images: {what}{per} hold no batch of 2",
            )
    problems.raise_any()
    return cfg


def resolve_monitor_size(d: UnlabelledData, images: int) -> int:
    """``data.monitor_size`` of ``images`` images (``auto`` resolved): held out of training,
    leaving some to train on, and at least 1 unless ``data.eval_root`` gives k-NN."""
    size = auto_monitor_size(images) if d.monitor_size == "auto" else d.monitor_size
    if size >= images:
        fits = auto_monitor_size(images)
        fail("data.monitor_size", size, f"fewer than the {images} images (it is held out of training); e.g. "
             f"data.monitor_size={fits} or auto")  # fmt: skip
    if size == 0 and not d.eval_root:
        fail(
            "data.monitor_size",
            0,
            "an integer >= 1 or auto without data.eval_root (the held-out sample is then the run's only monitor)",
        )
    return size


def auto_monitor_size(images: int) -> int:
    """``data.monitor_size=auto``: a fifth of the images, at most 512, at least one (none of one image)."""
    return max(1, min(AUTO_MONITOR_MAX, images // AUTO_MONITOR_SHARE)) if images > 1 else 0


def processes(t: TrainerSettings) -> int | None:
    """Training processes (devices x nodes) where the config says it (not ``auto`` or a GPU list)."""
    if isinstance(t.devices, int) and t.devices > 0:
        return t.devices * t.num_nodes
    return None


def largest_power_of_two(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


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


def check_images(d: Any) -> int:
    """``data=images``: exactly one of ``data.root`` (a folder with images at any depth) and
    ``data.files`` (a list of existing image files); ``data.eval_root`` an ImageNet-layout
    folder when given. Returns the images found."""
    root, files = d.root, d.files
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
    if d.eval_root:
        check_imagenet_layout("data.eval_root", d.eval_root)
    return len(training_images(d))


def check_shards(d: Any) -> int:
    """``data=shards``: ``data.urls`` names shards that open and hold images (their index is
    built here, from the manifest or by reading them, and kept for the run); ``data.eval_root``
    as for ``data=images``. Returns the images in them."""
    from .data.shard_index import ShardError, run_index

    if not d.urls:
        fail(
            "data.urls",
            d.urls,
            f"a brace pattern of WebDataset tar shards, e.g. 'data.urls=\"{EXAMPLE_URLS}\"' (quoted for Hydra)",
        )
    try:
        index = run_index(d)
    except ShardError as err:
        fail("data.urls", str(d.urls), f"shards that can be read: {err}")
    if not len(index):
        fail("data.urls", str(d.urls), f"shards holding {IMAGE_FILES} (none in the {len(index.urls)} shards)")
    if d.eval_root:
        check_imagenet_layout("data.eval_root", d.eval_root)
    return len(index)


EXAMPLE_URLS = "/data/train-{000000..000127}.tar"


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


def check_torchvision_root(d: Any, key: str) -> None:
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


def validate_data(cfg: DictConfig | Mapping[str, Any]) -> DataSettings:
    """An evaluation's ``data`` (``cfg.data``: a data preset, or the checkpoint's own with changes):
    its keys by the schema, its files by :func:`check_data`. Returns the validated ``data`` section."""
    d = settings(DataConfig, {"data": container(cfg)["data"]}).data
    check_data(d)
    return d


def _warn_upsampled_crops(d: DataSettings, backbone: Any) -> None:
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


# --- the machine and Lightning ---------------------------------------------------------------------
def validate(cfg: TrainConfig | DictConfig | Mapping[str, Any]) -> TrainConfig:
    """:func:`check_options` (unless ``cfg`` is its result already, a :class:`TrainConfig`: the CLI
    runs it before the heavy imports), then the checks that need Lightning and the machine;
    resolves ``trainer.precision: auto`` / ``auto-16-mixed``. Warns once about settings that are
    allowed but probably not meant. Returns the validated config."""
    if not isinstance(cfg, TrainConfig):
        cfg = check_options(cfg)
    if backbone_family(cfg.backbone) == TIMM_FAMILY:
        check_timm_backbone(cfg)
    _validate_trainer_keys(cfg)
    cfg = validate_precision(cfg)
    _validate_deterministic(cfg)
    _warn_upsampled_crops(cfg.data, cfg.backbone)
    if not cfg.budget.sets_epochs:  # else said once the budget has set the epochs (training/budget.py)
        warn_long_warmup(cfg)
    _warn_small_monitor(cfg.data)
    _warn_cpu_oversubscription(cfg.trainer)
    return cfg


def check_timm_backbone(cfg: TrainConfig) -> None:
    """``backbone=timm`` against timm itself: the name (else the closest names timm knows), iBOT's
    need for a ViT with a class token, and the model run at every crop size of the run (a ViT's
    patch size, a fixed input size, kernels larger than the image; a pooled ``[batch, features]``
    output). The model is built and run on the meta device: no memory, no initialisation, no compute."""
    from .backbone_checks import meta_output_shape, meta_timm, runs_on_meta, timm_layout, timm_size_fix
    from .nn.backbones import check_timm_name

    b, m = cfg.backbone, cfg.method
    assert isinstance(b, TimmSettings)
    try:
        check_timm_name(b.name)
    except SettingError as err:
        raise ConfigError(str(err.at("backbone."))) from None
    layout = timm_layout(b)
    if m.name == "ibot" and not layout.tokens:
        raise ConfigError(
            f"backbone.name={b.name!r} is not allowed for method=ibot: {b.name} is a {layout.kind}, and iBOT "
            "needs patch tokens, a class token and a mask token (a timm ViT, e.g. vit_small_patch16_224)"
        )
    sizes = {"data.crop_size": cfg.data.crop_size}
    if m.name in MULTI_CROP and m.num_local_crops > 0:
        sizes["method.local_crop_size"] = m.local_crop_size
    for key, size in sizes.items():
        if layout.patch_size is not None and size % layout.patch_size:
            fail(key, size, f"a multiple of {b.name}'s patch size {layout.patch_size}")
    # hvp.selection_scale < 1 scores the candidates at smaller sides (the method's selection_size_rule
    # for a timm model: its patch, else a multiple of 1 and at least 32 px): the model must take those too
    scaled = _selection_sides(cfg, sizes, layout.patch_size)
    backbone = meta_timm(b)
    for key, size in [*sizes.items(), *((key, side) for key, (_, side) in scaled.items())]:
        try:
            shape = meta_output_shape(backbone, size)
        except Exception as err:  # the model's own code refuses this size (an assertion, a shape mismatch)
            # a model that fails at the size it is built for cannot be judged on the meta device
            if not runs_on_meta(backbone, b.img_size or layout.img_size or layout.default_size):
                log.debug("backbone.name=%s: not checked on the meta device (%s)", b.name, err)
                return
            said = (str(err).splitlines() or [type(err).__name__])[0]
            why = f"{b.name} fails on {size} px images ({said if len(said) <= 120 else said[:117] + '...'})"
            if key in scaled:
                scale = cfg.hvp.selection_scale
                crop = f"{key}={scaled[key][0]}"
                fail(
                    "hvp.selection_scale",
                    scale,
                    f"1 with {b.name}: the selection pass scores {crop} at {size} px; {why}",
                )
            fix = timm_size_fix(b, list(sizes.values()))
            if fix is None:
                fail(key, size, f"a size {b.name} takes (its default: {layout.default_size}): {why}")
            fail(key, size, f"{why}; set {fix}")
        if len(shape) != 2:
            fail(
                "backbone.model_args",
                b.model_args,
                f"a global_pool that pools: {b.name} gives {list(shape)} at {size} px, not [batch, features] "
                "(leave global_pool out, or e.g. avg)",
            )


def _selection_sides(cfg: TrainConfig, sizes: dict[str, int], patch: int | None) -> dict[str, tuple[int, int]]:
    """{crop key: (its size, its side in the selection pass)} where ``hvp.selection_scale`` makes the
    side smaller: what ``selection_size_rule`` gives a timm backbone (its patch; else at least 32 px)."""
    h = cfg.hvp
    if not cfg.hvp_on or h.selection_scale >= 1:  # type: ignore[union-attr]
        return {}
    multiple, minimum = (patch, patch) if patch else (1, 32)
    sides = {key: (size, selection_side(size, h.selection_scale, multiple, minimum)) for key, size in sizes.items()}
    return {key: (size, side) for key, (size, side) in sides.items() if side != size}


def _validate_trainer_keys(cfg: TrainConfig) -> None:
    """Every ``trainer.*`` key is a ``lightning.Trainer`` argument (of the installed version): the
    declared ones are, and a ``+trainer.<key>`` beyond them must be (with the closest one named)."""
    import inspect

    import lightning as L

    allowed = set(inspect.signature(L.Trainer.__init__).parameters) - {
        "self",
        "logger",
        "callbacks",
        "default_root_dir",
    }
    for key, value in cfg.trainer.model_dump().items():
        if key not in allowed:
            close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f" (did you mean trainer.{close[0]}?)" if close else ""
            fail(f"trainer.{key}", value, f"not a lightning.Trainer argument{hint}")


def validate_precision(cfg: TrainConfig) -> TrainConfig:
    """Lightning has no fp16 AMP on CPU: it would silently train in bf16-mixed instead.
    Resolves ``auto`` (bf16-mixed on a bf16-capable GPU, else 32-true) and ``auto-16-mixed``
    (16-mixed on a GPU, else 32-true): hvp_lightning/device.py. Returns ``cfg`` so resolved."""
    from .device import auto_precision

    accelerator = cfg.trainer.accelerator
    precision = cfg.trainer.precision
    if precision in AUTO_PRECISIONS:
        precision = auto_precision(accelerator, precision)
        cfg = cfg.with_values({"trainer.precision": precision})
    check_cpu_precision("trainer.precision", precision, accelerator)
    return cfg


def check_cpu_precision(key: str, precision: str, accelerator: str) -> None:
    """Lightning has no fp16 AMP on CPU: ``16-mixed`` there would silently run bf16-mixed.
    Training (``trainer.precision``) and evaluation (``precision``) both refuse it."""
    from .device import runs_on_cpu

    if precision == "16-mixed" and runs_on_cpu(accelerator):
        fail(key, precision, "on CPU one of 32-true, bf16-mixed (no fp16 mixed precision on CPU)")


def _validate_deterministic(cfg: TrainConfig) -> None:
    """``trainer.deterministic=true`` on a GPU: Lightning turns on
    ``torch.use_deterministic_algorithms``, under which torch raises at the first backward
    through an op without a deterministic CUDA kernel. The CPU kernels are deterministic, so a
    CPU run (the tests' resumes) cannot show it; refused at start-up instead of after it.
    ``warn`` keeps those ops, with a warning. (A ResNet's global average pooling is fine: at
    output size 1 torch computes it as a mean.)"""
    from .device import runs_on_cpu

    t = cfg.trainer
    if trainer_extras(t).get("deterministic") is not True or runs_on_cpu(t.accelerator):  # a +trainer.* key
        return
    blocker = nondeterministic_cuda_backward(cfg)
    if blocker is not None:
        fail(
            "trainer.deterministic",
            True,
            f"false or warn on a GPU: {blocker} has no deterministic CUDA "
            "backward, so torch would raise at the first training step",
        )


def nondeterministic_cuda_backward(cfg: TrainConfig) -> str | None:
    """The op of this run's network whose CUDA backward torch refuses in deterministic mode, or
    None: a ViT's antialiased bicubic resize of its position embedding
    (``_upsample_bicubic2d_aa_backward``), which timm runs for crops of another size than
    ``backbone.img_size`` (DINO/iBOT's local crops, or global crops resized)."""
    b, m = cfg.backbone, cfg.method
    family = backbone_family(b)
    if family == TIMM_FAMILY:
        from .backbone_checks import timm_layout

        layout = timm_layout(b)
        if layout.patch_size is None:
            return None
        img_size = layout.img_size
    elif family == "vit":
        img_size = b.img_size
    else:
        return None
    sizes = [cfg.data.crop_size]
    if m.name in MULTI_CROP and m.num_local_crops > 0:
        sizes.append(m.local_crop_size)
    other = [s for s in sizes if isinstance(s, int) and s != img_size]
    if other:
        return (
            f"the position-embedding resize of {b.name} (F.interpolate, bicubic) for {other[0]} px crops "
            f"(backbone.img_size={img_size})"
        )
    return None


def warn_long_warmup(cfg: TrainConfig) -> None:
    """A learning-rate warm-up as long as the run never reaches the peak lr (base_lr x batch / 256):
    allowed (a short trial of a long recipe), but said once at start-up."""
    from lightning.pytorch.utilities import rank_zero_only

    warmup, epochs = cfg.method.optimizer.warmup_epochs, cfg.trainer.max_epochs
    if warmup >= epochs and rank_zero_only.rank == 0:
        log.warning(
            "method.optimizer.warmup_epochs=%s is not shorter than trainer.max_epochs=%s: the learning rate "
            "never reaches its peak (it warms up over the whole run)",
            f"{warmup:g}",
            epochs,
        )


def _warn_small_monitor(d: DataSettings) -> None:
    """RankMe on n images is at most n, so below 3 held-out images it is always under the collapse
    floor of 2 (hvp_lightning/monitors/health.py): allowed, but every pass would signal collapse."""
    from lightning.pytorch.utilities import rank_zero_only

    from .monitors.health import RANKME_COLLAPSE

    size = d.monitor_size if isinstance(d, UnlabelledData) else None
    if isinstance(size, int) and 0 < size <= RANKME_COLLAPSE and rank_zero_only.rank == 0:
        log.warning(
            "data.monitor_size=%s: RankMe on %s images is at most %s, under the collapse floor of %g, so every "
            "monitor pass will signal collapse; hold out more images (the default is auto: a fifth, at most 512)",
            size,
            size,
            size,
            RANKME_COLLAPSE,
        )


def _warn_cpu_oversubscription(t: TrainerSettings) -> None:
    """``trainer.devices=N`` on CPU starts N processes: more than there are cores is allowed (the
    results are those of N devices) but they take turns on the cores, so each step is slower than
    with one process per core. Said once at start-up, with the key and the core count."""
    from lightning.pytorch.utilities import rank_zero_only

    from .device import cpu_processes, runs_on_cpu, usable_cpu_cores

    n, cores = cpu_processes(t.devices), usable_cpu_cores()
    if runs_on_cpu(t.accelerator) and n is not None and n > cores and rank_zero_only.rank == 0:
        log.warning(
            "trainer.devices=%s starts %s CPU processes on %s usable cores: allowed, but they share the "
            "cores, so each step is slower than with trainer.devices<=%s",
            n,
            n,
            cores,
            cores,
        )


# --- eval.py ----------------------------------------------------------------------------------------
def check_eval_options(cfg: DictConfig | Mapping[str, Any]) -> EvalConfig:
    """eval.py's settings that need no checkpoint (the rest: hvp_lightning/evaluation/): the
    schema's, the checkpoint path, a data preset's files. Torch-free. Returns the validated config."""
    s = settings(EvalConfig, cfg)
    resolve_checkpoint(s.ckpt)  # the path exists (its contents are checked when it is loaded)
    if data_preset_given(s):  # else the checkpoint's data, checked once it is loaded
        validate_data({"data": preset_data(s)})
    return s


def preset_data(cfg: EvalConfig) -> dict[str, Any]:
    """An evaluation's ``data=<preset>``, without eval.py's own ``data.eval_root: null`` (the
    run's; declared so that ``data.eval_root=DIR`` takes no ``+``) where the preset has no such key."""
    data = dict(cfg.data or {})
    if "eval_root" in data and data["eval_root"] is None:
        del data["eval_root"]
    return data


def data_preset_given(cfg: EvalConfig) -> bool:
    """Whether an evaluation's ``data`` is a data set (``data=<name>``), not only ``+data.<key>=``
    changes to the checkpoint's own data (conf/eval.yaml has no ``data`` without a preset)."""
    return cfg.data is not None and "name" in cfg.data
