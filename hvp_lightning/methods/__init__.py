"""Method registry: ``METHODS[name]`` is the LightningModule class for ``method.name``."""

from .barlow_twins import BarlowTwins
from .base import SSLMethod
from .dino import DINO
from .ibot import IBOT
from .simclr import SimCLR
from .simsiam import SimSiam
from .vicreg import VICReg

METHODS: dict[str, type[SSLMethod]] = {"dino": DINO, "ibot": IBOT, "simsiam": SimSiam, "simclr": SimCLR,
                                       "vicreg": VICReg, "barlow_twins": BarlowTwins}

__all__ = ["DINO", "IBOT", "METHODS", "BarlowTwins", "SSLMethod", "SimCLR", "SimSiam", "VICReg"]
