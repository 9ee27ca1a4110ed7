"""The rules table (hvp_lightning/config_rules.py): a wrong type or an out-of-range value is one
message naming the key at start-up -- these values used to crash after the heavy imports, inside
the checks themselves, or train on a wrong objective -- and a key no preset defines is refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from hvp_lightning.config import check_options, validate
from hvp_lightning.config_rules import RULES, Rule, check_rules, preset_keys
from hvp_lightning.errors import ConfigError
from tests.conftest import make_cfg

REPO = Path(__file__).resolve().parents[1]
VIT = ("backbone=vit_tiny_cifar", "data.crop_size=16", "method.local_crop_size=8")

BAD = [
    # (overrides, the key the message names): each crashed later or trained as told before
    (("method=simclr_cifar", "method.temperature=abc"), "method.temperature"),
    (("method=simclr_cifar", "method.temperature=-1"), "method.temperature"),  # trained on -loss
    (("method.proj_dim=0",), "method.proj_dim"),
    (("method.optimizer.weight_decay=-1",), "method.optimizer.weight_decay"),
    (("method.optimizer.momentum=5",), "method.optimizer.momentum"),  # trained to k-NN 0%
    (("method.optimizer.warmup_epochs=abc",), "method.optimizer.warmup_epochs"),
    (("method.optimizer.base_lr=abc",), "method.optimizer.base_lr"),  # TypeError in the check
    (("data.std=[0,0,0]",), "data.std"),
    (("data.mean=[0.5]",), "data.mean"),
    (("data.eval_crop_ratio=0",), "data.eval_crop_ratio"),  # ZeroDivisionError after training
    (("data.image_size=0",), "data.image_size"),
    (("data.aug.scale=[0.5]",), "data.aug.scale"),
    (("data.aug.scale=abc",), "data.aug.scale"),
    (("trainer.log_every_n_steps=abc",), "trainer.log_every_n_steps"),
    (("trainer.accelerator=tpu",), "trainer.accelerator"),  # torch_xla missing, after the imports
    (("eval.knn_temperature=abc",), "eval.knn_temperature"),
    (("backbone.cifar_stem=maybe",), "backbone.cifar_stem"),
    (("+hvp=on", "hvp.enabled=abc"), "hvp.enabled"),  # a string counted as true
    (("method=dino_cifar", *VIT, "method.global_scale=[0.5]"), "method.global_scale"),
    (("method=dino_cifar", *VIT, "method.num_local_crops=abc"), "method.num_local_crops"),
    (("method=dino_cifar", *VIT, "method.num_local_crops=1.5"), "method.num_local_crops"),  # was int(1.5)
    (("method=ibot_cifar", *VIT, "method.lambda1=abc"), "method.lambda1"),
    (("method=ibot_cifar", *VIT, "method.mask_ratio=[0.1]"), "method.mask_ratio"),
    (("method=dino_cifar", "+hvp=on", *VIT, "hvp.num_global_candidates=abc"), "hvp.num_global_candidates"),
    (("method=dino_cifar", "+hvp=on", *VIT, "hvp.num_global_candidates=2.7"), "hvp.num_global_candidates"),
    (("method.optimizer.base_lr=inf",), "method.optimizer.base_lr"),
    (("data.eval_crop_ratio=null",), "data.eval_crop_ratio"),  # transfer.py's null; training divided by it
    # Hydra's own advice for a misspelt key (`+`) let it in, ignored
    (("+method.temprature=0.5",), "method.temprature"),
    (("+hvp=on", "+hvp.num_view=8"), "hvp.num_view"),
    # DINO/iBOT-only candidate keys on a pair method were ignored
    (("+hvp=on", "hvp.num_global_candidates=4"), "hvp.num_global_candidates"),
    (("+hvp=on", "hvp.num_local_candidates=4"), "hvp.num_local_candidates"),
    (("+hvp=on", "hvp.global_pairs=all"), "hvp.global_pairs"),
]


@pytest.mark.parametrize("overrides, key", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_a_bad_value_is_one_message_naming_its_key(overrides: tuple[str, ...], key: str) -> None:
    cfg = make_cfg(*overrides)
    with pytest.raises(ConfigError) as err:
        check_options(cfg)
    assert str(err.value).startswith(f"{key}=") or str(err.value).startswith(f"{key} "), str(err.value)
    assert "\n" not in str(err.value)


def test_a_misspelt_key_is_answered_with_the_key_meant() -> None:
    with pytest.raises(ConfigError, match=r"did you mean method\.temperature\?"):
        check_options(make_cfg("method=simclr_cifar", "+method.temprature=0.5"))
    with pytest.raises(ConfigError, match=r"did you mean hvp\.num_views\?"):
        check_options(make_cfg("+hvp=on", "+hvp.num_view=8"))


@pytest.mark.parametrize("preset", sorted(p.stem for p in (REPO / "conf" / "method").glob("*.yaml")))
def test_every_method_preset_passes_the_rules_with_and_without_hvp(preset: str) -> None:
    if preset.startswith(("dino", "ibot")):
        extra = VIT
    else:  # the preset's own network at the tiny crop
        extra = ("backbone=vit_tiny_cifar",) if "vit" in preset else ("backbone=resnet18_cifar",)
    for hvp in ((), ("+hvp=on",)):
        cfg = make_cfg(f"method={preset}", *extra, *hvp)
        check_rules(cfg)
        check_options(cfg)


def _leaf_values(node: DictConfig, prefix: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in node.items_ex(resolve=False):
        if isinstance(value, DictConfig):
            out |= _leaf_values(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


# keys whose values are names or cross-key settings, checked by hvp_lightning/config.py itself
CHECKED_ELSEWHERE = {
    "method.name",
    "method.optimizer.name",
    "method.clip_grad_kind",
    "hvp.mode",
    "hvp.selection_precision",
    "hvp.colour",
    "hvp.global_pairs",
    "data.name",
    "data.root",
    "data.files",
    "data.eval_root",
    "data.crop_size",
    "data.aug.blur_kind",
    "data.aug.interpolation",
}


def test_the_table_covers_every_number_and_flag_of_the_method_and_hvp_presets() -> None:
    """A key added to a preset gets its rule, or a wrong value of it crashes later again."""
    conf = REPO / "conf"
    leaves: dict[str, object] = {}
    for path in sorted((conf / "method").glob("*.yaml")):
        node = OmegaConf.load(path)
        node.pop("defaults", None)
        leaves |= _leaf_values(node, "method.")
    leaves |= _leaf_values(OmegaConf.load(conf / "hvp" / "on.yaml"), "hvp.")
    for name in ("synthetic", "images"):
        node = OmegaConf.load(conf / "data" / f"{name}.yaml")
        node.pop("defaults", None)
        leaves |= _leaf_values(node, "data.")
    leaves |= _leaf_values(OmegaConf.load(conf / "data" / "aug" / "simclr.yaml"), "data.aug.")
    missing = sorted(k for k in leaves if k not in RULES and k not in CHECKED_ELSEWHERE)
    assert not missing, f"keys without a rule: {missing}"


def test_every_rule_names_a_key_some_config_defines() -> None:
    """No dead rules: each key of the table is in conf/ (a renamed key would leave its rule unused)."""
    conf = REPO / "conf"
    defined: set[str] = set()
    for path in conf.rglob("*.yaml"):
        node = OmegaConf.load(path)
        if not isinstance(node, DictConfig):
            continue
        node.pop("defaults", None)
        group = path.parent.relative_to(conf).parts
        prefix = "" if not group or group[0] in ("experiment", "hydra") else ".".join(group) + "."
        # a preset's keys sit under its group; the top-level config and experiments give full paths
        defined |= {f"{prefix}{k}" for k in _leaf_values(node, "")}
    unused = sorted(k for k in RULES if k not in defined)
    assert not unused, f"rules for keys no config defines: {unused}"


@pytest.mark.parametrize(
    "rule, good, bad",
    [
        (Rule("number", low=0, open_low=True), [1e-9, 3, 0.5], [0, -1, "1", True, float("nan"), None, [1]]),
        (Rule("int", low=1, nullable=True), [1, 7, None], [0, 1.0, 2.5, "2", False]),
        (Rule("number", low=0, high=1, open_high=True), [0, 0.99], [1, 1.5, -0.1]),
        (Rule("pair", low=0, high=1, open_low=True), [[0.1, 1.0], [0.5, 0.5]], [[0.5, 0.1], [0, 1], [0.5], 0.5]),
        (Rule("pair", low=0, high=1, ordered=False), [[1.0, 0.1]], [[1.0, 1.1]]),
        (Rule("triple", low=0, open_low=True), [[0.2, 0.2, 0.2]], [[0.2, 0.2], [0.2, 0.0, 0.2]]),
        (Rule("bool"), [True, False], ["true", 1, None]),
    ],
)
def test_a_rule_accepts_exactly_its_type_and_range(rule: Rule, good: list, bad: list) -> None:
    assert all(rule.accepts(v) for v in good), [v for v in good if not rule.accepts(v)]
    assert not any(rule.accepts(v) for v in bad), [v for v in bad if rule.accepts(v)]
    assert rule.allowed().startswith("true or false" if rule.kind == "bool" else "expected ")


def test_a_resumed_config_with_keys_of_an_older_version_is_not_refused() -> None:
    """Known keys come from today's presets; a run dir of an older version may hold others."""
    cfg = make_cfg("+method.an_old_key=1")
    with pytest.raises(ConfigError, match="method.an_old_key"):
        check_options(cfg)
    check_options(make_cfg("+method.an_old_key=1", "resume=somewhere"))  # the resumed run's check


