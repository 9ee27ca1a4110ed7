"""Method registry: ``METHODS[name]`` is the LightningModule class for ``method.name``."""

from .base import SSLMethod
from .dino import DINO
from .ibot import IBOT
from .simclr import SimCLR
from .simsiam import SimSiam

METHODS: dict[str, type[SSLMethod]] = {"dino": DINO, "ibot": IBOT, "simsiam": SimSiam, "simclr": SimCLR}

__all__ = ["DINO", "IBOT", "METHODS", "SSLMethod", "SimCLR", "SimSiam"]
