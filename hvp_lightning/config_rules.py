"""The type and range of every plain config value, as a table, checked before anything compares
or converts it: a string where a number belongs (``method.temperature=abc``) or a number out of
range (``method.optimizer.momentum=5``) ends in one message naming the key, instead of a
traceback after the heavy imports or a run that trains on a wrong objective. And the keys that
exist: a key added with ``+`` under ``method`` or ``hvp`` that no preset defines (a typo
Hydra's own advice lets in: ``+method.temprature=0.5``) would be ignored without a word.

:mod:`hvp_lightning.config` runs these first; its own checks then see values of the right type
and check what depends on several keys. Torch-free, like it.
"""

from __future__ import annotations

import difflib
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from .errors import ConfigError
from .options import ACCELERATORS


def config_dir() -> Path:
    """The Hydra config folder: shipped inside an installed wheel as ``hvp_lightning/conf``, else
    the repository's top-level ``conf/`` (one copy of the configs: pyproject.toml)."""
    package = Path(__file__).resolve().parent
    shipped = package / "conf"
    return shipped if shipped.is_dir() else package.parent / "conf"


@dataclass(frozen=True)
class Rule:
    """One value's type and range. ``kind``: ``int``, ``number``, ``bool``, ``pair`` (two numbers
    min <= max, each in range: crop scales) or ``triple`` (three numbers: per-channel mean/std).
    ``low``/``high`` bound each number; ``open_low``/``open_high`` exclude the bound; ``ordered``:
    a pair is a range (min <= max), not two values (one per DINO global pipeline); ``words``: names
    allowed besides (``auto``: resolved once the data is known)."""

    kind: str
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    nullable: bool = False
    ordered: bool = True
    words: tuple[str, ...] = ()

    def range_text(self) -> str:
        """The bounds in words, e.g. `` in (0, 1]`` or `` >= 0``."""
        if self.low is not None and self.high is not None:
            left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
            return f" in {left}{_num(self.low)}, {_num(self.high)}{right}"
        if self.low is not None:
            return f" {'>' if self.open_low else '>='} {_num(self.low)}"
        if self.high is not None:
            return f" {'<' if self.open_high else '<='} {_num(self.high)}"
        return ""

    def allowed(self) -> str:
        """What the message after "is not allowed:" says."""
        text = {
            "int": f"an integer{self.range_text()}",
            "number": f"a number{self.range_text()}",
            "bool": "",
            "pair": (
                f"two numbers [min, max], min <= max, each{self.range_text()}"
                if self.ordered
                else f"two numbers, each{self.range_text()}"
            ),
            "triple": f"three numbers (one per channel), each{self.range_text()}",
        }[self.kind]
        alternatives = [*self.words, *(["null"] if self.nullable else [])]
        if self.kind == "bool":  # the wording of every other true/false key's message
            return "true or false" + "".join(f" or {w}" for w in alternatives)
        return f"expected {text}" + "".join(f" or {w}" for w in alternatives)

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (as OmegaConf gives it) has this rule's type and range; NaN and inf never do."""
        if value is None:
            return self.nullable
        if isinstance(value, str) and value in self.words:
            return True
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind in ("pair", "triple"):
            size = 2 if self.kind == "pair" else 3
            items = list(value) if isinstance(value, (ListConfig, list, tuple)) else None
            return (
                items is not None
                and len(items) == size
                and all(self._number_ok(v) for v in items)
                and (self.kind != "pair" or not self.ordered or items[0] <= items[1])
            )
        return self._number_ok(value)

    def _number_ok(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.kind == "int" and not isinstance(value, int):
            return False
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.open_high else value > self.high))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


POSITIVE = Rule("number", low=0, open_low=True)
NON_NEGATIVE = Rule("number", low=0)
PROBABILITY = Rule("number", low=0, high=1)
MOMENTUM = Rule("number", low=0, high=1)  # EMA and centre momenta: 1 freezes, which is allowed
COUNT = Rule("int", low=1)
COUNT_OR_ZERO = Rule("int", low=0)
BOOL = Rule("bool")