def test_known_keys_are_those_of_every_preset_of_the_method() -> None:
    keys = preset_keys("method")
    assert "temperature" in keys["simclr"] and "temperature" not in keys["simsiam"]
    assert "hvp_max_combinations" in keys["dino"] and "optimizer.min_lr" in keys["dino"]


def test_a_warm_up_as_long_as_the_run_is_said_at_start_up(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hvp_lightning.config"):
        validate(make_cfg("method.optimizer.warmup_epochs=3", "trainer.max_epochs=3"))
    assert "method.optimizer.warmup_epochs=3 is not shorter than trainer.max_epochs=3" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hvp_lightning.config"):
        validate(make_cfg("method.optimizer.warmup_epochs=2", "trainer.max_epochs=3"))
    assert "warmup_epochs" not in caplog.text


@pytest.mark.parametrize(
    "overrides",
    [
        ("method.optimizer.warmup_epochs=0.5",),  # warm-up steps = epochs x steps per epoch
        ("method=dino_cifar", *VIT, "method.optimizer.name=sgd", "+method.optimizer.momentum=0.9"),
        ("method=simsiam_cifar", "method.optimizer.name=lars", "+method.optimizer.eta=0.001"),
    ],
    ids=["fractional warm-up", "dino with sgd's momentum", "simsiam with lars's eta"],
)
def test_values_and_keys_the_code_reads_for_any_method_are_allowed(overrides: tuple[str, ...]) -> None:
    check_options(make_cfg(*overrides))
