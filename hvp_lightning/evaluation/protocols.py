"""The evaluation protocols' recipes (``conf/protocol/*.yaml``), with the command's keys on top
(their types and ranges: hvp_lightning/schema/evaluate.py)."""

from __future__ import annotations

from typing import Any

from ..config import fail
from ..schema.evaluate import ProtocolSettings
from ..settings import method_settings

# Finetune tables: which one a method's checkpoint uses (the paper has DINO ViT-S and SimSiam RN50).
FINETUNE_TABLE = {name: cls.finetune_table for name, cls in method_settings().items()}
# ``interpolation: auto`` of the linear probe and fine-tuning (resize and RandomResizedCrop), per
# checkpoint method, as each method's evaluation code in automl/hvp: bicubic in the dino branch's
# transfer transforms (dino:data/__init__.py lines 100 and 117, used for DINO and iBOT ViT-S) and
# the simclr branch's (simclr:transforms/eval_transforms.py lines 11 and 33); bilinear in the
# SimSiam code (main:data.py lines 74 and 91) and torchvision's default elsewhere.
EVAL_INTERPOLATION = {name: cls.eval_interpolation for name, cls in method_settings().items()}


def protocol_settings(p: ProtocolSettings, method: str, dataset: str) -> dict[str, Any]:
    """The protocol's recipe for this checkpoint, with every non-null ``protocol.*`` key on top."""
    if p.name == "knn":
        return {"ks": list(p.ks), "temperature": p.temperature, "batch_size": p.batch_size}
    recipe = method if p.recipe == "auto" else p.recipe
    if p.name == "linear":
        if recipe not in p.recipes:
            fail("protocol.recipe", p.recipe, f"auto or one of {', '.join(p.recipes)}")
        base = p.recipes[recipe].model_dump()
    else:
        recipe = FINETUNE_TABLE.get(recipe, recipe) if p.recipe == "auto" else recipe
        if recipe not in p.tables:
            fail("protocol.recipe", p.recipe, f"auto or one of {', '.join(p.tables)}")
        table = p.tables[recipe]
        row = p.table_row if p.table_row != "auto" else (dataset if dataset in table.base_lr else "cifar10")
        if row not in table.base_lr:
            fail("protocol.table_row", p.table_row, f"auto or one of {', '.join(table.base_lr)}")
        base = {
            "optimizer": "adamw",
            "batch_size": table.batch_size,
            "weight_decay": table.weight_decay,
            "momentum": table.momentum,
            "base_lr": table.base_lr[row],
            "epochs": table.epochs[row],
            "n_last_blocks": table.n_last_blocks,
            "avgpool_patchtokens": table.avgpool_patchtokens,
            "table_row": row,
        }
    skip = {"name", "recipe", "recipes", "tables", "table_row"}
    for key, value in p.model_dump().items():
        if key not in skip and value is not None:
            base[key] = value
    base["recipe"] = recipe
    if base["interpolation"] == "auto":
        base["interpolation"] = EVAL_INTERPOLATION.get(method, "bilinear")
    return base
