"""Typed settings, each declared once: a frozen dataclass per thing the library builds (HVP's
selection, an optimiser, each method), whose fields say their type, default, range and doc.

    @dataclass(frozen=True, kw_only=True)
    class Optimizer(Settings):
        base_lr: float = setting(0.05, "peak learning rate per 256 images", gt=0)

Constructing one checks every value against its declaration and the class's cross-key
:meth:`Settings.rules`; a bad value raises :class:`SettingError`, one line naming the key, the
value and what is allowed (``base_lr=0 is not allowed: a number > 0``). The application's config
schema is derived from these same declarations (:mod:`hvp_lightning.schema.core`), so a key's
type, range, default and doc are written here only. Torch-free, no dependency beyond Python.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, Union


class _Unset:
    """The default of a key without one: constructing the settings without it is an error."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclasses.dataclass(frozen=True)
class Bounds:
    """A number's range: ``ge``/``gt`` below, ``le``/``lt`` above (None: open-ended)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def holds(self, x: float) -> bool:
        return not (
            (self.ge is not None and x < self.ge)
            or (self.gt is not None and x <= self.gt)
            or (self.le is not None and x > self.le)
            or (self.lt is not None and x >= self.lt)
        )

    def text(self) -> str:
        """`` in (0, 1]``, `` >= 2``, `` < 1`` or '' (no bound): the words every message uses."""
        low = (self.ge, False) if self.ge is not None else (self.gt, True) if self.gt is not None else None
        high = (self.le, False) if self.le is not None else (self.lt, True) if self.lt is not None else None
        if low is not None and high is not None:
            return f" in {'(' if low[1] else '['}{_num(low[0])}, {_num(high[0])}{')' if high[1] else ']'}"
        if low is not None:
            return f" {'>' if low[1] else '>='} {_num(low[0])}"
        if high is not None:
            return f" {'<' if high[1] else '<='} {_num(high[0])}"
        return ""


NO_BOUNDS = Bounds()


def _num(x: float | None) -> str:
    x = float(x)  # type: ignore[arg-type]
    return str(int(x)) if x.is_integer() else str(x)


def setting(
    default: Any = UNSET,
    doc: str = "",
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    ordered: bool = False,
) -> Any:
    """A declared key of a :class:`Settings` dataclass: its default (none: it must be given), its
    one-line doc and its range (a number's, or each item's of a tuple); ``ordered``: a two-number
    tuple is a range ``[min, max]``."""
    meta = {"doc": doc, "bounds": Bounds(ge, gt, le, lt), "ordered": ordered}
    return dataclasses.field(default=default, metadata=meta)


class SettingError(ValueError):
    """A value its declaration does not allow: ``key=value is not allowed: allowed``.

    ``allowed`` may name other keys of the same settings as ``{name}``: they are written with the
    same prefix as ``key`` (:meth:`at` adds one: ``hvp.``, ``method.optimizer.``).

    Args:
        key: The key, relative to the settings that declare it.
        value: The value given.
        allowed: What is allowed, in words.
    """

    def __init__(self, key: str, value: Any, allowed: str, prefix: str = "") -> None:
        self.key, self.value, self.allowed, self.prefix = key, value, allowed, prefix
        super().__init__(str(self))

    def at(self, prefix: str) -> SettingError:
        """The same error where the settings sit at ``prefix`` (``"hvp."``) of a larger config."""
        return SettingError(self.key, self.value, self.allowed, prefix + self.prefix)

    @property
    def path(self) -> str:
        return self.prefix + self.key

    def __str__(self) -> str:
        allowed = re.sub(r"\{(\w+)\}", lambda m: self.prefix + m[1], self.allowed)
        if self.value is UNSET:
            return f"{self.path} is not set: {allowed}"
        return f"{self.path}={shown(self.value)!r} is not allowed: {allowed}"


def shown(value: Any) -> Any:
    """A value as a message shows it: tuples as lists, settings as their dicts."""
    if isinstance(value, Settings):
        return value.to_dict()
    if isinstance(value, tuple):
        return [shown(v) for v in value]
    return value


S = TypeVar("S", bound="Settings")
T = TypeVar("T", bound=type)


@typing.dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(dataclasses.field, setting))
def declared(cls: T) -> T:
    """Make ``cls`` (a :class:`Settings` subclass) a frozen, keyword-only dataclass whose docstring
    lists its keys (``Args:``), each with its doc and default, from their declarations."""
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    keys = "\n".join(
        f"    {f.name}: {f.metadata.get('doc') or describe_field(cls, f.name)}"
        + ("" if f.default is UNSET else f" (default: {shown(f.default)!r})")
        for f in dataclasses.fields(cls)
    )
    cls.__doc__ = f"{inspect.cleandoc(cls.__doc__ or '')}\n\nArgs:\n{keys}\n"
    return cls


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Base of the library's typed settings: keyword-only, immutable, checked when made.

    Every field is declared with :func:`setting`, the class made with :func:`declared`. Values
    are taken strictly (``"5"`` is not a number, ``1`` is not ``true``; an integer is a valid
    number and lists are taken for tuples), NaN and infinities are refused; a nested settings
    field takes an instance or a mapping.

    Args:
        **keys: The subclass's keys (its own ``Args:`` list them).
    """

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is UNSET:
                raise SettingError(f.name, UNSET, f"{describe_field(type(self), f.name)}; give {{{f.name}}}=...")
            object.__setattr__(self, f.name, convert(value, field_type(type(self), f.name), f, f.name))
        self.rules()

    def rules(self) -> None:
        """Rules that tie several keys together; raise :class:`SettingError`. None by default."""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls: type[S], data: Mapping[str, Any] | S | None) -> S:
        """Settings from a mapping (a checkpoint's hyperparameters, a config section): unknown
        keys are refused, nested settings are built from their mappings."""
        if data is None:
            return cls()
        if isinstance(data, cls):
            return data
        if not isinstance(data, Mapping):
            raise SettingError(cls.__name__, data, f"a mapping with keys {', '.join(cls.keys())}")
        unknown = [k for k in data if k not in cls.keys()]
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), cls.keys(), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            raise SettingError(
                str(unknown[0]), data[unknown[0]], f"not a key of {cls.__name__} ({hint}keys: {', '.join(cls.keys())})"
            )
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (tuples as lists, nested settings as dicts): what a checkpoint or a YAML file holds."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes`` (checked as at construction)."""
        return dataclasses.replace(self, **changes)


