"""``eval.py``'s and ``transfer.py``'s configs (conf/eval.yaml, conf/transfer.yaml) and the ``protocol``
group: k-NN, linear probe, fine-tuning. A protocol key left null takes the recipe's value (the
checkpoint method's linear recipe, the fine-tuning table's row)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ..errors import ConfigError
from ..settings import LinearRecipe, SettingError, method_settings
from .base import COUNT, NON_NEGATIVE, POSITIVE, SEED, UNIT_RANGE, Section, distinct, integer, number
from .core import section_of
from .data import INTERPOLATIONS, DataSettings
from .method import METHOD_NAMES, OPTIMIZERS
from .run import ACCELERATORS, TRAINER_PRECISIONS, LoggerSettings

# transfer.py: the paper's transfer table, its columns in the paper's order
TRANSFER_DATASETS = ("cifar10", "cifar100", "flowers102", "inat21", "food101")
TRANSFER_PROTOCOLS = ("linear", "finetune")


class KnnProtocol(Section):
    """``protocol=knn``: weighted k-NN on frozen features (DINO's eval_knn.py)."""

    name: Literal["knn"] = "knn"
    ks: Annotated[list[integer(1)], Field(min_length=1)] = [10, 20, 100, 200]
    """the k of each result"""
    temperature: POSITIVE = 0.07
    """the votes' temperature"""
    batch_size: COUNT = 256
    """feature extraction batch"""


# each method's linear-probe recipe, from its settings in the library (their linear_recipe)
LinearRecipeSection = section_of(LinearRecipe)
LINEAR_RECIPES = {name: cls.linear_recipe.to_dict() for name, cls in method_settings().items()}


class ClassifierProtocol(Section):
    """What the linear probe and fine-tuning share: the recipe's values, overridable key by key."""

    base_lr: POSITIVE | None = None
    """lr = base_lr * batch_size / lr_ref_batch (null: the recipe's)"""
    lr_ref_batch: COUNT = 256
    """the batch base_lr refers to"""
    batch_size: integer(1) | None = None
    """null: the recipe's, whatever the data's size; a number: that batch (the lr follows it)"""
    epochs: integer(1) | None = None
    """null: the recipe's"""
    weight_decay: NON_NEGATIVE | None = None
    """null: the recipe's"""
    momentum: number(0, 1, open_high=True) | None = None
    """SGD's and LARS's momentum (null: the recipe's)"""
    warmup_epochs: NON_NEGATIVE = 0
    """linear warm-up epochs, then cosine to 0"""
    n_last_blocks: integer(1) | None = None
    """ViTs: the head sees the CLS tokens of the last n blocks, concatenated (null: the recipe's)"""
    avgpool_patchtokens: bool | None = None
    """ViTs: also the mean patch token of the last block (null: the recipe's)"""
    interpolation: Literal[("auto", *INTERPOLATIONS)] = "auto"
    """resize and crop: auto = bicubic for dino, ibot, simclr checkpoints, else bilinear"""
    train_crop_scale: UNIT_RANGE = [0.08, 1.0]
    """the training RandomResizedCrop's area range"""


class LinearProtocol(ClassifierProtocol):
    """``protocol=linear``: a linear probe on frozen features, with the checkpoint method's official recipe."""

    name: Literal["linear"] = "linear"
    recipe: Literal[("auto", *METHOD_NAMES)] = "auto"
    """whose recipe: auto = the checkpoint's method"""
    optimizer: Literal[OPTIMIZERS] | None = None
    """null: the recipe's"""
    augment: bool | Literal["auto"] = "auto"
    """train on augmented crops (the official scripts); auto: false on CPU (cached features)"""
    recipes: dict[str, LinearRecipeSection] = LINEAR_RECIPES  # type: ignore[valid-type]
    """each method's official linear-evaluation recipe (the methods' own, hvp_lightning/settings/<method>.py)"""

    @model_validator(mode="after")
    def recipe_given(self) -> LinearProtocol:
        """A recipe named is one of ``recipes`` (``auto``'s, the checkpoint's method: checked once it is read)."""
        if self.recipe != "auto" and self.recipe not in self.recipes:
            raise SettingError("recipe", self.recipe, f"auto or one of {', '.join(self.recipes)}")
        return self


class FinetuneTable(Section):
    """One of the paper's fine-tuning tables (per transfer data set: lr and epochs)."""

    batch_size: COUNT
    weight_decay: NON_NEGATIVE
    momentum: number(0, 1, open_high=True) = 0.9
    """SGD's and LARS's, if protocol.optimizer picks one (the tables' AdamW has none)"""
    base_lr: dict[str, POSITIVE]
    epochs: dict[str, COUNT]
    n_last_blocks: COUNT
    avgpool_patchtokens: bool


class FinetuneProtocol(ClassifierProtocol):
    """``protocol=finetune``: the whole network fine-tuned, with the paper's per-data-set tables."""

    name: Literal["finetune"] = "finetune"
    recipe: Literal["auto", "dino", "simsiam"] = "auto"
    """which table: auto = dino for dino/ibot checkpoints, simsiam for the ResNet methods"""
    table_row: Literal[("auto", *TRANSFER_DATASETS)] = "auto"
    """the table's row: auto = data.name if the table lists it, else cifar10"""
    optimizer: Literal[OPTIMIZERS] = "adamw"
    """the optimiser (the paper's: AdamW on every parameter, biases and norms too)"""
    tables: dict[str, FinetuneTable]
    """the paper's fine-tuning tables"""

    @model_validator(mode="after")
    def row_given(self) -> FinetuneProtocol:
        """A table named is one of ``tables``, a row named one of its rows (``auto``'s, which follow the
        checkpoint's method and the data set: checked once they are known)."""
        if self.recipe == "auto":
            return self
        if self.recipe not in self.tables:
            raise SettingError("recipe", self.recipe, f"auto or one of {', '.join(self.tables)}")
        rows = self.tables[self.recipe].base_lr
        if self.table_row != "auto" and self.table_row not in rows:
            raise SettingError("table_row", self.table_row, f"auto or one of {', '.join(rows)}")
        return self


ProtocolSettings = Annotated[KnnProtocol | LinearProtocol | FinetuneProtocol, Field(discriminator="name")]


class EvalLimits(Section):
    """``limits`` of an evaluation."""

    wait_s: POSITIVE = 600
    """a loader whose workers deliver no batch for this long fails the evaluation"""


class EvaluationBase(Section):
    """What eval.py and transfer.py share."""

    ckpt: str
    """a run dir (its checkpoints/last.ckpt) or a .ckpt file"""
    student: bool = False
    """DINO/iBOT: evaluate the student backbone instead of the teacher"""
    out_dir: str | None = None
    """null: <run_dir>/eval/..."""
    seed: SEED = 0
    """the evaluation's seed"""
    num_workers: integer(0) | Literal["auto"] | None = "auto"
    """loader workers; auto: this machine's (usable CPU cores but one, at most 8); null: the data's data.num_workers"""
    limits: EvalLimits = EvalLimits()
    accelerator: Literal[ACCELERATORS] = "auto"
    """auto, cpu, gpu (= cuda), mps (one device: evaluation is single-process)"""
    devices: Literal[1] = Field(1, json_schema_extra={"allowed": "evaluation runs on one device"})
    """1: evaluation runs on one device"""
    precision: Literal[("auto", *TRAINER_PRECISIONS)] = "auto"
    """auto: 16-mixed for a ViT's linear probe / fine-tuning on a GPU (the official code's fp16), else 32-true"""
    progress_bar: bool = True
    """progress bars"""
    logger: LoggerSettings | None = None
    """null: the pretraining run's logger (csv or wandb)"""


class EvalConfig(EvaluationBase):
    """``eval.py``'s whole config."""

    protocol: ProtocolSettings
    data: dict[str, Any] | None = {"eval_root": None}
    """without data=<preset>: changes to the checkpoint's own data (data.eval_root=DIR: a labelled folder to evaluate a data=images/shards run on; +data.<key>=...); data=<preset>: another data set"""


class TransferConfig(EvaluationBase):
    """``transfer.py``'s whole config: the paper's transfer table for one checkpoint."""

    datasets: distinct(Literal[TRANSFER_DATASETS]) = list(TRANSFER_DATASETS)
    """the table's columns (any subset, run in the paper's order)"""
    protocols: distinct(Literal[TRANSFER_PROTOCOLS]) = list(TRANSFER_PROTOCOLS)
    """the table's rows"""
    root: str = "data"
    """data.<name>.root defaults to <root>/<name>, in torchvision's layout (docs/data.md)"""
    linear: LinearProtocol
    finetune: FinetuneProtocol
    data: dict[str, DataSettings]

    @model_validator(mode="after")
    def presets(self) -> TransferConfig:
        """Each data set asked for is its own preset (``data.cifar10`` holds data=cifar10's keys)."""
        lines = [
            f"data.{name}.name={self.data[name].name!r} is not allowed: {name} (the preset conf/data/{name}.yaml)"
            for name in self.datasets
            if name in self.data and self.data[name].name != name
        ]
        lines += [
            f"data.{name} is not set: the keys of the preset conf/data/{name}.yaml (datasets names {name})"
            for name in self.datasets
            if name not in self.data
        ]
        if lines:
            raise ConfigError("\n".join(lines))
        return self
