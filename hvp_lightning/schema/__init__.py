"""Every config key, declared once: one typed schema per config group (pydantic models).

Where a key goes: a field of its group's section, with its type (range or choices), default
(none: every preset of the group sets it) and one-line doc (the docstring under it):

* :mod:`.run` -- ``train.py``'s top-level keys (``seed``, ``eval``, ``checkpoint``, ``limits``,
  ``analysis``), ``trainer``, ``logger``, and :class:`TrainConfig`, the whole config;
* :mod:`.method` -- ``method``, one section per method; :mod:`.backbone` -- ``backbone``;
  :mod:`.data` -- ``data``, ``data.aug``, ``data.iou_policy``; :mod:`.hvp` -- ``hvp``;
* :mod:`.evaluate` -- ``eval.py``'s and ``transfer.py``'s configs and the ``protocol`` group.

From these declarations come: the Hydra nodes presets extend (:mod:`.nodes`, registered on import,
so ``key=value`` works without ``+`` for every declared key), the one-line messages for a bad
value or an unknown key (:func:`.base.checked`), the ``--help`` listing (:func:`help_listing`) and
the typed config the code below the command line receives (:class:`TrainConfig`,
:class:`EvalConfig`, :class:`TransferConfig` and their sections: frozen; a value the run derives
is set by :meth:`.base.Section.with_values`, a changed copy). Rules that tie several keys together
are the validators of the section that holds them (a training config's over several groups:
:data:`.run.TRAIN_RULES`), each once; what needs the disk, the data or the machine is
:mod:`hvp_lightning.config`'s. Torch-free (pydantic, omegaconf, hydra).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from . import nodes
from .backbone import BACKBONE_FAMILIES, INIT_HUBS, TIMM_FAMILY, backbone_family, is_hub_init
from .base import MISSING, Section, checked, describe
from .core import section_of, to_settings
from .data import BLUR_KINDS, DATASETS, INTERPOLATIONS, AugSettings, DataConfig, IoUPolicySettings
from .evaluate import TRANSFER_DATASETS, TRANSFER_PROTOCOLS, EvalConfig, TransferConfig
from .hvp import GLOBAL_PAIRS, HVP, HVP_COLOURS, HVP_OFF, LOSS_MODES, MODES, PRECISIONS, HVPSection
from .listing import listing
from .method import CLIP_GRAD_KINDS, METHOD_NAMES, MULTI_CROP, OPTIMIZERS
from .run import (
    ACCELERATORS,
    AUTO_PRECISIONS,
    OWNED_TRAINER_KEYS,
    TRAINER_PRECISIONS,
    WANDB_MODES,
    LimitsSettings,
    TrainConfig,
)

nodes.register()


def config_dir() -> Path:
    """The Hydra config folder: shipped inside an installed wheel as ``hvp_lightning/conf``, else
    the repository's top-level ``conf/`` (one copy of the configs: pyproject.toml)."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "conf"
    return shipped if shipped.is_dir() else package.parent / "conf"


def compose(config_name: str = "config", overrides: list[str] | None = None) -> DictConfig:
    """A config composed as the command line composes it (``compose("config", ["method=dino",
    "+hvp=on"])``), for library use: validate it with :func:`train_settings` or
    :func:`hvp_lightning.config.check_options`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides or ()))


S = TypeVar("S", bound=Section)


def container(cfg: DictConfig | Section | Mapping[str, Any]) -> dict[str, Any]:
    """A config as plain Python values (interpolations resolved, ``???`` kept as the string)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)  # type: ignore[return-value]
    if isinstance(cfg, Section):
        return cfg.model_dump()
    return dict(cfg)


def settings(model: type[S], cfg: DictConfig | Mapping[str, Any], prefix: str = "") -> S:
    """``cfg`` validated as ``model``: typed settings, or a ConfigError with one line per bad key."""
    return checked(model, container(cfg), prefix)


def train_settings(cfg: DictConfig | Mapping[str, Any]) -> TrainConfig:
    """A whole training config, validated."""
    return settings(TrainConfig, cfg)


def hvp_config(cfg: DictConfig | Mapping[str, Any]) -> HVP:
    """The run's HVP settings (:class:`~hvp_lightning.settings.HVP`): ``cfg.hvp`` validated, or
    HVP off where the config has none."""
    node = cfg.get("hvp")
    return HVP_OFF if node is None else to_settings(settings(HVPSection, node, "hvp."), HVP, tagged=False)


def help_listing(command: str, root: Mapping[str, Any]) -> str:
    """``--help``'s key listing for ``command`` (train, eval, transfer), of the groups ``root`` (the
    composed config) chose."""
    model = {"train": TrainConfig, "eval": EvalConfig, "transfer": TransferConfig}[command]
    values = {k: v for k, v in root.items() if k != "hydra"}
    sections = [(f"{command} (run with key=value)", model, values, "")]
    if command == "train" and values.get("hvp") is None:
        sections.append(("hvp (with +hvp=on)", HVPSection, None, "hvp."))
    return listing(sections)


__all__ = [
    "ACCELERATORS",
    "AUTO_PRECISIONS",
    "BACKBONE_FAMILIES",
    "BLUR_KINDS",
    "CLIP_GRAD_KINDS",
    "DATASETS",
    "GLOBAL_PAIRS",
    "HVP_COLOURS",
    "HVP_OFF",
    "INIT_HUBS",
    "INTERPOLATIONS",
    "LOSS_MODES",
    "METHOD_NAMES",
    "MISSING",
    "MODES",
    "MULTI_CROP",
    "OPTIMIZERS",
    "OWNED_TRAINER_KEYS",
    "PRECISIONS",
    "TIMM_FAMILY",
    "TRAINER_PRECISIONS",
    "TRANSFER_DATASETS",
    "TRANSFER_PROTOCOLS",
    "WANDB_MODES",
    "AugSettings",
    "DataConfig",
    "EvalConfig",
    "HVP",
    "HVPSection",
    "IoUPolicySettings",
    "LimitsSettings",
    "Section",
    "TrainConfig",
    "TransferConfig",
    "backbone_family",
    "checked",
    "compose",
    "config_dir",
    "container",
    "describe",
    "help_listing",
    "hvp_config",
    "section_of",
    "to_settings",
    "is_hub_init",
    "settings",
    "train_settings",
]
