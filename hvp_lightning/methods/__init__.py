"""Method registry: ``METHODS[name]`` is the LightningModule class for ``method.name``."""

from .base import SSLMethod
from .simsiam import SimSiam

METHODS: dict[str, type[SSLMethod]] = {"simsiam": SimSiam}

__all__ = ["METHODS", "SSLMethod", "SimSiam"]
