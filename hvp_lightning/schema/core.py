"""Config sections made from the library's typed settings (:mod:`hvp_lightning.settings`): the
``hvp`` group from :class:`~hvp_lightning.settings.HVP`, each method's ``method`` section from its
settings class, the optimiser inside it -- so a key of these is declared once, in the library, and
the config takes it with the same type, range, default and doc.

:func:`section_of` turns a settings dataclass into a :class:`~.base.Section` (pydantic): each
field with its type (tuples as lists of their length, a range as its bounds), its default and its
doc, and an after-validator that builds the settings themselves, so their cross-key rules
(:meth:`~hvp_lightning.settings.Settings.rules`) run as the section's validator. :func:`to_settings`
turns a validated section back into the settings the code below the command line receives.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Annotated, Any, Literal, TypeVar

from pydantic import ConfigDict, Field, create_model, model_validator

from ..settings import Settings
from ..settings.declare import NO_BOUNDS, UNSET, Bounds, bounds_of, field_type, is_settings
from .base import Section, fixed_list

S = TypeVar("S", bound=Settings)


def _bounded(tp: type, bounds: Bounds) -> Any:
    kw = {k: v for k, v in dataclasses.asdict(bounds).items() if v is not None}
    return Annotated[tp, Field(**kw)] if kw else tp


def annotation(tp: Any, bounds: Bounds = NO_BOUNDS, ordered: bool = False) -> Any:
    """The pydantic annotation of a settings field's type."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = [annotation(m, bounds, ordered) for m in typing.get_args(tp)]
        return functools.reduce(lambda a, b: a | b, members[1:], members[0]) if len(members) > 1 else members[0]
    if tp in (int, float):
        return _bounded(tp, bounds)
    if origin is tuple:
        args = typing.get_args(tp)
        item = annotation(args[0], bounds)
        if len(args) == 2 and args[1] is Ellipsis:
            return list[item]  # type: ignore[valid-type]
        return fixed_list(item, len(args), ordered)
    if origin is dict or tp is dict:
        return dict[str, Any]
    if is_settings(tp):
        return section_of(tp)
    return tp  # bool, str, Literal, None


class _Generated(Section):
    """A section built from settings: its docs are the fields' descriptions, so pydantic need not
    look for attribute docstrings (a search of every loaded module per section)."""

    model_config = ConfigDict(use_attribute_docstrings=False)


def _default(value: Any) -> Any:
    if isinstance(value, Settings):
        return section_of(type(value)).model_validate(value.to_dict())
    if isinstance(value, tuple):
        return [_default(v) for v in value]
    return value


@functools.cache
def section_of(settings: type[Settings], name: str | None = None, node_values: tuple = ()) -> type[Section]:
    """The config section of ``settings`` (cached): its fields, plus ``name: Literal[name]`` for a
    method's section (the tag its group's presets set). ``node_values``: ``(key, value)`` pairs a
    Hydra node writes in place of a key's default (an interpolation: ``hvp.max_combinations``)."""
    fields: dict[str, Any] = {}
    if name is not None:
        fields["name"] = (Literal[name], name)
    compose = dict(node_values)
    for f in dataclasses.fields(settings):
        tp = field_type(settings, f.name)
        extra = {"compose": compose[f.name]} if f.name in compose else None
        required = f.default is UNSET or f.default is dataclasses.MISSING
        info = Field(
            ... if required else _default(f.default),
            description=f.metadata.get("doc") or None,
            json_schema_extra=extra,
        )
        fields[f.name] = (annotation(tp, bounds_of(f), bool(f.metadata.get("ordered"))), info)

    def core_rules(self: Section) -> Section:
        to_settings(self, settings, tagged=name is not None)  # the settings' own rules: a SettingError
        return self

    validators = {"core_rules": model_validator(mode="after")(core_rules)}
    model = create_model(  # type: ignore[call-overload]
        f"{settings.__name__}Section", __base__=_Generated, __validators__=validators, **fields
    )
    model.__doc__ = settings.__doc__
    return model


def to_settings(section: Section, settings: type[S], tagged: bool = True) -> S:
    """A validated section as the library's settings; ``tagged``: a method's section, whose
    ``name`` is its group's tag, not a key of the settings."""
    values = section.model_dump()
    if tagged:
        values.pop("name", None)
    return settings.from_dict(values)
