"""Every typed setting of the library, each declared once (:mod:`.declare`): HVP's (:class:`HVP`),
the optimisers' (:class:`Optimizer`) and each method's (``<method>.py``: its keys with the paper's
recipe as defaults, its views, its evaluation recipes).

The registry of methods is derived from this package: every module here that defines a
:class:`~.method.MethodSettings` subclass with a ``name`` is a method, and its LightningModule is
the class of the same module name in :mod:`hvp_lightning.methods` (:func:`hvp_lightning.methods.method_class`).
Torch-free: the command line validates a config against these declarations before it imports torch.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from .declare import UNSET, Bounds, SettingError, Settings, describe, setting
from .hvp import GLOBAL_PAIRS, HVP, HVP_COLOURS, HVP_OFF, LOSS_MODES, MODES, PRECISIONS, hvp_settings, selection_side
from .method import LinearRecipe, MethodSettings, ViewSpec
from .optim import OPTIMIZERS, BarlowTwinsOptimizer, CosineDecayOptimizer, Optimizer

SHARED = ("declare", "hvp", "method", "optim")  # the modules here that are no method's


@functools.cache
def method_settings() -> dict[str, type[MethodSettings]]:
    """``{method name: its settings class}``, in the modules' alphabetical order."""
    found: dict[str, type[MethodSettings]] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in SHARED:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, MethodSettings)
                and value.__module__ == module.__name__
                and "name" in vars(value)
            ):
                found[value.name] = value
    return found


def method_names() -> tuple[str, ...]:
    return tuple(method_settings())


def settings_module(name: str) -> str:
    """The module name (``simclr``) of method ``name``'s settings: its LightningModule's too."""
    return method_settings()[name].__module__.rsplit(".", 1)[1]


__all__ = [
    "GLOBAL_PAIRS",
    "HVP",
    "HVP_COLOURS",
    "HVP_OFF",
    "LOSS_MODES",
    "MODES",
    "OPTIMIZERS",
    "PRECISIONS",
    "SHARED",
    "UNSET",
    "BarlowTwinsOptimizer",
    "Bounds",
    "CosineDecayOptimizer",
    "LinearRecipe",
    "MethodSettings",
    "Optimizer",
    "SettingError",
    "Settings",
    "ViewSpec",
    "describe",
    "hvp_settings",
    "selection_side",
    "method_names",
    "method_settings",
    "setting",
    "settings_module",
]
