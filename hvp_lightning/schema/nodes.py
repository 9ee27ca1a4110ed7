"""The Hydra nodes made from the schema: every declared key with its default (``???`` where a
preset must set it), registered in Hydra's ConfigStore, so that a key exists for ``key=value``
overrides (no ``+``) wherever its group is chosen, and a preset in conf/ only sets values.

A preset extends its group's node through its defaults list (``method/simclr.yaml``:
``defaults: [_simclr, _self_]``); groups with one preset and no values of their own are the node
itself (``+hvp=on``, ``logger=csv``, ``+data/iou_policy=on``, ``protocol=knn``). The ``_`` names
are not for the command line; ``--help`` leaves them out.
"""

from __future__ import annotations

import typing
from typing import Any

from hydra.core.config_store import ConfigStore
from pydantic import BaseModel

from .backbone import ResNetSettings, TimmSettings, ViTSettings
from .base import MISSING, Section, model_choices, unwrap
from .data import DATA_SCHEMAS, IoUPolicySettings
from .evaluate import EvalConfig, FinetuneProtocol, KnnProtocol, LinearProtocol, TransferConfig
from .hvp import HVPSection
from .method import METHOD_SCHEMAS
from .run import CSVLoggerSettings, TrainConfig, WandbLoggerSettings


def node(model: type[BaseModel], **values: Any) -> dict[str, Any]:
    """``model``'s keys with their defaults: nested sections expanded (so that their keys exist
    too), ``???`` for a key a preset must set; a field holding one of several sections (the
    groups chosen in the defaults list: ``method``, ``data``, ...) or none by default is left out."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        choices = model_choices(field.annotation)
        if name in values:
            out[name] = values[name]
        elif "compose" in extra:
            out[name] = extra["compose"]
        elif len(choices) > 1 or (choices and not field.is_required() and field.default is None):
            continue  # chosen by a group in the defaults list, or absent unless added
        elif choices and _is_single_section(field.annotation):  # a nested section: its default, or its keys'
            out[name] = field.default.model_dump() if isinstance(field.default, BaseModel) else node(choices[0][1])
        elif field.is_required() and typing.get_origin(unwrap(field.annotation)[0]) is dict:
            continue  # a table a preset sets whole (protocol recipes, transfer data sets)
        elif field.is_required():
            out[name] = MISSING
        else:
            default = field.get_default(call_default_factory=True)
            out[name] = default.model_dump() if isinstance(default, BaseModel) else default
    return out


def _is_single_section(tp: Any) -> bool:
    base, _ = unwrap(tp)
    return isinstance(base, type) and issubclass(base, Section)


def kind(model: type[BaseModel]) -> list[str]:
    """The ``name`` values a schema declares (its presets' kinds)."""
    field = model.model_fields["name"]
    return list(typing.get_args(field.annotation))


def register() -> None:
    """Store every node in Hydra's ConfigStore (idempotent: a later call replaces them)."""
    cs = ConfigStore.instance()
    cs.store(name="_train", node=node(TrainConfig))
    cs.store(name="_eval", node=node(EvalConfig))
    cs.store(name="_transfer", node=node(TransferConfig))
    for model in METHOD_SCHEMAS:
        (name,) = kind(model)
        cs.store(group="method", name=f"_{name}", node=node(model))
    cs.store(group="backbone", name="_resnet", node=node(ResNetSettings))
    cs.store(group="backbone", name="_vit", node=node(ViTSettings))
    cs.store(group="backbone", name="timm", node=node(TimmSettings))
    for model in DATA_SCHEMAS:
        for name in kind(model):
            cs.store(group="data", name=f"_{name}", node=node(model, name=name))
    cs.store(group="data/iou_policy", name="on", node=node(IoUPolicySettings))
    cs.store(group="hvp", name="on", node=node(HVPSection))
    cs.store(group="logger", name="csv", node=node(CSVLoggerSettings))
    cs.store(group="logger", name="wandb", node=node(WandbLoggerSettings))
    cs.store(group="protocol", name="knn", node=node(KnnProtocol))
    cs.store(group="protocol", name="_linear", node=node(LinearProtocol))
    cs.store(group="protocol", name="_finetune", node=node(FinetuneProtocol))
