"""Backbone registry: torchvision ResNets, timm ViTs and any timm model (``backbone=timm``).

Every builder returns a module mapping images ``[B, 3, H, W]`` to features ``[B, D]`` and
exposes ``feature_dim`` so heads can be sized without a dummy forward. Nothing here
downloads weights: a backbone is built randomly initialised, and ``backbone.init`` weights
are loaded into it afterwards (hvp_lightning/nn/weights.py), so tests run offline.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torchvision.models import resnet as tvr

from ..errors import ConfigError
from ..schema import BACKBONE_FAMILIES, TIMM_FAMILY, backbone_family
from .onednn_guard import guard_onednn_avx2_1x1


class Backbone(nn.Module):
    """Wraps a trunk so every backbone has the same interface (``forward`` -> ``[B, D]``)."""

    def __init__(
        self, trunk: nn.Module, feature_dim: int, channels_last: bool = False, patch_size: int | None = None
    ) -> None:
        super().__init__()
        self.trunk = trunk
        self.feature_dim = feature_dim
        self.channels_last = channels_last
        self.patch_size = patch_size
        if channels_last:
            self.trunk.to(memory_format=torch.channels_last)
            guard_onednn_avx2_1x1(self.trunk)  # narrow trunks would crash AVX2 CPUs (onednn_guard.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.trunk(x)


class _WidthResNet(tvr.ResNet):
    """torchvision ResNet with a base width other than 64 (narrow nets for CPU runs).

    Key names stay torchvision's (``conv1``, ``layer1.0.conv1`` ...), so a width-64 trunk's
    state_dict loads into ``torchvision.models.resnet18()`` unchanged.
    """

    def __init__(
        self, block: type[nn.Module], layers: list[int], width: int, cifar_stem: bool, zero_init_residual: bool = False
    ) -> None:
        self._scale = width / 64
        self._first_layer = True
        # zero_init_residual: each residual branch's last BatchNorm starts at gamma = 0 (every block
        # the identity at init; Goyal et al. 2017), as the SimCLR table of the HVP paper and the
        # official SimSiam code set it
        super().__init__(block, layers, zero_init_residual=zero_init_residual)  # type: ignore[arg-type]
        if cifar_stem:
            # CIFAR variant (SimCLR/SimSiam papers): 3x3 stride-1 stem, no max-pool.
            self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        elif width != 64:
            self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        if width != 64:
            self.bn1 = nn.BatchNorm2d(width)
        nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.fc = nn.Identity()

    def _make_layer(self, block, planes, blocks, stride=1, dilate=False):  # type: ignore[override]
        if self._first_layer:
            self.inplanes = max(1, round(64 * self._scale))
            self._first_layer = False
        return super()._make_layer(block, max(1, round(planes * self._scale)), blocks, stride, dilate)


_RESNETS: dict[str, tuple[type[nn.Module], list[int]]] = {
    "resnet18": (tvr.BasicBlock, [2, 2, 2, 2]),
    "resnet34": (tvr.BasicBlock, [3, 4, 6, 3]),
    "resnet50": (tvr.Bottleneck, [3, 4, 6, 3]),
}

_VITS: dict[str, dict[str, int]] = {
    "vit_tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small": dict(embed_dim=384, depth=12, num_heads=6),
    "vit_base": dict(embed_dim=768, depth=12, num_heads=12),
}


def build_resnet(
    name: str, width: int = 64, cifar_stem: bool = False, channels_last: bool = True, zero_init_residual: bool = False
) -> Backbone:
    block, layers = _RESNETS[name]
    trunk = _WidthResNet(block, layers, width=width, cifar_stem=cifar_stem, zero_init_residual=zero_init_residual)
    feature_dim = round(512 * width / 64) * block.expansion  # type: ignore[attr-defined]
    return Backbone(trunk, feature_dim, channels_last=channels_last)


def build_vit(
    name: str, img_size: int = 224, patch_size: int = 16, drop_path_rate: float = 0.0, depth: int | None = None
) -> Backbone:
    import timm.models.vision_transformer as tvit

    spec = dict(_VITS[name])
    if depth is not None:
        spec["depth"] = depth
    trunk = tvit.VisionTransformer(
        img_size=img_size,
        patch_size=patch_size,
        num_classes=0,
        drop_path_rate=drop_path_rate,
        dynamic_img_size=True,  # multi-crop: local crops interpolate the position embedding
        **spec,
    )
    return Backbone(trunk, spec["embed_dim"], patch_size=patch_size)


# timm modules whose models take ``img_size`` and ``dynamic_img_size`` (patch tokens and a
# position embedding that timm interpolates to each crop's grid, so multi-crop local views work)
TIMM_VIT_MODULES = ("vision_transformer", "deit", "eva")


def timm_is_vit(name: str) -> bool:
    """True for a timm ViT (patch tokens, any crop size that is a multiple of its patch)."""
    from timm.models import is_model_in_modules

    return is_model_in_modules(name, TIMM_VIT_MODULES)


def check_timm_name(name: str) -> None:
    """A :class:`ConfigError` naming the closest names timm knows when ``name`` is not a timm
    model (a pretrained tag such as ``.dino`` is allowed: timm ignores it without weights)."""
    import difflib

    import timm

    if not timm.is_model(name):
        close = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=5, cutoff=0.6)
        hint = f"closest: {', '.join(close)}" if close else "see timm.list_models()"
        raise ConfigError(f"backbone.name={name!r} is not allowed: not a timm model ({hint})")


@dataclass(frozen=True)
class TimmLayout:
    """What start-up checks need to know of a timm model (:func:`timm_layout`)."""

    kind: str  # the model class, e.g. "VisionTransformer", "ConvNeXt"
    patch_size: int | None  # a ViT's patch side; None: not a ViT
    img_size: int | None  # a ViT's position-embedding grid in pixels
    tokens: bool  # a VisionTransformer with a class token read by :func:`vit_tokens` (iBOT)
    default_size: int  # the side of timm's default input (its pretrained_cfg)


def meta_timm(cfg, img_size: int | None = None, model_args: dict | None = None) -> Backbone:
    """The ``backbone=timm`` model of ``cfg`` built on the meta device (no memory, no random
    init); ``img_size`` / ``model_args`` replace ``cfg``'s where given."""
    args = dict(cfg.get("model_args") or {}) if model_args is None else model_args
    with torch.device("meta"):
        return build_timm(cfg.name, img_size or cfg.get("img_size"), 0.0, args)


