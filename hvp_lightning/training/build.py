"""The run's method, built from its validated config: the config's ``method`` section as the
method's typed settings, its ``hvp`` section as HVP's, its ``backbone`` section as the network
(:func:`~hvp_lightning.training.backbones.build_backbone`) -- the application building a core object."""

from __future__ import annotations

from typing import Any

from ..methods import SSLMethod, method_class
from ..settings import HVP, MethodSettings, method_settings
from .backbones import build_backbone


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


def method_settings_of(cfg: Any) -> MethodSettings:
    """The typed settings of ``cfg``'s method (its ``method`` section but the name)."""
    values = plain(cfg.method)
    name = values.pop("name")
    return method_settings()[name].from_dict(values)


def hvp_of(cfg: Any) -> HVP | None:
    """HVP's settings of ``cfg`` (None: HVP off: no ``hvp`` section)."""
    node = cfg.get("hvp") if hasattr(cfg, "get") else getattr(cfg, "hvp", None)
    return None if node is None else HVP.from_dict(plain(node))


def build_method(cfg: Any) -> SSLMethod:
    """The method of a validated training config, around its backbone (randomly initialised)."""
    return method_class(cfg.method.name)(
        build_backbone(cfg.backbone), method_settings_of(cfg), hvp=hvp_of(cfg), seed=int(cfg.seed)
    )
