"""The evaluation protocols' recipes (``conf/protocol/*.yaml``) and their validation."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..config import fail, int_at_least
from ..options import INTERPOLATIONS, OPTIMIZERS

# Finetune tables: which one a method's checkpoint uses (the paper has DINO ViT-S and SimSiam RN50).
FINETUNE_TABLE = {
    "dino": "dino",
    "ibot": "dino",
    "simsiam": "simsiam",
    "simclr": "simsiam",
    "byol": "simsiam",
    "mocov3": "simsiam",
    "vicreg": "simsiam",
    "barlow_twins": "simsiam",
}
# ``interpolation: auto`` of the linear probe and fine-tuning (resize and RandomResizedCrop), per
# checkpoint method, as each method's evaluation code in automl/hvp: bicubic in the dino branch's
# transfer transforms (dino:data/__init__.py lines 100 and 117, used for DINO and iBOT ViT-S) and
# the simclr branch's (simclr:transforms/eval_transforms.py lines 11 and 33); bilinear in the
# SimSiam code (main:data.py lines 74 and 91) and torchvision's default elsewhere.
EVAL_INTERPOLATION = {"dino": "bicubic", "ibot": "bicubic", "simclr": "bicubic"}


def protocol_settings(p: DictConfig, method: str, dataset: str) -> dict[str, Any]:
    """The protocol's recipe for this checkpoint, with every non-null ``protocol.*`` key on top."""
    if p.name == "knn":
        ks = list(p.ks) if OmegaConf.is_list(p.ks) else p.ks
        return {"ks": ks, "temperature": p.temperature, "batch_size": p.batch_size}
    recipe = method if p.recipe == "auto" else p.recipe
    if p.name == "linear":
        if recipe not in p.recipes:
            fail("protocol.recipe", p.recipe, f"auto or one of {', '.join(p.recipes)}")
        base = dict(OmegaConf.to_container(p.recipes[recipe], resolve=True))  # type: ignore[arg-type]
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
            "base_lr": table.base_lr[row],
            "epochs": table.epochs[row],
            "n_last_blocks": table.n_last_blocks,
            "avgpool_patchtokens": table.avgpool_patchtokens,
            "table_row": row,
        }
    skip = {"name", "recipe", "recipes", "tables", "table_row"}
    for key, value in p.items():
        if key not in skip and value is not None:
            base[str(key)] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    base["recipe"] = recipe
    if base.get("interpolation") == "auto":
        base["interpolation"] = EVAL_INTERPOLATION.get(method, "bilinear")
    return base


def validate_settings(s: dict[str, Any], protocol: str) -> None:
    """Each setting of the protocol against its allowed range, naming the key."""
    node = OmegaConf.create({"protocol": {k: v for k, v in s.items()}})
    if protocol == "knn":
        ks = s["ks"]
        if (
            not isinstance(ks, list)
            or not ks
            or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks)
        ):
            fail("protocol.ks", ks, "a non-empty list of integers >= 1")
        if not isinstance(s["temperature"], (int, float)) or not s["temperature"] > 0:
            fail("protocol.temperature", s["temperature"], "expected > 0")
        int_at_least(node, "protocol.batch_size", 1)
        return
    for key in ("batch_size", "epochs", "lr_ref_batch"):
        int_at_least(node, f"protocol.{key}", 1)
    if s["optimizer"] not in OPTIMIZERS:
        fail("protocol.optimizer", s["optimizer"], f"one of {', '.join(OPTIMIZERS)}")
    if not isinstance(s["base_lr"], (int, float)) or not s["base_lr"] > 0:
        fail("protocol.base_lr", s["base_lr"], "expected > 0")
    if not isinstance(s["weight_decay"], (int, float)) or s["weight_decay"] < 0:
        fail("protocol.weight_decay", s["weight_decay"], "expected >= 0")
    scale = s["train_crop_scale"]
    if (
        not isinstance(scale, list)
        or len(scale) != 2
        or not all(isinstance(v, (int, float)) for v in scale)
        or not 0 < scale[0] <= scale[1] <= 1
    ):
        fail("protocol.train_crop_scale", s["train_crop_scale"], "two numbers 0 < min <= max <= 1")
    for key in ("momentum", "warmup_epochs"):
        if key in s and (isinstance(s[key], bool) or not isinstance(s[key], (int, float)) or s[key] < 0):
            fail(f"protocol.{key}", s[key], "a number >= 0")
    int_at_least(node, "protocol.n_last_blocks", 1)
    if not isinstance(s["avgpool_patchtokens"], bool):
        fail("protocol.avgpool_patchtokens", s["avgpool_patchtokens"], "true or false")
    if s["interpolation"] not in INTERPOLATIONS:
        fail("protocol.interpolation", s["interpolation"], f"auto or one of {', '.join(INTERPOLATIONS)}")
    if protocol == "linear":
        if not (isinstance(s["augment"], bool) or s["augment"] == "auto"):
            fail("protocol.augment", s["augment"], "true, false or auto (false on CPU: cached features)")
