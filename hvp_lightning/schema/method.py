"""``method``: one section per method, told apart by ``method.name``, each made from the method's
settings in the library (:mod:`hvp_lightning.settings`, :func:`.core.section_of`): a key's type,
range, default (the paper's recipe) and doc are declared there, once. A method's presets
(conf/method/<preset>.yaml) set the values of a run's recipe."""

from __future__ import annotations

import functools
import operator
from typing import Annotated

from pydantic import Field

from ..settings import OPTIMIZERS, method_settings
from ..settings.dino import CLIP_GRAD_KINDS
from .core import section_of

METHOD_SCHEMAS = tuple(section_of(cls, name) for name, cls in method_settings().items())
METHOD_NAMES = tuple(method_settings())
MULTI_CROP = tuple(name for name, cls in method_settings().items() if cls.multi_crop)
MethodSection = Annotated[functools.reduce(operator.or_, METHOD_SCHEMAS), Field(discriminator="name")]

__all__ = ["CLIP_GRAD_KINDS", "METHOD_NAMES", "METHOD_SCHEMAS", "MULTI_CROP", "OPTIMIZERS", "MethodSection"]
