"""``backbone``: the network, by family -- the built-in ResNets and ViTs, or any timm model
(``backbone=timm``, told apart by its ``model_args`` key, since timm's names overlap ours)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from ..errors import fail
from .base import COUNT, Section, integer, number

# backbone.name -> family (hvp_lightning/nn/backbones.py builds them)
BACKBONE_FAMILIES = {
    "resnet18": "resnet",
    "resnet34": "resnet",
    "resnet50": "resnet",
    "vit_tiny": "vit",
    "vit_small": "vit",
    "vit_base": "vit",
}
TIMM_FAMILY = "timm"
# backbone.init=<scheme>:<name> fetches released weights from a hub (hvp_lightning/training/weights.py)
INIT_HUBS = ("timm", "torchvision")
INIT_ALLOWED = "null, a weights file (.pth, .pt, .safetensors), an hvp-export folder, a run dir, " + " or ".join(
    f"{hub}:<name>" for hub in INIT_HUBS
)


class BackboneBase(Section):
    """Where a backbone's weights start."""

    init: str | None = None
    """weights to start from: a file (.pth, .pt, .safetensors), an hvp-export folder, a run dir, timm:<name> or torchvision:<name>; null: random init (docs/backbones.md)"""
    init_student: bool = False
    """DINO/iBOT checkpoints as init: load the student, not the teacher"""

    @model_validator(mode="after")
    def init_form(self) -> BackboneBase:
        """``backbone.init``: null, ``timm:<name>`` / ``torchvision:<name>``, or a path (that the path
        exists, and that a hub can be reached, is start-up's to check: hvp_lightning/config.py)."""
        init = self.init
        if init is None:
            return self
        if not init:
            fail("backbone.init", init, INIT_ALLOWED)
        if is_hub_init(init) and not init.partition(":")[2]:
            fail("backbone.init", init, f"{init.partition(':')[0]}:<model name>")
        return self


class ResNetSettings(BackboneBase):
    """torchvision's ResNets, with an optional CIFAR stem and any base width."""

    name: Literal["resnet18", "resnet34", "resnet50"]
    width: COUNT
    """base width (64: the standard network; 16 has ~16x fewer FLOPs)"""
    cifar_stem: bool
    """3x3 stem without max-pool, for 32 px images (else the ImageNet 7x7 conv + max-pool)"""
    zero_init_residual: bool
    """each residual branch's last BatchNorm starts at 0 (SimCLR, SimSiam ImageNet)"""
    channels_last: bool
    """NHWC memory format (faster on CPU and GPU for convolutions)"""


class ViTSettings(BackboneBase):
    """timm's ViT-Tiny/Small/Base, random init, any patch size."""

    name: Literal["vit_tiny", "vit_small", "vit_base"]
    img_size: integer(1) | None
    """the position-embedding grid in px (other crop sizes interpolate it)"""
    patch_size: COUNT
    """patch side in px (crop sizes are multiples of it)"""
    drop_path_rate: number(0, 1, open_high=True)
    """stochastic depth rate"""
    depth: integer(1) | None = None
    """transformer blocks (null: the model's 12; fewer for a quick trial)"""


class TimmSettings(BackboneBase):
    """Any timm model by name (``backbone=timm backbone.name=<name>``)."""

    name: str
    """a timm model name, e.g. resnet50, convnext_tiny, vit_small_patch16_224"""
    img_size: integer(1) | None = None
    """models built for one input size (ViTs' grid, Swin, LeViT): that size (null: the model's default)"""
    drop_path_rate: number(0, 1, open_high=True) = 0.0
    """stochastic depth, for the models that have it"""
    model_args: dict[str, Any] | None = None
    """further timm.create_model keywords, e.g. backbone.model_args={depth: 6} (null: none)"""
    channels_last: bool = False
    """NHWC memory format (faster for CNNs on some hardware)"""


def backbone_family(backbone: Any) -> str:
    """``resnet``, ``vit`` or ``timm`` of a backbone config (a mapping or settings): ``backbone=timm``'s
    is told apart by its ``model_args`` key, as timm names overlap the presets' (``resnet18`` is both);
    an unknown built-in name comes back as is (the schema then refuses it, naming the choices)."""
    if isinstance(backbone, Section):
        return TIMM_FAMILY if isinstance(backbone, TimmSettings) else BACKBONE_FAMILIES[backbone.name]
    if "model_args" in backbone:
        return TIMM_FAMILY
    name = backbone.get("name")
    return BACKBONE_FAMILIES.get(name, str(name))


BackboneSettings = Annotated[
    Annotated[ResNetSettings, Tag("resnet")]
    | Annotated[ViTSettings, Tag("vit")]
    | Annotated[TimmSettings, Tag("timm")],
    Discriminator(backbone_family),
    Field(json_schema_extra={"tags": f"one of {', '.join(BACKBONE_FAMILIES)} (any timm model: backbone=timm)"}),
]


def is_hub_init(source: str) -> bool:
    """``timm:<name>`` or ``torchvision:<name>`` (a hub), not a path."""
    scheme, sep, _ = source.partition(":")
    return bool(sep) and scheme in INIT_HUBS
