"""The methods: a thin LightningModule each (networks, forward, logging, HVP hooks) on the shared
base :mod:`.base`, and the registry ``METHODS[name]`` of the class for ``method.name``.

Imports ``selection/``, ``losses/``, ``nn/``, ``data/``, ``cluster/``, ``config`` and the leaves;
``analysis/``, ``training/`` and ``evaluation/`` build methods, nothing below does."""

from .barlow_twins import BarlowTwins
from .base import SSLMethod
from .byol import BYOL
from .dino import DINO
from .ibot import IBOT
from .mocov3 import MoCoV3
from .simclr import SimCLR
from .simsiam import SimSiam
from .vicreg import VICReg

METHODS: dict[str, type[SSLMethod]] = {
    "dino": DINO,
    "ibot": IBOT,
    "simsiam": SimSiam,
    "simclr": SimCLR,
    "byol": BYOL,
    "mocov3": MoCoV3,
    "vicreg": VICReg,
    "barlow_twins": BarlowTwins,
}

__all__ = ["BYOL", "DINO", "IBOT", "METHODS", "BarlowTwins", "MoCoV3", "SSLMethod", "SimCLR", "SimSiam", "VICReg"]
