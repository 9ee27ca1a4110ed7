"""Backbones: any ``nn.Module`` mapping images ``[B, 3, H, W]`` to features ``[B, D]``, wrapped
as :class:`Backbone` (its feature width known, so heads are sized without a dummy forward), and
the built-in ones: torchvision's ResNets at any width, timm's ViTs, any timm model by name.

Nothing here downloads weights: a backbone is built randomly initialised (weights are loaded
into it afterwards). torchvision and timm are imported only when a ResNet or a timm model is built.
"""

from __future__ import annotations

import torch
from torch import nn

from ..settings import SettingError
from .onednn_guard import guard_onednn_avx2_1x1


class Backbone(nn.Module):
    """Wraps a trunk so every backbone has the same interface (``forward`` -> ``[B, D]``) and says
    what the methods need to know of it: its feature width, a ViT's patch size, and the smallest
    side its input may have (``min_side``: HVP's ``selection_scale`` shrinks views no further).

    Args:
        trunk: The network (a timm model built with ``num_classes=0``, a torchvision ResNet
            without its fc, any module giving ``[B, D]``).
        feature_dim: D.
        channels_last: Run the trunk in NHWC memory format (convolutions run faster).
        patch_size: A ViT's patch side (None: not a ViT).
        min_side: The smallest input side the trunk takes (None: a ViT's patch, else 32 px).
    """

    def __init__(
        self,
        trunk: nn.Module,
        feature_dim: int,
        channels_last: bool = False,
        patch_size: int | None = None,
        min_side: int | None = None,
    ) -> None:
        super().__init__()
        self.trunk = trunk
        self.feature_dim = feature_dim
        self.channels_last = channels_last
        self.patch_size = patch_size
        self.min_side = min_side or patch_size or 32
        if channels_last:
            self.trunk.to(memory_format=torch.channels_last)
            guard_onednn_avx2_1x1(self.trunk)  # narrow trunks would crash AVX2 CPUs (onednn_guard.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.trunk(x)


VITS: dict[str, dict[str, int]] = {
    "vit_tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small": dict(embed_dim=384, depth=12, num_heads=6),
    "vit_base": dict(embed_dim=768, depth=12, num_heads=12),
}


def build_resnet(
    name: str, width: int = 64, cifar_stem: bool = False, channels_last: bool = True, zero_init_residual: bool = False
) -> Backbone:
    """torchvision's ResNet ``name`` (resnet18, resnet34, resnet50) at base ``width`` (64: the standard
    network), with the CIFAR stem (3x3 stride-1, no max-pool) if asked; its fc dropped."""
    from .resnet import RESNETS, WidthResNet

    block, layers = RESNETS[name]
    trunk = WidthResNet(block, layers, width=width, cifar_stem=cifar_stem, zero_init_residual=zero_init_residual)
    feature_dim = round(512 * width / 64) * block.expansion  # type: ignore[attr-defined]
    return Backbone(trunk, feature_dim, channels_last=channels_last, min_side=8 if cifar_stem else 32)


def build_vit(
    name: str, img_size: int = 224, patch_size: int = 16, drop_path_rate: float = 0.0, depth: int | None = None
) -> Backbone:
    """timm's ViT-Tiny/Small/Base (``vit_tiny``, ``vit_small``, ``vit_base``), randomly initialised,
    any patch size; crops of other sizes interpolate the position embedding (multi-crop)."""
    import timm.models.vision_transformer as tvit

    spec = dict(VITS[name])
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


def has_vit_tokens(trunk: nn.Module) -> bool:
    """A timm ``VisionTransformer`` whose pooled feature is its class token: what
    :func:`vit_tokens` reads (iBOT's CLS and patch tokens, register tokens skipped)."""
    from timm.models.vision_transformer import VisionTransformer

    return isinstance(trunk, VisionTransformer) and trunk.cls_token is not None and trunk.global_pool == "token"


def timm_pooled_width(trunk: nn.Module) -> int:
    """Features per image of ``trunk(x)`` for a timm model built with ``num_classes=0``: its
    ``head_hidden_size``, not ``num_features``, where a head layer sits after the pooling
    (MobileNetV3/V4, GhostNet, HGNetV2, LCNet, FBNetV3: a 1x1 conv; ConvNeXt with a hidden head)."""
    return int(getattr(trunk, "head_hidden_size", None) or trunk.num_features)


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