def timm_layout(cfg) -> TimmLayout:
    """The model of ``cfg`` built on the meta device, read for its patch size and whether iBOT
    can use its tokens."""
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


def timm_size_fix(cfg, sizes: list[int]) -> str | None:
    """The setting with which the model of ``cfg`` takes every crop size, tried on the meta
    device: ``backbone.img_size`` (models built for one input size, where all crops have one
    size), else ``dynamic_img_size`` (Swin, ViTs); None where neither does."""
    args = dict(cfg.get("model_args") or {})
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


def has_vit_tokens(trunk: nn.Module) -> bool:
    """A timm ``VisionTransformer`` whose pooled feature is its class token: what
    :func:`vit_tokens` reads (iBOT's CLS and patch tokens, register tokens skipped)."""
    from timm.models.vision_transformer import VisionTransformer

    return isinstance(trunk, VisionTransformer) and trunk.cls_token is not None and trunk.global_pool == "token"


def build_timm(
    name: str,
    img_size: int | None = None,
    drop_path_rate: float = 0.0,
    model_args: dict | None = None,
    channels_last: bool = False,
) -> Backbone:
    """``timm.create_model(name, pretrained=False, num_classes=0, ...)`` wrapped as a :class:`Backbone`:
    the trunk's state_dict keys are timm's own (so timm loads an export as is) and ``trunk(x)``
    is timm's pooled feature. ViTs get ``dynamic_img_size`` (multi-crop); ``img_size`` goes to any
    model (those built for one input size take it)."""
    import timm

    check_timm_name(name)
    kwargs: dict = {"drop_path_rate": drop_path_rate}  # 0 too: some models' own default is not 0
    vit = timm_is_vit(name)
    if vit:
        kwargs["dynamic_img_size"] = True
    if img_size is not None:
        kwargs["img_size"] = img_size
    kwargs.update(model_args or {})
    try:
        try:
            trunk = timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
        except TypeError as err:  # GhostNet, RepGhostNet: no stochastic depth; asked for none, built without
            if "'drop_path_rate'" not in str(err) or drop_path_rate or "drop_path_rate" in (model_args or {}):
                raise
            kwargs.pop("drop_path_rate")
            trunk = timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
    except TypeError as err:  # a keyword the model does not take
        if "'img_size'" in str(err) and "img_size" not in (model_args or {}):
            raise ConfigError(f"backbone.img_size={img_size!r} is not allowed: null for {name}: {err}") from err
        if "'drop_path_rate'" in str(err) and "drop_path_rate" not in (model_args or {}):
            raise ConfigError(
                f"backbone.drop_path_rate={drop_path_rate!r} is not allowed: 0.0 for {name}: {err}"
            ) from err
        raise ConfigError(f"backbone.model_args={model_args!r} is not allowed for {name}: {err}") from err
    patch = trunk.patch_embed.patch_size[0] if vit and hasattr(trunk, "patch_embed") else None
    return Backbone(trunk, timm_pooled_width(trunk), channels_last=channels_last, patch_size=patch)