# Every key here is checked where the config has it (a method's keys only with that method).
# Cross-key rules (a scale within the crop, candidates >= crops, a warm-up shorter than the
# run) stay in hvp_lightning/config.py.
RULES: dict[str, Rule] = {
    "method.batch_size": Rule("int", low=2),  # BatchNorm heads need >= 2 samples
    "method.compile": BOOL,
    # heads
    **{
        f"method.{k}": COUNT
        for k in (
            "proj_dim",
            "proj_hidden_dim",
            "pred_hidden_dim",
            "proj_layers",
            "pred_layers",
            "out_dim",
            "patch_out_dim",
            "head_hidden_dim",
            "bottleneck_dim",
            "head_layers",
        )
    },
    **{
        f"method.{k}": BOOL
        for k in (
            "proj_last_bn",
            "pred_last_bn",
            "norm_last_layer",
            "use_bn_in_head",
            "shared_head",
            "teacher_reuse",
            "fix_pred_lr",
        )
    },
    # loss temperatures and weights
    **{
        f"method.{k}": POSITIVE
        for k in (
            "temperature",
            "teacher_temp",
            "warmup_teacher_temp",
            "student_temp",
            "teacher_patch_temp",
            "warmup_teacher_patch_temp",
        )
    },
    **{f"method.{k}": NON_NEGATIVE for k in ("lambda1", "lambda2", "sim_coeff", "std_coeff", "cov_coeff", "lambd")},
    # teachers and targets
    **{f"method.{k}": MOMENTUM for k in ("momentum_teacher", "center_momentum", "center_momentum2", "base_momentum")},
    "method.warmup_teacher_temp_epochs": COUNT_OR_ZERO,
    "method.freeze_last_layer": COUNT_OR_ZERO,
    "method.clip_grad": Rule("number", low=0, nullable=True),
    "method.hvp_max_combinations": Rule("int", low=1, nullable=True),
    # multi-crop views (DINO/iBOT)
    "method.num_local_crops": COUNT_OR_ZERO,
    "method.local_crop_size": COUNT,
    "method.global_scale": Rule("pair", low=0, high=1, open_low=True),
    "method.local_scale": Rule("pair", low=0, high=1, open_low=True),
    "method.global_blur_p": Rule("pair", low=0, high=1, ordered=False),  # one per global pipeline
    "method.global_solarize_p": Rule("pair", low=0, high=1, ordered=False),
    "method.local_blur_p": PROBABILITY,
    "method.jitter_saturation": NON_NEGATIVE,
    # iBOT masking
    "method.mask_ratio": Rule("pair", low=0, high=1),
    "method.mask_prob": PROBABILITY,
    "method.mask_min_aspect": Rule("number", low=0, high=1, open_low=True),
    # optimiser and schedule
    "method.optimizer.base_lr": POSITIVE,
    "method.optimizer.base_lr_biases": POSITIVE,
    "method.optimizer.weight_decay": NON_NEGATIVE,
    "method.optimizer.weight_decay_end": NON_NEGATIVE,
    "method.optimizer.momentum": Rule("number", low=0, high=1, open_high=True),
    "method.optimizer.eta": POSITIVE,
    "method.optimizer.warmup_epochs": NON_NEGATIVE,  # fractions allowed: warm-up steps = epochs x steps per epoch
    "method.optimizer.min_lr": Rule("number", low=0, nullable=True),
    "method.optimizer.final_lr_ratio": Rule("number", low=0, high=1, nullable=True),
    # data
    "data.image_size": COUNT,
    "data.train_size": Rule("int", low=2),
    "data.test_size": COUNT,
    "data.seed": Rule("int", low=0, high=2**32 - 1),
    "data.num_workers": Rule("int", low=0, words=("auto",)),  # auto: the machine's (hvp_lightning/device.py)
    "data.train_subset": Rule("int", low=1, nullable=True),
    "data.test_subset": Rule("int", low=1, nullable=True),
    "data.monitor_size": COUNT_OR_ZERO,
    "data.on_device": BOOL,
    "data.download": BOOL,
    # auto: by the images' size; null: transfer.py's "the checkpoint's" (conf/transfer.yaml)
    "data.eval_crop_ratio": Rule("number", low=0, high=1, open_low=True, nullable=True, words=("auto",)),
    "data.mean": Rule("triple", low=0, high=1),
    "data.std": Rule("triple", low=0, open_low=True),
    "data.aug.scale": Rule("pair", low=0, high=1, open_low=True),
    **{f"data.aug.{k}": PROBABILITY for k in ("flip_p", "jitter_p", "gray_p", "blur_p", "solarize_p")},
    **{f"data.aug.{k}": NON_NEGATIVE for k in ("brightness", "contrast", "saturation")},
    "data.aug.hue": Rule("number", low=0, high=0.5),  # torchvision's ColorJitter: hue <= 0.5
    # backbone
    "backbone.width": COUNT,
    "backbone.patch_size": COUNT,
    "backbone.cifar_stem": BOOL,
    "backbone.zero_init_residual": BOOL,
    "backbone.channels_last": BOOL,
    "backbone.init_student": BOOL,
    "backbone.img_size": Rule("int", low=1, nullable=True),
    "backbone.drop_path_rate": Rule("number", low=0, high=1, open_high=True),
    # HVP
    "hvp.enabled": BOOL,
    "hvp.num_views": Rule("int", low=2),
    "hvp.every_n_steps": COUNT,
    "hvp.num_global_candidates": Rule("int", low=2, nullable=True),
    "hvp.num_local_candidates": Rule("int", low=0, nullable=True),
    "hvp.max_combinations": Rule("int", low=1, nullable=True),
    # trainer, monitors, checkpoints
    "trainer.max_epochs": COUNT,
    "trainer.log_every_n_steps": COUNT,
    "trainer.accumulate_grad_batches": Rule("int", low=1, nullable=True),
    "trainer.num_nodes": Rule("int", low=1, nullable=True),
    "eval.every_n_epochs": COUNT,
    "eval.knn_k": COUNT,
    "eval.knn_temperature": POSITIVE,
    "eval.at_start": BOOL,
    "checkpoint.every_n_epochs": Rule("int", low=1, nullable=True),
    "checkpoint.every_n_steps": Rule("int", low=1, nullable=True),
    "analysis.online": BOOL,
    "analysis.log_every_n_steps": Rule("int", low=1, nullable=True),
    "analysis.flush_every_n_logs": Rule("int", low=1, nullable=True),
}


