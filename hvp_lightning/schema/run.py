"""The top-level keys of ``train.py`` (conf/config.yaml), the ``trainer`` and ``logger`` groups, and
:class:`TrainConfig`: a whole training config, every group in it, with the rules that tie keys of
several groups together (its validators: what needs only the config; the disk, the data and the
machine are hvp_lightning/config.py's)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ..errors import ConfigError, fail
from ..settings import HVP, method_settings
from .backbone import BACKBONE_FAMILIES, TIMM_FAMILY, BackboneSettings, ResNetSettings, backbone_family
from .base import COUNT, COUNT_OR_ZERO, POSITIVE, SEED, Section, every_rule, integer
from .core import to_settings
from .data import DataSettings
from .hvp import HVPSection
from .method import MULTI_CROP, MethodSection

# trainer.accelerator and eval.py's accelerator: Lightning's but XLA's and Gaudi's (tpu, hpu: packages we lack)
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
# trainer.precision: mixed precision keeps fp32 master weights, EMA teacher and centres;
# "*-true" half precision would run them in half precision too.
TRAINER_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
# resolved at start-up (hvp_lightning/device.py): auto = bf16-mixed on a bf16-native GPU, auto-16-mixed
# = 16-mixed on any GPU (the HVP code's fp16: SimSiam and SimCLR presets); both 32-true on CPU
AUTO_PRECISIONS = ("auto", "auto-16-mixed")
# trainer.* keys train.py owns (checkpointing: hvp_lightning/training/checkpoint.py)
OWNED_TRAINER_KEYS = ("enable_checkpointing", "plugins")
WANDB_MODES = ("auto", "online", "offline", "disabled")


class TrainerSettings(Section):
    """``trainer``: keyword arguments of ``lightning.Trainer``. The keys below are the presets'; any
    other Trainer argument may be added (``+trainer.gradient_clip_val=1``) and is checked against
    the installed Lightning's signature at start-up."""

    model_config = ConfigDict(extra="allow")

    accelerator: Literal[ACCELERATORS]
    """auto (a GPU if there is one, else the CPU), cpu, gpu (= cuda) or mps"""
    devices: integer(1) | Literal["auto"] | str | list[integer(0)]
    """devices per node: a count, auto, or a list of device indices"""
    precision: Literal[(*AUTO_PRECISIONS, *TRAINER_PRECISIONS)]
    """32-true, bf16-mixed or 16-mixed (GPU); auto: bf16-mixed on a GPU that has it, else 32-true; auto-16-mixed: 16-mixed on a GPU, else 32-true"""
    max_epochs: COUNT
    """training epochs"""
    accumulate_grad_batches: COUNT = 1
    """micro-batches per optimiser step (the lr scales with the accumulated batch)"""
    log_every_n_steps: COUNT = 50
    """logging interval in optimiser steps"""
    num_nodes: COUNT = 1
    """machines (SLURM: nodes)"""
    strategy: str = "auto"
    """auto, ddp (and its find_unused_parameters variants) or another Lightning strategy name"""
    sync_batchnorm: bool | Literal["auto"] = "auto"
    """DDP: SyncBatchNorm; auto: on when the model has BatchNorm"""

    @model_validator(mode="after")
    def owned_keys(self) -> TrainerSettings:
        """The ``trainer.*`` keys train.py sets itself (checkpointing) are not the command's."""
        extra = self.model_extra or {}
        lines = [
            f"trainer.{key}={extra[key]!r} is not allowed: not set here: checkpoints are always written "
            "(checkpoint.every_n_epochs sets the kept ones)"
            for key in OWNED_TRAINER_KEYS
            if key in extra
        ]
        if lines:
            raise ConfigError("\n".join(lines))
        return self


class CSVLoggerSettings(Section):
    """``logger=csv``: plain CSV metrics in <run_dir>/csv/ (no account, no service process)."""

    name: Literal["csv"] = "csv"


class WandbLoggerSettings(Section):
    """``logger=wandb``: Weights & Biases."""

    name: Literal["wandb"] = "wandb"
    project: str = "hvp-lightning"
    """the W&B project"""
    entity: str | None = None
    """the W&B entity (team or user); null: your default"""
    group: str | None = None
    """the run's group; null: none (in a -m sweep the sweep's, e.g. sweep_2026-11-21_10-00-00)"""
    tags: list[str] = []
    """the run's tags"""
    run_name: str | None = None
    """the run's name; null: the run dir's name (in a -m sweep <job num>_<overrides>)"""
    mode: Literal[WANDB_MODES] = "auto"
    """auto: online when logged in (WANDB_API_KEY or wandb login), else offline (wandb sync later); WANDB_MODE wins"""
    gallery_images: COUNT_OR_ZERO = 4
    """+hvp=on: at each k-NN pass, this many images' selected vs easiest pair (hvp/gallery) and the IoU histogram (hvp/iou_histogram); 0: off"""