def timm_pooled_width(trunk: nn.Module) -> int:
    """Features per image of ``trunk(x)`` for a timm model built with ``num_classes=0``: its
    ``head_hidden_size``, not ``num_features``, where a head layer sits after the pooling
    (MobileNetV3/V4, GhostNet, HGNetV2, LCNet, FBNetV3: a 1x1 conv; ConvNeXt with a hidden head)."""
    return int(getattr(trunk, "head_hidden_size", None) or trunk.num_features)


@dataclass(frozen=True)
class BackboneSpec:
    family: str
    builder: Callable[..., Backbone]


_BUILDERS: dict[str, Callable[..., Backbone]] = {"resnet": build_resnet, "vit": build_vit}
# Names and families: hvp_lightning/schema/backbone.py (checked before torch is imported).
BACKBONES: dict[str, BackboneSpec] = {n: BackboneSpec(f, _BUILDERS[f]) for n, f in BACKBONE_FAMILIES.items()}


def build_backbone(cfg) -> Backbone:
    """Build from a ``backbone`` config group node (name + family-specific keys)."""
    name = cfg.name
    if backbone_family(cfg) == TIMM_FAMILY:
        return build_timm(
            name,
            img_size=cfg.get("img_size"),
            drop_path_rate=cfg.get("drop_path_rate", 0.0),
            model_args=dict(cfg.get("model_args") or {}),
            channels_last=bool(cfg.get("channels_last", False)),
        )
    if name not in BACKBONES:
        raise KeyError(name)
    spec = BACKBONES[name]
    if spec.family == "resnet":
        return build_resnet(
            name,
            width=cfg.width,
            cifar_stem=cfg.cifar_stem,
            channels_last=cfg.channels_last,
            zero_init_residual=cfg.get("zero_init_residual", False),  # absent in runs started before the key
        )
    return build_vit(
        name,
        img_size=cfg.img_size,
        patch_size=cfg.patch_size,
        drop_path_rate=cfg.drop_path_rate,
        depth=cfg.get("depth"),
    )


def vit_tokens(
    backbone: nn.Module, images: torch.Tensor, mask: torch.Tensor | None = None, mask_token: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """CLS ``[B, D]`` and patch tokens ``[B, N, D]`` of a timm ViT (or a :class:`Backbone`
    wrapping one), after the final norm: timm's ``forward_features`` with masked image
    modelling. ``mask`` (bool ``[B, h, w]`` on the patch grid) replaces the masked patch
    embeddings by ``mask_token`` before the position embedding is added (iBOT's
    ``mask_model``), so a masked patch keeps its position but loses its content. Without a
    mask, the CLS output equals the backbone's ordinary forward."""
    vit = getattr(backbone, "trunk", backbone)
    x = vit.patch_embed(images)  # [B, h, w, D] with dynamic_img_size, else [B, N, D]
    if mask is not None:
        if mask_token is None:
            raise ValueError("a mask needs a mask_token")
        grid = x.shape[1:3] if x.ndim == 4 else (x.shape[1],)
        m = mask if x.ndim == 4 else mask.flatten(1)
        if tuple(m.shape[1:]) != tuple(grid):
            raise ValueError(f"mask grid {tuple(mask.shape[1:])} does not match the patch grid {tuple(grid)}")
        x = torch.where(m[..., None], mask_token.to(x.dtype), x)
    x = vit.norm_pre(vit.patch_drop(vit._pos_embed(x)))
    x = vit.norm(vit.blocks(x))
    return x[:, 0], x[:, vit.num_prefix_tokens :]
