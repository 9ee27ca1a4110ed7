"""What every config group's schema is made of, and the messages derived from it.

A key is declared once, as a field of a :class:`Section`: its type (and with it its range or
choices, as ``Annotated`` constraints or a ``Literal``), its default (none: a preset must set it)
and its one-line doc (the docstring under the field). Everything else is derived from that
declaration: the Hydra node a preset extends (:mod:`.nodes`), the ``--help`` listing (:mod:`.listing`)
and the one-line message for a bad value or an unknown key (:func:`checked`), which says the key,
the value, what is allowed and, for a typo, the closest key.

Torch-free, like the rest of the package :mod:`hvp_lightning.schema`.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Annotated, Any, Literal, TypeVar, Union

import annotated_types as at
from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, ValidationError
from pydantic.fields import FieldInfo

from ..errors import ConfigError
from ..settings import Bounds, SettingError

MISSING = "???"  # OmegaConf's mark for a key a preset must set


class Section(BaseModel):
    """One config group (or a nested part of one): its keys are the fields. Unknown keys are
    refused, values are checked strictly (``"5"`` is not a number, ``1`` is not ``true``; an
    integer is a valid number), NaN and infinities are refused."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        frozen=True,
        use_attribute_docstrings=True,
        validate_default=True,
    )

    def with_values(self: SectionT, values: Mapping[str, Any]) -> SectionT:
        """A copy with the dotted keys of ``values`` changed (``{"data.num_classes": 10}``): a
        section is frozen, so a value the run derives (a resolved ``auto``, the classes its data
        holds, the epochs a budget sets) is set by making the changed copy, where it is derived.
        The values are not validated again: the code that derives them gives them their type."""
        own: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for key, value in values.items():
            head, _, rest = key.partition(".")
            if rest:
                nested.setdefault(head, {})[rest] = value
            else:
                own[head] = value
        for head, changes in nested.items():
            own[head] = getattr(self, head).with_values(changes)
        return self.model_copy(update=own)


SectionT = TypeVar("SectionT", bound=Section)