def _plain(value: Any) -> Any:
    if isinstance(value, Settings):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# --- types and their words ------------------------------------------------------------------------
@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_type(cls: type, name: str) -> Any:
    """The declared type of ``cls``'s field ``name`` (string annotations resolved)."""
    return _hints(cls)[name]


def field_info(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def bounds_of(f: dataclasses.Field | None) -> Bounds:
    return f.metadata.get("bounds", NO_BOUNDS) if f is not None else NO_BOUNDS


def describe_field(cls: type, name: str) -> str:
    f = field_info(cls, name)
    return describe(field_type(cls, name), bounds_of(f), bool(f.metadata.get("ordered")))


def _members(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _members(arg)]
    return [tp]


def is_settings(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Settings)


def describe(tp: Any, bounds: Bounds = NO_BOUNDS, ordered: bool = False) -> str:
    """What a declared type allows, in words: ``an integer >= 2``, ``a number in (0, 1]``, ``one of
    hard, easy``, ``two numbers [min, max], min <= max, each in (0, 1]``, ``... or null``."""
    members = _members(tp)
    if len(members) > 1:
        parts = [describe(m, bounds, ordered) for m in members if m is not type(None)]
        return " or ".join(parts) + (" or null" if type(None) in members else "")
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = [str(c) for c in typing.get_args(tp)]
        return choices[0] if len(choices) == 1 else f"one of {', '.join(choices)}"
    if tp is bool:
        return "true or false"
    if tp is int:
        return f"an integer{bounds.text()}"
    if tp is float:
        return f"a number{bounds.text()}"
    if tp is str:
        return "a string"
    if origin is tuple:
        args = typing.get_args(tp)
        item = describe(args[0], bounds)
        each = item.split(" ", 2)[2] if item.startswith(("a number ", "an integer ")) else ""
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list, each item {item}"
        if ordered and len(args) == 2:
            return f"two numbers [min, max], min <= max, each{' ' + each if each else ''}".rstrip()
        what = {2: "two numbers", 3: "three numbers (one per channel)"}.get(len(args), f"{len(args)} numbers")
        return f"{what}, each{' ' + each if each else ''}".rstrip(", each")
    if origin is dict or tp is dict:
        return "a mapping"
    if is_settings(tp):
        return f"a mapping with keys {', '.join(tp.keys())}"
    if tp is Any:
        return "any value"
    return getattr(tp, "__name__", str(tp))


class _Refused(Exception):
    """A value the type does not take (internal to :func:`convert`)."""


def convert(value: Any, tp: Any, f: dataclasses.Field | None = None, key: str = "") -> Any:
    """``value`` as declared type ``tp`` (lists to tuples, a mapping to nested settings), or a
    :class:`SettingError` naming ``key`` and saying what the declaration allows."""
    bounds, ordered = bounds_of(f), bool(f.metadata.get("ordered")) if f is not None else False
    try:
        return _convert(value, tp, bounds, ordered)
    except SettingError as err:  # a nested settings' own key
        raise err.at(f"{key}.") from None
    except _Refused:
        raise SettingError(key, value, describe(tp, bounds, ordered)) from None


def _convert(value: Any, tp: Any, bounds: Bounds, ordered: bool) -> Any:
    members = _members(tp)
    if len(members) > 1:
        if value is None and type(None) in members:
            return None
        for m in members:
            if m is type(None):
                continue
            try:
                return _convert(value, m, bounds, ordered)
            except _Refused:
                continue
        raise _Refused
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if any(value == c and type(value) is type(c) for c in typing.get_args(tp)):
            return value
        raise _Refused
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Refused
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool) and bounds.holds(value):
            return value
        raise _Refused
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            x = float(value)
            if math.isfinite(x) and bounds.holds(x):
                return x
        raise _Refused
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Refused
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Refused
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], bounds, False) for v in value)
        if len(value) != len(args):
            raise _Refused
        out = tuple(_convert(v, a, bounds, False) for v, a in zip(value, args))
        if ordered and out[0] > out[1]:
            raise _Refused
        return out
    if origin is dict or tp is dict:
        if isinstance(value, Mapping):
            return dict(value)
        raise _Refused
    if is_settings(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return tp.from_dict(value)
        raise _Refused
    raise TypeError(f"declare.convert: no rule for type {tp!r}")  # a declaration this module cannot check