LoggerSettings = Annotated[CSVLoggerSettings | WandbLoggerSettings, Field(discriminator="name")]


class KnnMonitorSettings(Section):
    """``eval``: the online weighted k-NN monitor (DINO's protocol) on the data's test split."""

    every_n_epochs: COUNT = 5
    """a k-NN pass every this many epochs (and always at the end of training)"""
    at_start: bool = True
    """one pass at random init, the reference (summary: knn_top1_init)"""
    knn_k: COUNT = 20
    """neighbours that vote"""
    knn_temperature: POSITIVE = 0.07
    """the votes' temperature"""


class CheckpointSettings(Section):
    """``checkpoint``: checkpoints/last.ckpt after every epoch (written atomically), and more."""

    every_n_epochs: integer(1) | None = 10
    """keep a copy checkpoints/epoch=NNN.ckpt every this many epochs (null: last.ckpt only)"""
    every_n_steps: integer(1) | None = None
    """also write last.ckpt every this many optimiser steps inside an epoch (a resume continues at that step exactly); null: at epoch ends only"""


class LimitsSettings(Section):
    """``limits``: nothing waits forever (docs/distributed.md "Stuck runs")."""

    wait_s: POSITIVE = 600
    """a rank that waits longer for the other ranks (a collective) or for a batch from its loader workers fails the run, naming what it waited for (the first step of a large model must fit in it)"""
    stop_grace_s: POSITIVE = 45
    """after SIGTERM or Ctrl-C, a process that has not stopped at a step within this long exits with 128 + signal anyway"""


class AnalysisSettings(Section):
    """``analysis``: the hard-view analysis (paper section 6; docs/analysis.md)."""

    online: bool = True
    """analysis/* statistics every step (also <run_dir>/analysis/steps-r0.csv)"""
    log_every_n_steps: integer(1) | None = None
    """every view and candidate pair of every K-th batch to Parquet under <run_dir>/analysis/ (null: off)"""
    flush_every_n_logs: COUNT = 20
    """a Parquet part file every this many logged batches (and at the end)"""


class BudgetSettings(Section):
    """``budget``: how long the run trains, as model FLOPs instead of epochs (docs/configuration.md
    "A compute budget instead of epochs"). Either key sets ``trainer.max_epochs`` at start-up, in
    place of the preset's: the whole epochs whose model FLOPs, counted for this run's step, come
    closest (hvp_lightning/training/budget.py)."""

    flops: POSITIVE | None = None
    """model FLOPs the run trains for (summary.json cost.total_flops counts them: every image's training step, and HVP's selection on its selecting steps), e.g. 2.5e13; null: trainer.max_epochs decides"""
    match: str | None = None
    """a run dir: train for as many model FLOPs as that run did (its summary.json cost.total_flops), e.g. the baseline at an HVP run's compute; null: none"""

    @property
    def sets_epochs(self) -> bool:
        """Whether a budget is given: it then sets ``trainer.max_epochs``."""
        return self.flops is not None or self.match is not None

    @model_validator(mode="after")
    def one_budget(self) -> BudgetSettings:
        """A number of FLOPs or a run's, not both (whether the run holds its FLOPs: on disk)."""
        if self.flops is not None and self.match is not None:
            fail("budget.match", self.match, f"null when budget.flops is set ({self.flops:g}): the budget is a "
                 "number of FLOPs or a run's, not both")  # fmt: skip
        return self


class TrainConfig(Section):
    """``train.py``'s whole config: the top-level keys and every group."""

    seed: SEED = 0
    """the run's seed (views, initialisation, selection's random choices)"""
    resume: str | None = None
    """a run dir to continue with its own config (key=value overrides such as trainer.max_epochs still apply); a run dir holding checkpoints/last.ckpt is resumed automatically"""
    method: MethodSection
    backbone: BackboneSettings
    data: DataSettings
    trainer: TrainerSettings
    logger: LoggerSettings
    hvp: HVPSection | None = None
    eval: KnnMonitorSettings = KnnMonitorSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    limits: LimitsSettings = LimitsSettings()
    analysis: AnalysisSettings = AnalysisSettings()
    budget: BudgetSettings = BudgetSettings()

    @property
    def hvp_on(self) -> bool:
        """Whether the run selects hard views: an ``hvp`` section (``+hvp=on``), enabled."""
        return self.hvp is not None and self.hvp.enabled

    @model_validator(mode="after")
    def rules(self) -> TrainConfig:
        """The rules that tie keys of several groups together (:data:`TRAIN_RULES`), every one run."""
        return every_rule(self, TRAIN_RULES)


# --- the rules of a training config that tie its groups together, each once ----------------------
def check_train_crops_set(s: TrainConfig) -> None:
    """``null`` crop size and crop ratio are transfer.py's ("the checkpoint's"), not a training run's."""
    for key in ("crop_size", "eval_crop_ratio"):
        if getattr(s.data, key) is None:
            fail(f"data.{key}", None, f"{'an integer >= 1' if key == 'crop_size' else 'a number in (0, 1]'} or auto "
                 "(null is transfer.py's: the checkpoint's)")  # fmt: skip


