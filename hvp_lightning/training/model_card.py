"""What an exported folder says about its weights: the timm architecture that builds the trunk,
the ``config.json`` timm's hub loader reads, and the ``README.md`` model card.

Pure functions of the run's config, its checkpoint's counters and its ``summary.json``, so the
record is written from what the run saved, never from what the exporting process happens to hold.
``config.json`` follows timm's hub layout (``architecture``, ``num_classes``, ``num_features``,
``model_args``, ``pretrained_cfg``): ``timm.create_model("local-dir:<folder>", pretrained=True)``
and ``hf-hub:<repo>`` read it as it is; the ``hvp`` block beside them is ours and timm ignores it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from ..schema import TIMM_FAMILY, TrainConfig, backbone_family
from ..schema.backbone import BackboneSettings
from ..schema.base import as_dict
from ..schema.data import DataSettings

# Bookkeeping entries of summary.json: how long and on what the run went, not how the model is.
_NOT_MONITORS = {
    "epochs", "steps", "images_seen", "skipped_images", "seed", "wall_time_s", "num_classes",
    "sync_batchnorm_layers", "hvp_enabled", "cost", "budget",  # what training cost: not a quality of the weights
}  # fmt: skip
_POSITION = ("step", "epoch", "images_seen")  # where a pass was: the card's own counters say where the weights are
_VIT_DEFAULTS = {"img_size": 224, "patch_size": 16, "depth": 12}  # timm's vit_*_patch16_224
# Where the citation lives: the package in a wheel (pyproject.toml), the repository root in a checkout.
_CITATION_PLACES = (Path(__file__).resolve().parents[1], Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class TimmTarget:
    """How to rebuild the trunk: ``timm.create_model(architecture, num_classes=0, **model_args)``,
    or, where timm has no such network (``architecture`` None), ``hvp_lightning.nn.backbones``'s
    builder with ``builder_args``."""

    architecture: str | None
    model_args: dict[str, Any] = field(default_factory=dict)
    builder_args: dict[str, Any] = field(default_factory=dict)


def timm_target(backbone_cfg: BackboneSettings, trunk: Any) -> TimmTarget:
    """The timm architecture and arguments whose model has the trunk's keys, shapes and features.

    Width-64 ImageNet-stem ResNets are timm's ``resnet18``/``resnet50`` (timm keeps torchvision's
    key names); the ViT presets are ``vit_{tiny,small,base}_patch16_224`` with the arguments that
    differ from that default; ``backbone=timm`` trunks are their own name (a pretrained tag such
    as ``.fb_in1k`` dropped: it picks weights, not the network). ``dynamic_img_size`` is recorded
    where the trunk has it on, so a loaded ViT takes other image sizes as the run's did; a timm
    ViT's ``img_size`` always, even where it is the model's default: config.json's
    ``pretrained_cfg`` holds the run's crop size and no ``fixed_input_size``, so a ``local-dir:``
    load would otherwise build a 224 grid (``vit_*_384``, DINOv2's 518) and resample the weights."""
    family = backbone_family(backbone_cfg)
    args: dict[str, Any] = {}
    if family == TIMM_FAMILY:
        from ..nn.backbones import timm_is_vit

        architecture = str(backbone_cfg.name).split(".", 1)[0]
        if backbone_cfg.model_args is not None:
            args.update(backbone_cfg.model_args)
        if backbone_cfg.img_size is not None:  # the model took it (build_timm passes it to any)
            args["img_size"] = int(backbone_cfg.img_size)
        elif timm_is_vit(architecture):  # its default grid, which a loader would not take from our pretrained_cfg
            args["img_size"] = _side(trunk.patch_embed.img_size)
    elif family == "resnet":
        width, cifar = backbone_cfg.width, backbone_cfg.cifar_stem
        if width != 64 or cifar:
            builder = {"name": backbone_cfg.name, "width": width, "cifar_stem": cifar}
            return TimmTarget(None, builder_args=builder)
        architecture = str(backbone_cfg.name)
    else:
        architecture = f"{backbone_cfg.name}_patch16_224"
        given = {"img_size": backbone_cfg.img_size, "patch_size": backbone_cfg.patch_size}
        given["depth"] = backbone_cfg.depth or _VIT_DEFAULTS["depth"]  # null: the model's
        args.update({k: int(v) for k, v in given.items() if v != _VIT_DEFAULTS[k]})
    if getattr(trunk, "dynamic_img_size", False):
        args["dynamic_img_size"] = True
    return TimmTarget(architecture, args)


def _side(size: Any) -> int | list[int]:
    """A patch grid's image size as config.json spells it: one int where square."""
    h, w = (int(v) for v in size)
    return h if h == w else [h, w]


def pretrained_cfg(data_cfg: DataSettings, target: TimmTarget) -> dict[str, Any]:
    """timm's data config of the run's evaluation views (hvp_lightning/data/augment.py
    ``EvalTransform``: bilinear resize to ``crop_size / eval_crop_ratio``, centre crop, the
    data set's mean and std), so ``timm.data.resolve_data_config`` reproduces them.
    ``num_classes`` 0: the weights hold no classifier, and a loader asking for 0 then loads strictly."""
    size = int(data_cfg.crop_size)
    cfg: dict[str, Any] = {
        "input_size": [3, size, size],
        "interpolation": "bilinear",
        "crop_pct": float(data_cfg.eval_crop_ratio),
        "crop_mode": "center",
        "mean": [float(v) for v in data_cfg.mean],
        "std": [float(v) for v in data_cfg.std],
        "num_classes": 0,
    }
    if target.architecture is not None:
        import timm

        default = timm.models.get_pretrained_cfg(target.architecture)
        if default is not None:
            cfg["first_conv"], cfg["classifier"] = default.first_conv, default.classifier
            cfg["fixed_input_size"] = bool(default.fixed_input_size) and not target.model_args.get("dynamic_img_size")
    return cfg


def run_record(cfg: TrainConfig, ckpt: dict[str, Any], summary: dict[str, Any] | None, weights: str) -> dict[str, Any]:
    """The ``hvp`` block of config.json: how the weights were made. Counters come from the
    checkpoint (they belong to these weights); monitors and k-NN from ``summary.json`` when it
    describes the same step, else the checkpoint's last k-NN and no monitors."""
    state = ckpt.get("hvp_lightning") or {}
    step = int(ckpt.get("global_step", 0))
    position = (ckpt.get("SSLDataModule") or {}).get("train_position")
    same = summary is not None and summary.get("steps") == step
    record: dict[str, Any] = {
        "library": "hvp-lightning",
        "version": _version(),
        "method": str(cfg.method.name),
        "backbone": str(cfg.backbone.name),
        "weights": weights,
        "hvp_settings": cfg.hvp.model_dump() if cfg.hvp is not None else None,
        "data": {
            k: v
            for k, v in no_local_paths(cfg.data.model_dump()).items()
            if k not in ("num_workers", "on_device", "download")
        },
        "epochs": int(position[0]) if position else (summary or {}).get("epochs"),
        "images_seen": int(state["images_seen"]) if "images_seen" in state else (summary or {}).get("images_seen"),
        "global_step": step,
    }
    if position and position[1]:
        record["batches_into_next_epoch"] = int(position[1])
    record["knn"] = _knn(cfg, summary if same else None, state)
    record["monitors"] = _monitors(summary) if same else {}
    if same and summary.get("hvp"):  # type: ignore[union-attr]
        record["selection"] = summary["hvp"]  # type: ignore[index]
    record["train_config"] = no_local_paths(as_dict(cfg))
    return record


def no_local_paths(value: Any) -> Any:
    """``value`` (a config's plain containers) with every absolute local path (``/home/me/photos``,
    ``~/photos``) cut to its last part (``photos``): an export is handed on and pushed to the Hub,
    and a path on the machine that trained it names that machine's users and folders and opens
    nothing elsewhere. URLs (``s3://...``) and relative paths stay."""
    if isinstance(value, dict):
        return {k: no_local_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [no_local_paths(v) for v in value]
    if isinstance(value, str) and value.startswith(("/", "~")):
        return Path(value.rstrip("/")).name or value
    return value


def export_config(target: TimmTarget, num_features: int, data_cfg: DataSettings, record: dict) -> dict[str, Any]:
    """config.json: timm's hub fields, then ours (``hvp``; ``hvp_builder`` where timm has no
    architecture for the trunk)."""
    config: dict[str, Any] = {
        "architecture": target.architecture,
        "num_classes": 0,
        "num_features": int(num_features),
        "model_args": target.model_args,
        "pretrained_cfg": pretrained_cfg(data_cfg, target),
    }
    if target.architecture is None:
        config["hvp_builder"] = {"function": "hvp_lightning.nn.backbones.build_resnet", **target.builder_args}
    config["hvp"] = record
    return config


def create_model_line(target: TimmTarget, weights: str) -> str:
    """The ``timm.create_model`` call that loads ``weights`` (a model.safetensors path) strictly:
    ``num_classes=0`` in the overlay too, else timm sees 0 != the architecture's 1000 classes and
    loads with ``strict=False`` (it would resize a mismatched position embedding silently)."""
    args = "".join(f", {k}={v!r}" for k, v in target.model_args.items())
    return (
        f"timm.create_model({target.architecture!r}, pretrained=True, "
        f"pretrained_cfg_overlay=dict(file={weights!r}, num_classes=0), num_classes=0{args})"
    )


def builder_line(target: TimmTarget, weights: str) -> str:
    """The hvp_lightning call that rebuilds a trunk timm has no architecture for, and loads ``weights``."""
    b = target.builder_args
    return (
        f"hvp_lightning.nn.backbones.build_resnet({b['name']!r}, width={b['width']}, cifar_stem={b['cifar_stem']})"
        f".trunk.load_state_dict(safetensors.torch.load_file({weights!r}))"
    )


def no_timm_reason(target: TimmTarget) -> str:
    """Why timm cannot build this trunk (one clause)."""
    b = target.builder_args
    what = [f"width {b['width']}"] if b["width"] != 64 else []
    what += ["the CIFAR stem (3x3 conv, no max-pool)"] if b["cifar_stem"] else []
    return f"timm has no architecture for {b['name']} with {' and '.join(what)}"


def citation_bibtex() -> str:
    """BibTeX of CITATION.cff's preferred citation (the paper), or '' where the file is not shipped."""
    path = next((p / "CITATION.cff" for p in _CITATION_PLACES if (p / "CITATION.cff").is_file()), None)
    if path is None:
        return ""
    ref = yaml.safe_load(path.read_text(encoding="utf-8"))["preferred-citation"]
    authors = " and ".join(f"{a['family-names']}, {a['given-names']}" for a in ref["authors"])
    key = re.sub(r"\W", "", ref["authors"][0]["family-names"].lower()) + str(ref["year"])
    return (
        f"@inproceedings{{{key},\n  title     = {{{ref['title']}}},\n  author    = {{{authors}}},\n"
        f"  booktitle = {{{ref['collection-title']}}},\n  year      = {{{ref['year']}}}\n}}"
    )


def model_card(config: dict[str, Any], folder_name: str, license_id: str, repo_id: str | None = None) -> str:
    """README.md for the folder (and the hub page after ``--push``): Hugging Face front matter,
    then what it is, how it was made, its last monitors, how to load it, the citation."""
    rec, target = config["hvp"], TimmTarget(config["architecture"], config["model_args"])
    method, hvp = rec["method"], rec["hvp_settings"] or {}
    on = bool(hvp.get("enabled"))
    tags = ["timm", "image-feature-extraction", "self-supervised-learning", "hvp-lightning", method]
    tags += ["hard-view-pretraining"] if on else []
    front = yaml.safe_dump(
        {"library_name": "timm", "license": license_id, "pipeline_tag": "image-feature-extraction", "tags": tags},
        sort_keys=False,
    )
    arch = target.architecture or f"{rec['backbone']} (hvp_lightning)"
    size = "x".join(str(v) for v in config["pretrained_cfg"]["input_size"])
    data = rec["data"]
    lines = [
        f"---\n{front}---",
        f"# {arch}: {method}{' with hard views (HVP)' if on else ''}, pretrained with hvp-lightning",
        "",
        "## What it is",
        f"An image backbone ({arch}, {config['num_features']} features per image, evaluated at {size}) trained "
        f"self-supervised with {method} by hvp-lightning {rec['version'] or ''}. The weights are the trunk "
        f"of `{rec['weights']}` without a classifier: the model maps an image to its pooled features, "
        "the features the run's k-NN monitor evaluated.",
        "",
        "## How it was made",
        "| | |",
        "|---|---|",
        f"| method | {method} |",
        f"| HVP settings | {', '.join(f'`hvp.{k}={_yaml(v)}`' for k, v in hvp.items()) or 'none'} |",
        f"| data | {data.get('name')}"
        + (f" (`{where}`)" if (where := data.get("root") or data.get("urls")) else "")
        + " |",
        f"| crop, mean, std | {data.get('crop_size')} px, {data.get('mean')}, {data.get('std')} |",
        f"| epochs | {rec['epochs']}"
        + (f" (+{rec['batches_into_next_epoch']} batches)" if rec.get("batches_into_next_epoch") else "")
        + " |",
        f"| images seen | {rec['images_seen']} |",
        f"| optimiser steps | {rec['global_step']} |",
        "",
        "The whole training config is `hvp.train_config` in config.json.",
        "",
        "## Last monitors",
        *_monitor_rows(rec),
        "",
        "## How to load",
        "```python",
    ]
    if target.architecture is None:
        lines += [
            f"# {no_timm_reason(TimmTarget(None, builder_args=config['hvp_builder']))}:",
            "import safetensors.torch, hvp_lightning.nn.backbones",
            builder_line(TimmTarget(None, builder_args=config["hvp_builder"]), "model.safetensors"),
        ]
    else:
        lines += [
            "import timm",
            f'model = timm.create_model("local-dir:path/to/{folder_name}", pretrained=True)  # this folder',
        ]
        if repo_id:
            lines += [f'model = timm.create_model("hf-hub:{repo_id}", pretrained=True)  # from the Hugging Face Hub']
        lines += ["# or, naming the file:", f"model = {create_model_line(target, 'model.safetensors')}"]
        lines += [
            "config = timm.data.resolve_data_config({}, model=model)  # the run's evaluation views",
            "transform = timm.data.create_transform(**config)",
        ]
    lines += [
        "```",
        "",
        "Or as a plain state dict (the trunk's own key names):",
        "",
        "```python",
        "from safetensors.torch import load_file",
        'state = load_file("model.safetensors")',
        "```",
    ]
    cite = citation_bibtex()
    if cite:
        lines += ["", "## Citation", "", "```bibtex", cite, "```"]
    return "\n".join(lines) + "\n"


def _monitor_rows(rec: dict[str, Any]) -> list[str]:
    rows = [f"| k-NN {k} | {_fmt(v)} |" for k, v in rec["knn"].items()]
    rows += [f"| {k} | {_fmt(v)} |" for k, v in rec["monitors"].items()]
    if not rows:
        return ["None recorded for these weights (summary.json describes another step, or no monitor ran)."]
    return ["| | |", "|---|---|", *rows]


def _knn(cfg: TrainConfig, summary: dict[str, Any] | None, state: dict[str, Any]) -> dict[str, Any]:
    if summary is not None and summary.get("knn_top1") is not None:
        out = {k[4:]: summary[k] for k in ("knn_top1", "knn_top5", "knn_chance", "knn_queries") if k in summary}
        last = (summary.get("knn_history") or [{}])[-1]
        out.update({k: last[k] for k in ("epoch", "step") if k in last})
    else:
        out = dict(state.get("knn_result") or {})
    if out:
        out["k"] = cfg.eval.knn_k
    return out


def _monitors(summary: dict[str, Any]) -> dict[str, Any]:
    """summary.json's last value of every monitor, each once: numbers (k-NN and bookkeeping aside),
    flat dicts of numbers, and from the last entry of each ``*_history`` list what the flat keys
    do not hold (``monitor_history``'s last RankMe is ``monitor_rankme``)."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key in _NOT_MONITORS or key.startswith("knn_") or key == "hvp":
            continue
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value
        elif isinstance(value, dict) and value and all(isinstance(v, int | float | None) for v in value.values()):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        elif key.endswith("_history") and isinstance(value, list) and value and isinstance(value[-1], dict):
            prefix = key[: -len("_history")]  # the last pass: what summary.json has not given flat already
            last = {f"{prefix}_{k}": v for k, v in value[-1].items() if k not in _POSITION}
            out.update({k: v for k, v in last.items() if k not in summary})
    return out


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _yaml(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _version() -> str | None:
    try:
        return metadata.version("hvp-lightning")
    except metadata.PackageNotFoundError:
        return None
