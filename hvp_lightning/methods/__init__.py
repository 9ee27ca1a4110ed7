"""The methods: a thin LightningModule each (networks, step, HVP's candidate scores) on the shared
base :mod:`.base`, each in its own module here, named as its settings' module in
:mod:`hvp_lightning.settings`.

The registry is derived, not written: :func:`method_class` finds the class of a method name,
:func:`methods` all of them. Imports ``selection/``, ``losses/``, ``nn/`` and ``settings/``: the
library's core, nothing of the application (data, runs, configs).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from ..settings import method_settings, settings_module
from .base import SSLMethod


@functools.cache
def method_class(name: str) -> type[SSLMethod]:
    """The LightningModule of method ``name`` (``simclr`` -> :class:`~.simclr.SimCLR`): the class
    in the module of the same name as its settings' whose ``settings_type`` they are."""
    settings = method_settings()[name]
    module = importlib.import_module(f"{__name__}.{settings_module(name)}")
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, SSLMethod) and value.__dict__.get("settings_type") is settings:
            return value
    raise LookupError(f"hvp_lightning.methods.{settings_module(name)} has no method class for {settings.__name__}")


def methods() -> dict[str, type[SSLMethod]]:
    """``{name: class}`` of every method."""
    return {name: method_class(name) for name in method_settings()}


def __getattr__(name: str) -> Any:
    """A method's class by its class name (``from hvp_lightning.methods import SimCLR``), and ``METHODS``."""
    if name == "METHODS":
        return methods()
    found = {cls.__name__: cls for cls in methods().values()}
    if name in found:
        return found[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SSLMethod", "method_class", "methods"]
