"""``--help``'s listing of the keys: every key of the groups a command line chooses, with its
value there, what it allows and its doc, all derived from the schema."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from .base import MISSING, chosen_model, describe, discriminator, model_choices


def rows(model: type[BaseModel], values: Mapping[str, Any] | None, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, value, allowed, doc) of every key of ``model``, nested sections flattened; ``values``
    the composed config's (None: the defaults)."""
    out: list[tuple[str, str, str, str]] = []
    fields = sorted(model.model_fields.items(), key=lambda item: item[0] != "name")  # the kind first
    for name, field in fields:
        key = prefix + name
        value = values.get(name, MISSING if field.is_required() else field.default) if values else field.default
        sub = chosen_model(field.annotation, value, discriminator(field)) if model_choices(field.annotation) else None
        if sub is not None and value is None and not field.is_required():
            continue  # an optional group not chosen (data.iou_policy without +data/iou_policy=on)
        if sub is not None:
            out += rows(sub, value if isinstance(value, Mapping) else None, key + ".")
            continue
        shown = "(required)" if value is MISSING or value == MISSING else _shown(value)
        doc = field.description or (
            f"which {prefix[:-1] or 'one'}: the preset chosen sets it" if name == "name" else ""
        )
        out.append((key, shown, describe(field.annotation, field.metadata), doc))
    return out


def _shown(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(list(value) if isinstance(value, tuple) else value)


def listing(sections: list[tuple[str, type[BaseModel], Mapping[str, Any] | None, str]]) -> str:
    """The ``--help`` text: per section (a title, its schema, its composed values, its key prefix)
    one line per key: ``key = value   allowed -- doc``."""
    lines: list[str] = []
    for title, model, values, prefix in sections:
        lines.append(f"{title}:")
        for key, value, allowed, doc in rows(model, values, prefix):
            lines.append(f"  {key} = {value}   ({allowed}){' -- ' + doc if doc else ''}")
    return "\n".join(lines)