def _value(cfg: DictConfig, key: str) -> tuple[bool, Any]:
    """(present, value): missing keys (older run dirs, other methods) are not checked."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False, None
        node = node[part]
    return True, node


def check_rules(cfg: DictConfig, rules: dict[str, Rule] | None = None) -> None:
    """Raise :class:`ConfigError` on the first value of ``rules`` (default :data:`RULES`) present
    in ``cfg`` with the wrong type or out of range."""
    for key, rule in (RULES if rules is None else rules).items():
        present, value = _value(cfg, key)
        if present and not rule.accepts(value):
            shown = list(value) if isinstance(value, ListConfig) else value
            raise ConfigError(f"{key}={shown!r} is not allowed: {rule.allowed()}")
    present, accelerator = _value(cfg, "trainer.accelerator")
    if present and accelerator not in ACCELERATORS:
        raise ConfigError(
            f"trainer.accelerator={accelerator!r} is not allowed: one of {', '.join(ACCELERATORS)} "
            "(TPUs and other XLA devices are not supported)"
        )


@functools.cache
def preset_keys(group: str) -> dict[str, frozenset[str]]:
    """The dotted keys each preset of a config group defines, by the preset's ``name`` (several
    presets share a method: simclr, simclr_cifar, simclr_demo), ``""`` for nameless groups."""
    keys: dict[str, set[str]] = {}
    for path in sorted((config_dir() / group).glob("*.yaml")):
        node = OmegaConf.load(path)
        node.pop("defaults", None)
        keys.setdefault(str(node.get("name", "")), set()).update(_leaves(node))
    return {name: frozenset(k) for name, k in keys.items()}


def _leaves(node: DictConfig, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for key, value in node.items_ex(resolve=False):
        out |= _leaves(value, f"{prefix}{key}.") if isinstance(value, DictConfig) else {f"{prefix}{key}"}
    return out


# method keys every method reads whatever its presets define: conf/config.yaml's ``compile``,
# where the cosine ends (either key: hvp_lightning/config.py _validate_lr_end says which), and the
# optimiser's own settings (methods/base.py configure_optimizers)
GENERIC_METHOD_KEYS = frozenset(
    {"compile", "optimizer.min_lr", "optimizer.final_lr_ratio", "optimizer.momentum", "optimizer.eta"}
)  # momentum, eta: SGD's and LARS's, read for any method whose optimizer.name picks them


def check_known_keys(cfg: DictConfig) -> None:
    """Every key under ``method`` is one some preset of that method defines, and every key under
    ``hvp`` one of conf/hvp/on.yaml's: the code reads only those, so any other is a typo that
    would change nothing (Hydra refuses an unknown key without ``+`` and then suggests the ``+``)."""
    method = cfg.get("method")
    if isinstance(method, DictConfig) and isinstance(method.get("name"), str):
        known = preset_keys("method").get(method.name, frozenset()) | GENERIC_METHOD_KEYS
        _refuse_unknown("method", _leaves(method), known, f"method {method.name}")
    hvp = cfg.get("hvp")
    if isinstance(hvp, DictConfig) and "enabled" in hvp:
        _refuse_unknown("hvp", _leaves(hvp), preset_keys("hvp").get("", frozenset()), "+hvp=on")


def _refuse_unknown(group: str, keys: set[str], known: frozenset[str], owner: str) -> None:
    for key in sorted(keys - known):
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f"did you mean {group}.{close[0]}? " if close else ""
        raise ConfigError(
            f"{group}.{key} is not allowed: not a key of {owner}, so it would change nothing ({hint}"
            f"keys: {', '.join(sorted(known))})"
        )
