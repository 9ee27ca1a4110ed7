"""The run's method, built from its validated config: the config's ``method`` section as the
method's typed settings, its ``hvp`` section as HVP's, its ``backbone`` section as the network
(:func:`build_backbone`) -- the application building a core object."""

from __future__ import annotations

from ..data.augment import ViewAug
from ..data.datamodule import StaticColour, view_aug, view_augs
from ..errors import ConfigError
from ..methods import SSLMethod, method_class
from ..nn.backbones import Backbone, build_resnet, build_timm, build_vit
from ..schema import TIMM_FAMILY, TrainConfig, backbone_family, to_settings
from ..schema.backbone import BackboneSettings
from ..settings import HVP, HVP_OFF, MethodSettings, SettingError, method_settings


def build_backbone(cfg: BackboneSettings) -> Backbone:
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


def method_settings_of(cfg: TrainConfig) -> MethodSettings:
    """The typed settings of ``cfg``'s method (its ``method`` section but the name)."""
    return to_settings(cfg.method, method_settings()[cfg.method.name])


def hvp_of(cfg: TrainConfig) -> HVP | None:
    """HVP's settings of ``cfg`` (None: HVP off: no ``hvp`` section)."""
    return None if cfg.hvp is None else to_settings(cfg.hvp, HVP, tagged=False)


def run_view_augs(cfg: TrainConfig) -> tuple[ViewAug, ...]:
    """The augmentation of each view per image the config's method asks its loader for (its
    settings' :meth:`~hvp_lightning.settings.MethodSettings.views`, on the config's data)."""
    return view_augs(method_settings_of(cfg).views(hvp_of(cfg) or HVP_OFF), cfg.data)


def build_method(cfg: TrainConfig) -> SSLMethod:
    """The method of a validated training config, around its backbone (randomly initialised);
    with ``hvp.colour=static``, the data pipeline's colour step attached (its ``static_colour``)."""
    hvp = hvp_of(cfg)
    model = method_class(cfg.method.name)(build_backbone(cfg.backbone), method_settings_of(cfg), hvp=hvp, seed=cfg.seed)
    if hvp is not None and hvp.enabled and hvp.colour == "static":
        model.static_colour = StaticColour(view_aug(cfg.data))
    return model
