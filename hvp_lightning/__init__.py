"""hvp-lightning: Hard View Pretraining (Ferreira et al., ICLR 2025) for PyTorch Lightning.

The library, importable from the top level::

    from hvp_lightning import HVP, SimCLR, DINO
    model = SimCLR(backbone, temperature=0.2, hvp=HVP(num_views=4))  # a LightningModule

Methods (LightningModules, equal to the original methods with HVP off, built from any backbone
and their typed settings): :class:`SimSiam`, :class:`SimCLR`, :class:`DINO`, :class:`IBOT`,
:class:`BYOL`, :class:`MoCoV3`, :class:`VICReg`, :class:`BarlowTwins`, each with its settings
class (:class:`SimCLRSettings`, ...: every key's type, range, default and doc). Settings:
:class:`HVP`, :class:`Optimizer`, :class:`ViewSpec` (what a method asks its loader for),
:class:`Settings` and :class:`SettingError`. Selection: :class:`HardViewMixin` (a host provides
``candidate_scores``, ``ssl_step`` and, for non-pair batches, ``select_views``; the whole list:
docs/methods.md), :class:`CandidateScores`, :func:`choose`, :func:`pair_index`,
:func:`global_pair_index`, :func:`gather_pairs`, :func:`frozen_state`,
:func:`dino_combination_table`. Per-sample losses and candidate tables (pure functions of torch
tensors, :mod:`hvp_lightning.losses`): :func:`simsiam_loss`, :func:`simsiam_pair_table`,
:func:`nt_xent_loss`, :func:`simclr_pair_table`, :func:`dino_loss`, :func:`dino_ce_table`,
:func:`ibot_loss`, :func:`ibot_pair_table`, :func:`byol_loss`, :func:`byol_pair_table`,
:func:`mocov3_loss`, :func:`mocov3_pair_table`, :func:`vicreg_loss`, :func:`vicreg_pair_table`,
:func:`barlow_twins_loss`, :func:`barlow_twins_pair_table`. See ``examples/`` for the library with
a plain ``lightning.Trainer``.

Names are imported on first use, so ``import hvp_lightning`` stays cheap (no torch import).
"""

from __future__ import annotations

import importlib
from typing import Any

from .settings import method_settings

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "SSLMethod": "hvp_lightning.methods.base",
    "METHODS": "hvp_lightning.methods",
    "method_class": "hvp_lightning.methods",
    "HVP": "hvp_lightning.settings",
    "HVPConfig": "hvp_lightning.selection",
    "Optimizer": "hvp_lightning.settings",
    "ViewSpec": "hvp_lightning.settings",
    "Settings": "hvp_lightning.settings",
    "SettingError": "hvp_lightning.settings",
    "Backbone": "hvp_lightning.nn.backbones",
    "HardViewMixin": "hvp_lightning.selection",
    "CandidateScores": "hvp_lightning.selection",
    "choose": "hvp_lightning.selection",
    "pair_index": "hvp_lightning.selection",
    "global_pair_index": "hvp_lightning.selection",
    "gather_pairs": "hvp_lightning.selection",
    "frozen_state": "hvp_lightning.selection",
    "simsiam_loss": "hvp_lightning.losses",
    "simsiam_pair_table": "hvp_lightning.losses",
    "nt_xent_loss": "hvp_lightning.losses",
    "simclr_pair_table": "hvp_lightning.losses",
    "dino_loss": "hvp_lightning.losses",
    "dino_ce_table": "hvp_lightning.losses",
    "dino_combination_table": "hvp_lightning.selection",
    "ibot_loss": "hvp_lightning.losses",
    "ibot_pair_table": "hvp_lightning.losses",
    "byol_loss": "hvp_lightning.losses",
    "byol_pair_table": "hvp_lightning.losses",
    "mocov3_loss": "hvp_lightning.losses",
    "mocov3_pair_table": "hvp_lightning.losses",
    "vicreg_loss": "hvp_lightning.losses",
    "vicreg_pair_table": "hvp_lightning.losses",
    "barlow_twins_loss": "hvp_lightning.losses",
    "barlow_twins_pair_table": "hvp_lightning.losses",
    "ConfigError": "hvp_lightning.errors",
}
# every method's LightningModule and settings class, by their names (SimCLR, SimCLRSettings): from
# the registry, which reads the torch-free settings only
_SETTINGS = {cls.__name__: cls for cls in method_settings().values()}
_METHODS = {name.removesuffix("Settings"): cls.name for name, cls in _SETTINGS.items()}

__all__ = ["__version__", *_EXPORTS, *_METHODS, *_SETTINGS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _SETTINGS:
        value = _SETTINGS[name]
    elif name in _METHODS:
        value = importlib.import_module("hvp_lightning.methods").method_class(_METHODS[name])
    else:
        raise AttributeError(f"module 'hvp_lightning' has no attribute {name!r}")
    globals()[name] = value  # cache: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