class Problems:
    """Collects the messages of several checks, so that every problem is said at once: a
    section's validator over several rules (:func:`every_rule`), start-up's checks of the disk."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    @contextmanager
    def check(self) -> Iterator[None]:
        """Run a check; its ConfigError (or SettingError) is noted and the next check runs."""
        try:
            yield
        except (ConfigError, SettingError) as err:
            self.lines += [line for line in str(err).splitlines() if line not in self.lines]

    def raise_any(self) -> None:
        if self.lines:
            raise ConfigError("\n".join(self.lines))


def every_rule(section: SectionT, rules: tuple[Callable[[Any], None], ...]) -> SectionT:
    """A section's validator over several rules: every rule runs, and the problems they find are
    one :class:`ConfigError`, a line each (:func:`messages` says them with the schema's own)."""
    problems = Problems()
    for rule in rules:
        with problems.check():
            rule(section)
    problems.raise_any()
    return section


def as_dict(validated: BaseModel) -> dict[str, Any]:
    """A validated config as plain values, for what is written or handed on (config.yaml, the
    checkpoint's config, W&B's config): every declared key, an absent optional group (``hvp``
    without ``+hvp=on``) left out, as a composed config leaves it out."""
    fields = type(validated).model_fields
    return {k: v for k, v in validated.model_dump().items() if v is not None or not _optional_group(fields[k])}


def _optional_group(field: FieldInfo) -> bool:
    """A top-level ``Group | None``: a config group that is absent until added (``+hvp=on``)."""
    args = typing.get_args(field.annotation)
    return type(None) in args and any(isinstance(a, type) and issubclass(a, BaseModel) for a in args)


# --- value types: the range is part of the type, so the message can say it -----------------------
def number(
    low: float | None = None, high: float | None = None, *, open_low: bool = False, open_high: bool = False
) -> Any:
    """A float in the given range (an integer is accepted and becomes a float)."""
    return Annotated[float, _bounds(low, high, open_low, open_high)]


def integer(low: int | None = None, high: int | None = None) -> Any:
    """An int in ``[low, high]``."""
    return Annotated[int, _bounds(low, high, False, False)]


def _bounds(low: float | None, high: float | None, open_low: bool, open_high: bool) -> FieldInfo:
    kw: dict[str, float] = {}
    if low is not None:
        kw["gt" if open_low else "ge"] = low
    if high is not None:
        kw["lt" if open_high else "le"] = high
    return Field(**kw)


class Ordered:
    """Marks a two-number list as a range ``[min, max]`` (min <= max), not two separate values."""

    def __repr__(self) -> str:
        return "Ordered()"


def _ordered(values: list[float]) -> list[float]:
    if values[0] > values[1]:
        raise ValueError("min > max")
    return values


def numbers(n: int, low: float | None = None, high: float | None = None, *, open_low: bool = False,
            ordered: bool = False) -> Any:  # fmt: skip
    """A list of exactly ``n`` numbers, each in the range; ``ordered``: a range [min, max]."""
    return fixed_list(number(low, high, open_low=open_low), n, ordered)


def fixed_list(item: Any, n: int, ordered: bool = False) -> Any:
    """A list of exactly ``n`` ``item`` values; ``ordered``: two numbers forming a range [min, max]."""
    extra: tuple[Any, ...] = (Ordered(), AfterValidator(_ordered)) if ordered else ()
    return Annotated[list[item], Field(min_length=n, max_length=n), *extra]  # type: ignore[valid-type]


class Distinct:
    """Marks a list whose items may not repeat."""

    def __repr__(self) -> str:
        return "Distinct()"


def _distinct(values: list[Any]) -> list[Any]:
    if len(set(values)) != len(values):
        raise ValueError("repeated items")
    return values


def distinct(item: Any) -> Any:
    """A non-empty list of distinct ``item`` values."""
    return Annotated[list[item], Field(min_length=1), Distinct(), AfterValidator(_distinct)]  # type: ignore[valid-type]


POSITIVE = number(0, open_low=True)
NON_NEGATIVE = number(0)
PROBABILITY = number(0, 1)
MOMENTUM = number(0, 1)  # EMA and centre momenta: 1 freezes, which is allowed
COUNT = integer(1)
COUNT_OR_ZERO = integer(0)
SEED = integer(0, 2**32 - 1)  # what NumPy's and Lightning's seeding accept
UNIT_RANGE = numbers(2, 0, 1, open_low=True, ordered=True)  # crop scales: [min, max] in (0, 1]
CHANNELS = numbers(3, 0, 1)  # per-channel mean


# --- messages ----------------------------------------------------------------------------------------
M = TypeVar("M", bound=BaseModel)


def checked(model: type[M], data: Any, prefix: str = "") -> M:
    """``data`` validated as ``model``, or a :class:`ConfigError` with one line per bad key (key,
    value, what is allowed; for an unknown key the closest declared one), all of them at once.
    ``prefix``: the dotted path of ``data`` in the whole config (``"hvp."``)."""
    lines = [not_set(prefix + ".".join(key), field) for key, field in unset_keys(model, data, data)]
    try:
        validated = model.model_validate(data)
    except ValidationError as err:
        lines += messages(model, err, data, prefix)
    if lines:
        raise ConfigError("\n".join(dict.fromkeys(_first_per_key(lines))))
    return validated


def _first_per_key(lines: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for line in lines:
        key = line.split("=", 1)[0].split(" ", 1)[0]
        if key not in seen:
            seen.add(key)
            out.append(line)
    return out


def unset_keys(
    model: type[BaseModel], data: Any, root: Any, path: tuple[str, ...] = ()
) -> list[tuple[list[str], FieldInfo | None]]:
    """The keys whose value is ``???`` (every preset of the group must set it, and none did)."""
    out: list[tuple[list[str], FieldInfo | None]] = []
    if isinstance(data, Mapping):
        for k, v in data.items():
            out += unset_keys(model, v, root, (*path, str(k)))
    elif isinstance(data, str) and data == MISSING:
        key, field, _, _ = locate(model, path, root)
        out.append((key, field))
    return out


def messages(model: type[BaseModel], err: ValidationError, data: Any = None, prefix: str = "") -> list[str]:
    """One line per key of ``err`` (a union's several errors for one key make one line)."""
    lines: dict[str, str] = {}
    for e in err.errors():
        key, field, parent, unknown = locate(model, e["loc"], data)
        path = prefix + ".".join(key)
        if path in lines:
            continue
        rule = (e.get("ctx") or {}).get("error")
        if e["type"] == "value_error" and isinstance(rule, (SettingError, ConfigError)):
            # a section's rule over several keys: its own message, with the section's place
            where = prefix + "".join(f"{k}." for k in key)
            said = [str(rule.at(where))] if isinstance(rule, SettingError) else str(rule).splitlines()
            lines.update({line: line for line in said})
        elif e["type"] == "extra_forbidden":
            lines[path] = unknown_key(path, parent, unknown or key[-1])
        elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            tag = e.get("ctx", {}).get("tag", e["input"].get("name") if isinstance(e["input"], Mapping) else e["input"])
            lines[path] = f"{path}.name={tag!r} is not allowed: {union_choices(field)}"
        elif e["type"] == "missing":
            lines[path] = not_set(path, field)
        else:
            lines[path] = bad_value(path, value_at(data, key, e["input"]), field)
    return list(lines.values())


def value_at(data: Any, key: list[str], default: Any) -> Any:
    """The value at ``key`` in ``data`` (a list's whole value where the error was one item's)."""
    node = data
    for part in key:
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def strip_unknown(model: type[BaseModel], data: dict[str, Any], path: str = "") -> list[str]:
    """Remove from ``data`` (in place) the keys ``model`` does not declare: the dotted keys removed.
    For a resumed run's config, written by a version that had other keys."""
    dropped: list[str] = []
    for key in list(data):
        if key not in model.model_fields:
            if model.model_config.get("extra") != "allow":
                dropped.append(path + str(key))
                del data[key]
            continue
        field, value = model.model_fields[key], data[key]
        sub = chosen_model(field.annotation, value, discriminator(field)) if model_choices(field.annotation) else None
        if sub is not None and isinstance(value, dict):
            dropped += strip_unknown(sub, value, f"{path}{key}.")
    return dropped


def _extra(field: FieldInfo | None) -> dict[str, Any]:
    return field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}


def allowed_text(field: FieldInfo | None) -> str:
    """What ``field``'s declaration allows, in words (with its ``allowed`` note, if it has one)."""
    if field is None:
        return "a value of its declared type"
    text = describe(field.annotation, field.metadata)
    note = _extra(field).get("allowed")
    return f"{text} ({note})" if note else text


def bad_value(path: str, value: Any, field: FieldInfo | None) -> str:
    """``path=value is not allowed: <what the declaration allows>``."""
    shown = list(value) if isinstance(value, tuple) else value
    return f"{path}={shown!r} is not allowed: {allowed_text(field)}"


def not_set(path: str, field: FieldInfo | None) -> str:
    """A key without a value (``???``): what it is and that the command must set it."""
    allowed = allowed_text(field)
    what = "; ".join(t for t in (field.description if field is not None else None, allowed) if t and t != "a string")
    return f"{path} is not set{f' ({what})' if what else ''}: add {path}=... to the command"


def union_choices(field: FieldInfo | None) -> str:
    """What a field holding one of several sections allows as its tag (``method.name``, ``data.name``)."""
    tags = _extra(field).get("tags")
    if tags:
        return tags
    choices = [t for t, _ in model_choices(field.annotation)] if field is not None else []
    return f"one of {', '.join(choices)}"


def unknown_key(path: str, parent: type[BaseModel] | None, name: str) -> str:
    """An unknown key: it would change nothing. With its closest declared key, if one is close."""
    known = sorted(parent.model_fields) if parent is not None else []
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
    where = path.rsplit(".", 1)[0] + "." if "." in path else ""
    hint = f"did you mean {where}{close[0]}? " if close else ""
    owner = where[:-1] or "the config"
    tag = parent.model_fields.get("name") if parent is not None else None
    if tag is not None and typing.get_origin(tag.annotation) is Literal and len(typing.get_args(tag.annotation)) == 1:
        owner += f" {typing.get_args(tag.annotation)[0]}"
    return f"{path} is not allowed: not a key of {owner}, so it would change nothing ({hint}keys: {', '.join(known)})"


def locate(
    model: type[BaseModel], loc: tuple[int | str, ...], data: Any = None
) -> tuple[list[str], FieldInfo | None, type[BaseModel] | None, str | None]:
    """Walk an error's ``loc`` through the schema: (the key's parts, its field declaration, the
    section that declares it, the name if the key is not declared). A discriminated union's tag in
    ``loc`` is skipped, or, where ``loc`` has none, the section is picked by ``data``'s values; a
    plain union's member tag or a list index ends the key (the error is the field's)."""
    key: list[str] = []
    current: Any = model
    field: FieldInfo | None = None
    parent: type[BaseModel] | None = None
    node = data
    i = 0
    while i < len(loc):
        part = loc[i]
        if _is_model(current):
            if part not in current.model_fields:
                return [*key, str(part)], None, current, str(part)
            parent, field = current, current.model_fields[part]
            key.append(str(part))
            node = node.get(part) if isinstance(node, Mapping) else None
            i += 1
            choices = dict(model_choices(field.annotation))
            if choices and i < len(loc) and loc[i] in choices and len(choices) > 1:
                current = choices[loc[i]]
                i += 1
            else:
                current = chosen_model(field.annotation, node, discriminator(field)) if choices else field.annotation
                if current is None:
                    break
        elif typing.get_origin(unwrap(current)[0]) is dict:
            key.append(str(part))
            value_type = typing.get_args(unwrap(current)[0])[1]
            node = node.get(part) if isinstance(node, Mapping) else None
            current = chosen_model(value_type, node) if model_choices(value_type) else value_type
            field = None
            i += 1
            if current is None:
                break
        else:
            break
    return key, field, parent, None


def discriminator(field: FieldInfo) -> Any:
    """A field's discriminator: a key name, or a ``Discriminator`` (in its metadata), or None."""
    return field.discriminator or next((m for m in field.metadata if isinstance(m, Discriminator)), None)


def chosen_model(tp: Any, value: Any, discriminator: Any = None) -> type[BaseModel] | None:
    """The section a field holding one of several sections has for ``value``: by its
    ``Discriminator`` (the backbone's family; a field's ``discriminator`` or in ``tp``'s
    ``Annotated``) or its ``name``; a single section's own."""
    choices = dict(model_choices(tp))
    if len(choices) == 1:
        return next(iter(choices.values()))
    if not isinstance(value, Mapping):
        return None
    _, meta = unwrap(tp)
    found = discriminator or next((m for m in meta if isinstance(m, Discriminator)), None)
    pick = found.discriminator if isinstance(found, Discriminator) else None
    tag = pick(value) if callable(pick) else value.get("name")
    return choices.get(tag)


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def model_choices(tp: Any) -> list[tuple[str, type[BaseModel]]]:
    """The sections a field's type can hold, by their tag: a discriminated union's members by their
    ``Tag`` or ``name`` values; a single section (``Optional`` or not) by its class name."""
    members = [(unwrap(m)[0], unwrap(m)[1]) for m in _union_members(tp)]
    models = [(base, meta) for base, meta in members if _is_model(base)]
    if len(models) == 1:
        return [(models[0][0].__name__, models[0][0])]
    out: list[tuple[str, type[BaseModel]]] = []
    for base, meta in models:
        tag = next((m.tag for m in meta if type(m).__name__ == "Tag"), None)
        if tag is not None:
            out.append((tag, base))
            continue
        name_field = base.model_fields["name"]
        out.extend((n, base) for n in typing.get_args(name_field.annotation))
    return out


def _union_members(tp: Any) -> list[Any]:
    base, _ = unwrap(tp)
    if typing.get_origin(base) in (Union, types.UnionType):
        return [m for arg in typing.get_args(base) for m in _union_members(arg)]
    return [tp]


def unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """(the type under ``Annotated``, its metadata, flattened: a ``FieldInfo``'s constraints too)."""
    meta: list[Any] = []
    while typing.get_origin(tp) is Annotated:
        args = typing.get_args(tp)
        tp = args[0]
        for m in args[1:]:
            meta.extend(m.metadata if isinstance(m, FieldInfo) else [m])
    return tp, meta


def describe(tp: Any, metadata: list[Any] | tuple[Any, ...] = ()) -> str:
    """What a declared type allows, in words: ``an integer >= 2``, ``a number in (0, 1]``,
    ``one of hard, easy, random``, ``two numbers [min, max], min <= max, each in (0, 1]``, ``... or null``."""
    base, meta = unwrap(tp)
    meta = [*metadata, *meta]
    members = _union_members(base)
    models = [t for t, _ in model_choices(base)]
    if len(models) > 1:  # one of several sections: a group's presets
        return f"one of {', '.join(models)}" + (" or null" if any(m is type(None) for m in members) else "")
    if len(members) > 1:
        parts = [describe(m) for m in members if m is not type(None)]
        nullable = any(m is type(None) for m in members)
        text = " or ".join(p for p in parts if p)
        return text + (" or null" if nullable else "")
    if typing.get_origin(base) is Literal:
        choices = [str(c) for c in typing.get_args(base)]
        return choices[0] if len(choices) == 1 else f"one of {', '.join(choices)}"
    if base is bool:
        return "true or false"
    if base is int:
        return f"an integer{_range(meta)}"
    if base is float:
        return f"a number{_range(meta)}"
    if base is str:
        return "a string"
    if typing.get_origin(base) is list:
        (item,) = typing.get_args(base)
        size = next((m.min_length for m in meta if isinstance(m, at.MinLen)), None)
        same = size is not None and any(isinstance(m, at.MaxLen) and m.max_length == size for m in meta)
        inner = describe(item)
        each = inner.split(" ", 2)[2] if inner.startswith(("a number ", "an integer ")) else ""
        if same and size == 2 and any(isinstance(m, Ordered) for m in meta):
            return f"two numbers [min, max], min <= max, each{' ' + each if each else ''}".rstrip()
        if same and size in (2, 3):
            what = "two numbers" if size == 2 else "three numbers (one per channel)"
            return f"{what}, each{' ' + each if each else ''}".rstrip(", each")
        if any(isinstance(m, Distinct) for m in meta):
            return f"a non-empty list of distinct names from {inner.removeprefix('one of ')}"
        return f"a list, each item {inner}"
    if typing.get_origin(base) is dict or base is dict:
        return "a mapping"
    if _is_model(base):
        return f"a mapping with keys {', '.join(base.model_fields)}"
    return getattr(base, "__name__", str(base))


def _range(meta: list[Any]) -> str:
    """A number's range in words, from its ``annotated_types`` bounds (the library's words: :class:`Bounds`)."""

    def bound(kind: type) -> float | None:
        return next((getattr(m, kind.__name__.lower()) for m in meta if isinstance(m, kind)), None)

    return Bounds(ge=bound(at.Ge), gt=bound(at.Gt), le=bound(at.Le), lt=bound(at.Lt)).text()
