"""hvp-lightning: Hard View Pretraining (Ferreira et al., ICLR 2025) for PyTorch Lightning.

The public API, importable from the top level::

    from hvp_lightning import HardViewMixin, SimSiam, SimCLR, DINO, IBOT
    from hvp_lightning import simsiam_pair_table, choose, pair_index

Methods (LightningModules, equal to the original methods with HVP off): :class:`SimSiam`,
:class:`SimCLR`, :class:`DINO`, :class:`IBOT`, :class:`BYOL`, :class:`MoCoV3`, :class:`VICReg`,
:class:`BarlowTwins`. Selection:
:class:`HardViewMixin` (a host provides ``candidate_scores``, ``ssl_step`` and, for non-pair batches, ``select_views``;
the whole list: docs/methods.md), :class:`CandidateScores` (a table and what ``select_views`` needs of its pass),
:class:`HVPConfig`, :func:`choose`, :func:`pair_index`, :func:`global_pair_index`,
:func:`gather_pairs`, :func:`frozen_state`, :func:`dino_combination_table` (the multi-crop
search over a DINO cross-entropy table); all in :mod:`hvp_lightning.selection`. Per-sample
losses and candidate tables (pure functions of torch tensors, :mod:`hvp_lightning.losses`):
:func:`simsiam_loss`, :func:`simsiam_pair_table`, :func:`nt_xent_loss`,
:func:`simclr_pair_table`, :func:`dino_loss`, :func:`dino_ce_table`, :func:`ibot_loss`,
:func:`ibot_pair_table`, :func:`byol_loss`, :func:`byol_pair_table`, :func:`mocov3_loss`,
:func:`mocov3_pair_table`, :func:`vicreg_loss`, :func:`vicreg_pair_table`, :func:`barlow_twins_loss`,
:func:`barlow_twins_pair_table` (batch losses: leave-one-out tables, docs/DESIGN.md). Errors:
:class:`ConfigError`. See ``examples/custom_method.py`` for the mixin on your own module.

Names are imported on first use, so ``import hvp_lightning`` stays cheap (no torch import).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "SimSiam": "hvp_lightning.methods.simsiam",
    "SimCLR": "hvp_lightning.methods.simclr",
    "DINO": "hvp_lightning.methods.dino",
    "IBOT": "hvp_lightning.methods.ibot",
    "BYOL": "hvp_lightning.methods.byol",
    "MoCoV3": "hvp_lightning.methods.mocov3",
    "VICReg": "hvp_lightning.methods.vicreg",
    "BarlowTwins": "hvp_lightning.methods.barlow_twins",
    "SSLMethod": "hvp_lightning.methods.base",
    "METHODS": "hvp_lightning.methods",
    "HardViewMixin": "hvp_lightning.selection",
    "HVPConfig": "hvp_lightning.selection",
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

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # cache: later lookups skip this function
        return value
    raise AttributeError(f"module 'hvp_lightning' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