def check_multicrop(s: TrainConfig) -> None:
    """DINO/iBOT: a ViT's local crops are a multiple of its patch (a timm ViT's: checked against timm
    at start-up, hvp_lightning/config.py ``check_timm_backbone``)."""
    m, b = s.method, s.backbone
    if (
        m.name in MULTI_CROP
        and backbone_family(b) == "vit"
        and m.num_local_crops > 0
        and m.local_crop_size % b.patch_size
    ):
        fail(
            "method.local_crop_size",
            m.local_crop_size,
            f"a multiple of backbone.patch_size={b.patch_size} for {b.name}",
        )


def check_ibot_backbone(s: TrainConfig) -> None:
    """iBOT predicts masked patch tokens: a ViT (which timm models have tokens: checked against timm)."""
    if s.method.name == "ibot" and backbone_family(s.backbone) not in ("vit", TIMM_FAMILY):
        vits = ", ".join(n for n, f in BACKBONE_FAMILIES.items() if f == "vit")
        raise ConfigError(
            f"backbone.name={s.backbone.name!r} is not allowed for method=ibot: a ViT (patch tokens), "
            f"one of {vits} or a timm ViT (backbone=timm)"
        )


def check_method_hvp(s: TrainConfig) -> None:
    """HVP's keys against the method: a key the method would not read is refused
    (:meth:`~hvp_lightning.settings.MethodSettings.check_hvp`)."""
    if s.hvp is not None:
        method = to_settings(s.method, method_settings()[s.method.name])
        method.resolve_hvp(to_settings(s.hvp, HVP, tagged=False))


def check_iou_policy(s: TrainConfig) -> None:
    """``data.iou_policy``'s warm-up is shorter than the run (its schedule spans the other epochs).
    Under a budget the epochs are known once it is counted: checked then (training/budget.py)."""
    p = s.data.iou_policy
    if p is not None and p.enabled and not s.budget.sets_epochs:
        check_iou_warmup(p.warmup_epochs, s.trainer.max_epochs)


def check_iou_warmup(warmup: int, epochs: int, whose: str = "trainer.max_epochs") -> None:
    if warmup > epochs - 1:
        fail(
            "data.iou_policy.warmup_epochs", warmup, f"an integer in [0, {epochs - 1}] (shorter than {whose}={epochs})"
        )


def check_budget_steps(s: TrainConfig) -> None:
    """A budget sets ``trainer.max_epochs``: not beside ``trainer.max_steps``, which would end the
    run before the epochs the budget sets."""
    extra = trainer_extras(s.trainer)
    if (
        s.budget.sets_epochs and extra.get("max_steps", -1) != -1
    ):  # an undeclared Trainer argument: -1 is Lightning's unset
        fail("trainer.max_steps", extra["max_steps"], "-1 (unset) with a budget: the budget sets trainer.max_epochs, "
             "and a step limit would end the run before them")  # fmt: skip


def check_backbone_crop(s: TrainConfig) -> None:
    """The training crop fits the built-in backbone (a timm model's: checked against timm; ``auto``:
    once it is resolved from the images, hvp_lightning/config.py ``check_crops``)."""
    if isinstance(s.data.crop_size, int):
        check_crop_for_backbone(s.backbone, s.data.crop_size)


def smallest_resnet_side(b: ResNetSettings) -> int:
    """The smallest image side a built-in ResNet takes: its trunk downsamples 8x (CIFAR stem) or 32x."""
    return 8 if b.cifar_stem else 32


def check_crop_for_backbone(b: Any, crop: int) -> None:
    """``crop`` (``data.crop_size``) fits the built-in backbone ``b`` (a timm model's: checked against timm)."""
    family = backbone_family(b)
    if family == "resnet":
        smallest = smallest_resnet_side(b)
        if crop < smallest:
            fail("data.crop_size", crop, f">= {smallest} px for {b.name} with cifar_stem={b.cifar_stem}")
    elif family == "vit" and crop % b.patch_size:
        fail("data.crop_size", crop, f"a multiple of backbone.patch_size={b.patch_size} for {b.name}")


# the rules of a training config over several groups, each once; run in this order, all of them
# (a group's own rules are its section's validators: trainer, budget, backbone, method, hvp)
TRAIN_RULES = (
    check_train_crops_set,
    check_multicrop,
    check_ibot_backbone,
    check_method_hvp,
    check_iou_policy,
    check_budget_steps,
    check_backbone_crop,
)


def trainer_extras(trainer: TrainerSettings) -> dict[str, Any]:
    """The ``+trainer.*`` keys beyond the declared ones (Lightning's other arguments)."""
    return dict(trainer.model_extra or {})