def feature_width(module: nn.Module) -> int | None:
    """The features per image of ``module``'s output, where the module says so: a
    :class:`Backbone`'s ``feature_dim``, a timm model's pooled width (built with ``num_classes=0``),
    ``embed_dim``, or a torchvision ResNet whose fc was replaced (its last block's width); None else."""
    for name in ("feature_dim", "head_hidden_size", "num_features", "embed_dim"):
        value = getattr(module, name, None)
        if isinstance(value, int) and value > 0:
            return value
    fc = getattr(module, "fc", None)
    if fc is not None and not isinstance(fc, nn.Linear) and isinstance(getattr(module, "inplanes", None), int):
        return int(module.inplanes)  # torchvision's ResNet keeps its last stage's width there
    return None


def as_backbone(module: nn.Module | str, feature_dim: int | None = None) -> Backbone:
    """``module`` as a :class:`Backbone`: a :class:`Backbone` as it is, a timm model's name built
    randomly initialised (:func:`build_timm`), any other module wrapped with its feature width
    (``feature_dim``, or what :func:`feature_width` reads off it)."""
    if isinstance(module, Backbone):
        return module
    if isinstance(module, str):
        return build_timm(module)
    width = feature_dim or feature_width(module)
    if width is None:
        raise SettingError(
            "feature_dim",
            feature_dim,
            f"the width of {type(module).__name__}'s features ([B, D] per image): give feature_dim=D (it has no "
            "feature_dim, num_features or embed_dim attribute to read it from)",
        )
    patch = getattr(getattr(module, "patch_embed", None), "patch_size", None)
    patch_size = int(patch[0]) if isinstance(patch, (tuple, list)) else patch if isinstance(patch, int) else None
    return Backbone(module, int(width), patch_size=patch_size)


def check_timm_name(name: str) -> None:
    """A :class:`SettingError` (key ``name``) naming the closest names timm knows when ``name`` is
    not a timm model (a pretrained tag such as ``.dino`` is allowed: timm ignores it without weights)."""
    import difflib

    import timm

    if not timm.is_model(name):
        close = difflib.get_close_matches(name.split(".")[0], timm.list_models(), n=5, cutoff=0.6)
        hint = f"closest: {', '.join(close)}" if close else "see timm.list_models()"
        raise SettingError("name", name, f"not a timm model ({hint})")


def _create(name: str, kwargs: dict) -> nn.Module | None:
    """``timm.create_model(name, ...)``, or None where the model's constructor refuses a keyword."""
    import timm

    try:
        return timm.create_model(name, pretrained=False, num_classes=0, **kwargs)
    except TypeError:  # an unexpected keyword argument of the model class
        return None


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
    model (those built for one input size take it); stochastic depth is ``drop_path_rate`` (0 too:
    some models' own default is not 0), left out for a model without it when none was asked for.
    A keyword the model does not take raises :class:`SettingError` naming it."""
    check_timm_name(name)
    args = dict(model_args or {})
    kwargs: dict = {"drop_path_rate": drop_path_rate}
    vit = timm_is_vit(name)
    if vit:
        kwargs["dynamic_img_size"] = True
    if img_size is not None:
        kwargs["img_size"] = img_size
    kwargs.update(args)
    trunk = _create(name, kwargs)
    if trunk is None and not drop_path_rate and "drop_path_rate" not in args:  # e.g. GhostNet: no stochastic depth
        kwargs.pop("drop_path_rate")
        trunk = _create(name, kwargs)
    if trunk is None:
        for key, value, allowed in (("img_size", img_size, "null"), ("drop_path_rate", drop_path_rate, "0.0")):
            without = {k: v for k, v in kwargs.items() if k != key}
            if key in kwargs and key not in args and _create(name, without) is not None:
                raise SettingError(key, value, f"{allowed} for {name} (the model takes no {key})")
        raise SettingError("model_args", args, f"keywords of timm.create_model({name!r}) that the model takes")
    patch = trunk.patch_embed.patch_size[0] if vit and hasattr(trunk, "patch_embed") else None
    return Backbone(trunk, timm_pooled_width(trunk), channels_last=channels_last, patch_size=patch)
