"""The run's method, built from its validated config: the config's ``method`` section as the
method's typed settings, its ``hvp`` section as HVP's, its ``backbone`` section as the network
(:func:`build_backbone`) -- the application building a core object."""

from __future__ import annotations

from typing import Any

from ..data.augment import ViewAug
from ..data.datamodule import StaticColour, view_aug, view_augs
from ..errors import ConfigError
from ..methods import SSLMethod, method_class
from ..nn.backbones import Backbone, build_resnet, build_timm, build_vit
from ..schema import TIMM_FAMILY, backbone_family
from ..settings import HVP, HVP_OFF, MethodSettings, SettingError, method_settings


def plain(section: Any) -> dict[str, Any]:
    """A config section (a DictConfig node, a pydantic section, a dict) as plain values."""
    if section is None:
        return {}
    if hasattr(section, "model_dump"):
        return section.model_dump()
    if isinstance(section, dict):
        return dict(section)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(section, resolve=True)  # type: ignore[return-value]


def build_backbone(cfg) -> Backbone:
    """The backbone of a validated ``backbone`` config section (a built-in name with its family's
    keys, or ``backbone=timm``), randomly initialised. A timm model's refusal of a key is said
    with the key's place in the config (``backbone.img_size=...``)."""
    family = backbone_family(cfg)
    if family == TIMM_FAMILY:
        try:
            return build_timm(cfg.name, cfg.img_size, cfg.drop_path_rate, dict(cfg.model_args or {}), cfg.channels_last)
        except SettingError as err:
            raise ConfigError(str(err.at("backbone."))) from None
    if family == "resnet":
        return build_resnet(cfg.name, cfg.width, cfg.cifar_stem, cfg.channels_last, cfg.zero_init_residual)
    return build_vit(cfg.name, cfg.img_size, cfg.patch_size, cfg.drop_path_rate, cfg.depth)


def method_settings_of(cfg: Any) -> MethodSettings:
    """The typed settings of ``cfg``'s method (its ``method`` section but the name)."""
    values = plain(cfg.method)
    name = values.pop("name")
    return method_settings()[name].from_dict(values)


def hvp_of(cfg: Any) -> HVP | None:
    """HVP's settings of ``cfg`` (None: HVP off: no ``hvp`` section)."""
    node = cfg.get("hvp") if hasattr(cfg, "get") else getattr(cfg, "hvp", None)
    return None if node is None else HVP.from_dict(plain(node))


def run_view_augs(cfg: Any) -> tuple[ViewAug, ...]:
    """The augmentation of each view per image the config's method asks its loader for (its
    settings' :meth:`~hvp_lightning.settings.MethodSettings.views`, on the config's data)."""
    return view_augs(method_settings_of(cfg).views(hvp_of(cfg) or HVP_OFF), cfg.data)


def build_method(cfg: Any) -> SSLMethod:
    """The method of a validated training config, around its backbone (randomly initialised);
    with ``hvp.colour=static``, the data pipeline's colour step attached (its ``static_colour``)."""
    hvp = hvp_of(cfg)
    model = method_class(cfg.method.name)(
        build_backbone(cfg.backbone), method_settings_of(cfg), hvp=hvp, seed=int(cfg.seed)
    )
    if hvp is not None and hvp.enabled and hvp.colour == "static":
        model.static_colour = StaticColour(view_aug(cfg.data))
    return model
