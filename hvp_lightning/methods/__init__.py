"""Method registry: ``METHODS[name]`` is the LightningModule class for ``method.name``."""

from .base import SSLMethod
from .dino import DINO
from .simclr import SimCLR
from .simsiam import SimSiam

METHODS: dict[str, type[SSLMethod]] = {"dino": DINO, "simsiam": SimSiam, "simclr": SimCLR}

__all__ = ["DINO", "METHODS", "SSLMethod", "SimCLR", "SimSiam"]
