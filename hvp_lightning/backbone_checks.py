"""What start-up validation learns of a ``backbone=timm`` model by building it on the meta device
(no memory, no initialisation, no compute): its patch size, the crop sizes it takes, its pooled
output. torch and timm are imported by the functions here, when a timm backbone is checked."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import ConfigError
from .settings import SettingError

if TYPE_CHECKING:
    from .nn.backbones import Backbone
    from .schema.backbone import TimmSettings


@dataclass(frozen=True)
class TimmLayout:
    """What start-up checks need to know of a timm model (:func:`timm_layout`)."""

    kind: str  # the model class, e.g. "VisionTransformer", "ConvNeXt"
    patch_size: int | None  # a ViT's patch side; None: not a ViT
    img_size: int | None  # a ViT's position-embedding grid in pixels
    tokens: bool  # a VisionTransformer with a class token read by :func:`vit_tokens` (iBOT)
    default_size: int  # the side of timm's default input (its pretrained_cfg)


def meta_timm(cfg: TimmSettings, img_size: int | None = None, model_args: dict | None = None) -> Backbone:
    """The ``backbone=timm`` model of ``cfg`` built on the meta device (no memory, no random
    init); ``img_size`` / ``model_args`` replace ``cfg``'s where given."""
    import torch

    from .nn.backbones import build_timm

    args = dict(cfg.model_args or {}) if model_args is None else model_args
    try:
        with torch.device("meta"):
            return build_timm(cfg.name, img_size or cfg.img_size, 0.0, args)
    except SettingError as err:
        raise ConfigError(str(err.at("backbone."))) from None


def timm_layout(cfg: TimmSettings) -> TimmLayout:
    """The model of ``cfg`` built on the meta device, read for its patch size and whether iBOT
    can use its tokens."""
    from .nn.backbones import has_vit_tokens, timm_is_vit

    trunk = meta_timm(cfg).trunk
    embed = getattr(trunk, "patch_embed", None)
    return TimmLayout(
        kind=type(trunk).__name__,
        patch_size=int(embed.patch_size[0]) if timm_is_vit(cfg.name) and embed is not None else None,
        img_size=int(embed.img_size[0]) if embed is not None and embed.img_size is not None else None,
        tokens=has_vit_tokens(trunk),
        default_size=int(trunk.pretrained_cfg.get("input_size", (3, 224, 224))[-1]),
    )


def meta_output_shape(backbone: Backbone, size: int) -> tuple[int, ...]:
    """The shape of ``backbone``'s output for two ``size`` px images, run on the meta device
    (no compute); the model's own error where it cannot take them (a fixed input size, too
    small an image for its kernels)."""
    import torch

    return tuple(backbone(torch.empty(2, 3, size, size, device="meta")).shape)


def runs_on_meta(backbone: Backbone, size: int) -> bool:
    """Whether ``backbone`` runs on the meta device at its own default input ``size``: a model
    whose forward needs real values (a data-dependent branch) fails there at any size, and its
    failure at the run's crops says nothing about them."""
    try:
        meta_output_shape(backbone, size)
    except Exception:  # noqa: BLE001 -- any failure: the meta device cannot judge this model
        return False
    return True


def timm_size_fix(cfg: TimmSettings, sizes: list[int]) -> str | None:
    """The setting with which the model of ``cfg`` takes every crop size, tried on the meta
    device: ``backbone.img_size`` (models built for one input size, where all crops have one
    size), else ``dynamic_img_size`` (Swin, ViTs); None where neither does."""
    args = dict(cfg.model_args or {})
    dynamic = {**args, "dynamic_img_size": True}
    spelled = ", ".join(f"{k}: {json.dumps(v)}" for k, v in dynamic.items())
    tries = [(f"backbone.img_size={sizes[0]}", sizes[0], args)] if len(set(sizes)) == 1 else []
    tries.append((f"'backbone.model_args={{{spelled}}}'", None, dynamic))
    for hint, img_size, model_args in tries:
        try:
            backbone = meta_timm(cfg, img_size, model_args)
            for size in sizes:
                meta_output_shape(backbone, size)
        except Exception:  # whatever the model's own code raises: this setting does not mend it
            continue
        return hint
    return None
