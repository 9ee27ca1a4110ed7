"""Every config key declared once (hvp_lightning/schema/): a wrong type or an out-of-range value is
one line naming the key, every problem of a command at once, an unknown key the closest declared
one (with or without ``+``); presets compose to the values they had before the schema; a key added
in one place is validated, listed by ``--help`` and reaches the code that reads it."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from hvp_lightning.cli import checked_command_line
from hvp_lightning.config import check_options, validate
from hvp_lightning.errors import ConfigError
from hvp_lightning.schema import TrainConfig, compose, describe, help_listing, train_settings
from hvp_lightning.schema.base import COUNT, POSITIVE, UNIT_RANGE, Section, as_dict, checked, integer, numbers
from tests.conftest import REPO, SUBPROCESS_TIMEOUT_S, images_run, make_cfg, tiered, write_images, write_plain_shards

VIT = ("backbone=vit_tiny_cifar", "data.crop_size=16", "method.local_crop_size=8")

BAD = [
    # (overrides, the key the message names): each crashed later or trained as told before
    (("method=simclr_cifar", "method.temperature=abc"), "method.temperature"),
    (("method=simclr_cifar", "method.temperature=-1"), "method.temperature"),  # trained on -loss
    (("method.proj_dim=0",), "method.proj_dim"),
    (("method.optimizer.weight_decay=-1",), "method.optimizer.weight_decay"),
    (("method.optimizer.momentum=5",), "method.optimizer.momentum"),  # trained to k-NN 0%
    (("method.optimizer.warmup_epochs=abc",), "method.optimizer.warmup_epochs"),
    (("method.optimizer.base_lr=abc",), "method.optimizer.base_lr"),
    (("method.optimizer.name=adam",), "method.optimizer.name"),
    (("data.std=[0,0,0]",), "data.std"),
    (("data.mean=[0.5]",), "data.mean"),
    (("data.eval_crop_ratio=0",), "data.eval_crop_ratio"),  # ZeroDivisionError after training
    (("data.image_size=0",), "data.image_size"),
    (("data.aug.scale=[0.5]",), "data.aug.scale"),
    (("data.aug.scale=[0.9,0.5]",), "data.aug.scale"),
    (("data.aug.scale=abc",), "data.aug.scale"),
    (("data.aug.blur_kind=gauss",), "data.aug.blur_kind"),
    (("data.name=bad",), "data.name"),
    (("trainer.log_every_n_steps=abc",), "trainer.log_every_n_steps"),
    (("trainer.accelerator=tpu",), "trainer.accelerator"),  # torch_xla missing, after the imports
    (("trainer.max_epochs=2.7",), "trainer.max_epochs"),  # was truncated to 2
    (("eval.knn_temperature=abc",), "eval.knn_temperature"),
    (("backbone.cifar_stem=maybe",), "backbone.cifar_stem"),  # was taken as true
    (("backbone.name=resnet19",), "backbone.name"),
    (("method.name=nope",), "method.name"),
    (("seed=-5",), "seed"),
    (("limits.wait_s=0",), "limits.wait_s"),
    (("logger=wandb", "logger.mode=sometimes"), "logger.mode"),
    (("+hvp=on", "hvp.enabled=abc"), "hvp.enabled"),  # a string counted as true
    (("+hvp=on", "hvp.mode=hardest"), "hvp.mode"),
    (("+hvp=on", "hvp.num_views=1"), "hvp.num_views"),
    (("method=dino_cifar", *VIT, "method.global_scale=[0.5]"), "method.global_scale"),
    (("method=dino_cifar", *VIT, "method.num_local_crops=1.5"), "method.num_local_crops"),  # was int(1.5)
    (("method=dino_cifar", *VIT, "method.clip_grad_kind=both"), "method.clip_grad_kind"),
    (("method=ibot_cifar", *VIT, "method.mask_ratio=[0.1]"), "method.mask_ratio"),
    (("method=dino_cifar", "+hvp=on", *VIT, "hvp.num_global_candidates=2.7"), "hvp.num_global_candidates"),
    (("method.optimizer.base_lr=inf",), "method.optimizer.base_lr"),
    (("data.eval_crop_ratio=null",), "data.eval_crop_ratio"),  # transfer.py's null; training divided by it
    (("+method.temprature=0.5",), "method.temprature"),  # Hydra's own advice for a misspelt key
    (("+hvp=on", "+hvp.num_view=8"), "hvp.num_view"),
    (("+backbone.int=weights.pth",), "backbone.int"),  # trained from random init without a word
    (("+data.crop_sise=64",), "data.crop_sise"),
    (("+sed=1",), "sed"),
    (("+hvp.num_views=8",), "hvp.num_views"),  # without +hvp=on: a baseline run
    # cross-key rules (hvp_lightning/config.py), each in one place
    (("+hvp=on", "hvp.num_global_candidates=4"), "hvp.num_global_candidates"),  # DINO/iBOT only
    (("+hvp=on", "hvp.global_pairs=all"), "hvp.global_pairs"),
    (("+hvp=on", "hvp.max_combinations=8"), "hvp.max_combinations"),
    (("method=dino_cifar", *VIT, "+hvp=on", "hvp.num_local_candidates=1"), "hvp.num_local_candidates"),
    (
        ("method=dino_cifar", "backbone=vit_tiny_cifar", "data.crop_size=16", "method.local_crop_size=6"),
        "method.local_crop_size",
    ),  # fmt: skip
    (("method=ibot_cifar", "backbone=resnet18_narrow"), "backbone.name"),  # iBOT needs a ViT
    (("method.optimizer.final_lr_ratio=null",), "method.optimizer.min_lr"),  # where the cosine ends
    (("+data/iou_policy=on", "data.iou_policy.warmup_epochs=1"), "data.iou_policy.warmup_epochs"),
    (("+trainer.plugins=[]",), "trainer.plugins"),
]


@pytest.mark.parametrize("overrides, key", tiered(BAD, 18, ids=[" ".join(o) for o, _ in BAD]))
def test_a_bad_value_is_one_line_naming_its_key(overrides: tuple[str, ...], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_options(make_cfg(*overrides))
    (line,) = str(err.value).splitlines()
    assert line.startswith((f"{key}=", f"{key} ")), line


def test_every_problem_of_a_command_is_said_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        check_options(
            make_cfg(
                "method=simclr_cifar", "method.temperature=abc", "method.proj_dim=0", "+data.crop_sise=64", "seed=-1"
            )
        )
    keys = sorted(line.split("=")[0].split(" ")[0] for line in str(err.value).splitlines())
    assert keys == ["data.crop_sise", "method.proj_dim", "method.temperature", "seed"]


def test_a_misspelt_key_names_the_key_meant_with_or_without_plus() -> None:
    with pytest.raises(ConfigError, match=r"did you mean method\.temperature\?"):
        check_options(make_cfg("method=simclr_cifar", "+method.temprature=0.5"))
    for plus in ("", "+"):  # the command line: Hydra itself refuses the key without + (in four lines)
        with pytest.raises(ConfigError, match=r"^data\.crop_sise is not allowed: .*did you mean data\.crop_size\?"):
            checked_command_line("config", ["logger=csv", f"{plus}data.crop_sise=64"])
    with pytest.raises(ConfigError, match=r"^method=simclrr is not allowed: one of .*did you mean method=simclr\?"):
        checked_command_line("config", ["method=simclrr"])
    with pytest.raises(ConfigError, match=r"^hvp\.num_views=8 is not allowed: set only with \+hvp=on"):
        checked_command_line("config", ["hvp.num_views=8"])
    with pytest.raises(ConfigError, match=r"^protocol\.epochs=0 is not allowed: an integer >= 1"):
        checked_command_line("eval", ["protocol=linear", "ckpt=x", "protocol.epochs=0"])
    # a Lightning argument the presets do not set needs no + either; a sweep is checked on its first value
    assert checked_command_line("config", ["trainer.gradient_clip_val=1"]) == ["+trainer.gradient_clip_val=1"]
    with pytest.raises(ConfigError, match=r"^seed=-1 "):
        checked_command_line("config", ["-m", "seed=-1,2"])


# Every method preset passes the start-up checks with and without +hvp=on: tests/test_experiments.py.


# Defaults changed on purpose since the fixture: the held-out monitor sample fits the data,
# loader workers are the machine's (eval.py and transfer.py: theirs too).
# values changed on purpose since the fixture: the CPU demo on 2048 textures for 7 epochs (the main job in under
# 3 minutes on the slowest 2-core machines), loader workers and monitor samples sized per machine
CHANGED = {"monitor_size": "auto", "num_workers": "auto", "train_size": 2048, "max_epochs": 7}


def _leaves(node: object, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    if isinstance(node, dict) and node:
        return {k: v for key, value in node.items() for k, v in _leaves(value, (*prefix, key)).items()}
    return {prefix: node}


def compose_one(case: str) -> tuple[str, DictConfig]:
    """The fixture's case (``EVAL protocol=linear``, ``method=dino +hvp=on``) composed: (config name, config)."""
    name, _, rest = case.partition(" ") if case.startswith(("EVAL", "TRANSFER")) else ("config", "", case)
    name = {"EVAL": "eval", "TRANSFER": "transfer"}.get(name, name)
    return name, hydra_compose(name, overrides=rest.split())


PRESETS_BEFORE = json.loads((REPO / "tests" / "fixtures" / "presets_resolved.json").read_text())


def part_of(case: str) -> str:
    """``methods``: a method preset alone, or +hvp=on alone; ``entries``: an experiment preset,
    eval.py's or transfer.py's config alone; ``rest``: the others and the presets with +hvp=on."""
    if case == "+hvp=on" or (case.startswith("method=") and not case.endswith("+hvp=on")):
        return "methods"
    if case.startswith(("+experiment=", "EVAL", "TRANSFER")) and not case.endswith("+hvp=on"):
        return "entries"
    return "rest"


@pytest.mark.parametrize(
    "part",
    [
        pytest.param("methods", id="method presets and +hvp=on"),
        pytest.param("entries", id="experiment presets, eval and transfer", marks=pytest.mark.slow),
        pytest.param("rest", id="the others, and the presets with +hvp=on", marks=pytest.mark.slow),
    ],
)
def test_every_preset_composes_to_the_values_it_had_before_the_schema(part: str) -> None:
    """tests/fixtures/presets_resolved.json holds the resolved config of every method, backbone, data,
    trainer, logger and experiment preset (with and without +hvp=on), eval.py's and transfer.py's,
    composed before the schema. Every value is still there; new keys carry the defaults the code
    used where a config lacked them; nothing else changed. (~0.1 s a composition: the method
    presets each alone in the default suite, the rest slow.)"""
    before = {case: old for case, old in PRESETS_BEFORE.items() if part_of(case) == part}
    changed = []
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        composed = {case: compose_one(case) for case in before}
    for case, old in before.items():
        name, cfg = composed[case]
        new = _leaves(OmegaConf.to_container(cfg, resolve=name == "config", throw_on_missing=False))
        for key, value in _leaves(old).items():
            if key[-1] in CHANGED and new.get(key) != value:
                assert new[key] == CHANGED[key[-1]], (case, key)
                changed.append(key[-1])
            elif new.get(key, "absent") != value:
                pytest.fail(f"{case}: {'.'.join(key)} was {value!r}, now {new.get(key, 'absent')!r}")
        if name == "config" and "???" not in str(new.values()):  # it passes the schema (a root to set aside)
            train_settings(cfg)
    # the default data and trainer meet theirs in the method presets; monitor_size: data=images
    met = {"methods": set(CHANGED) - {"monitor_size"}, "entries": set(), "rest": {"monitor_size"}}[part]
    assert met <= set(changed), f"{sorted(met - set(changed))} not met: the fixture's cases are missing"


@pytest.mark.parametrize(
    "annotation, good, bad, said",
    [
        (POSITIVE, [1e-9, 3, 0.5], [0, -1, "1", True, float("nan"), None, [1]], "a number > 0"),
        (integer(1) | None, [1, 7, None], [0, 1.0, 2.5, "2", False], "an integer >= 1 or null"),
        (
            UNIT_RANGE,
            [[0.1, 1.0], [0.5, 0.5]],
            [[0.5, 0.1], [0, 1], [0.5], 0.5],
            "two numbers [min, max], min <= max, each in (0, 1]",
        ),  # fmt: skip
        (numbers(2, 0, 1), [[1.0, 0.1]], [[1.0, 1.1]], "two numbers, each in [0, 1]"),
        (
            numbers(3, 0, open_low=True),
            [[0.2, 0.2, 0.2]],
            [[0.2, 0.2], [0.2, 0.0, 0.2]],
            "three numbers (one per channel), each > 0",
        ),  # fmt: skip
        (bool, [True, False], ["true", 1, None], "true or false"),
        (COUNT, [1, 2], [0, True], "an integer >= 1"),
    ],
)
def test_a_declaration_accepts_exactly_its_type_and_range_and_says_it(annotation, good, bad, said) -> None:
    class One(Section):
        value: annotation  # type: ignore[valid-type]

    for v in good:
        checked(One, {"value": v})
    for v in bad:
        with pytest.raises(ConfigError, match=r"^value=.* is not allowed: " + re.escape(said)):
            checked(One, {"value": v})
    assert describe(One.model_fields["value"].annotation, One.model_fields["value"].metadata) == said


def test_a_resumed_config_with_keys_of_an_older_version_is_read_without_them() -> None:
    cfg = make_cfg("+method.an_old_key=1")
    with pytest.raises(ConfigError, match="method.an_old_key"):
        check_options(cfg)
    out = check_options(make_cfg("+method.an_old_key=1", "resume=somewhere"))  # the resumed run's check
    assert "an_old_key" not in out.method.model_dump()


def test_the_validated_config_has_every_declared_key_with_its_type() -> None:
    out = check_options(make_cfg("method.optimizer.warmup_epochs=0"))
    assert out.method.optimizer.warmup_epochs == 0.0 and isinstance(out.method.optimizer.warmup_epochs, float)
    assert out.method.optimizer.eta == 0.001  # a default of the schema, not set by simsiam_cifar
    assert set(TrainConfig.model_fields) - {"hvp"} <= set(out.model_dump())


def test_what_is_written_has_every_key_and_an_absent_group_left_out_as_composed() -> None:
    """config.yaml and the checkpoint's config (``as_dict``): a null key stays (``resume: null``), an
    optional group not added (``hvp`` without ``+hvp=on``) is absent, as in the composed config."""
    base, hvp = make_cfg(), make_cfg("+hvp=on")
    written, written_hvp = as_dict(check_options(base)), as_dict(check_options(hvp))
    assert "hvp" not in base and "hvp" not in written and written["resume"] is None
    assert written_hvp["hvp"]["num_views"] == hvp.hvp.num_views and set(written_hvp) - set(written) == {"hvp"}


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
        ("method=dino_cifar", *VIT, "method.optimizer.name=sgd", "method.optimizer.momentum=0.9"),
        ("method=simsiam_cifar", "method.optimizer.name=lars", "method.optimizer.eta=0.001"),
    ],
    ids=["fractional warm-up", "dino with sgd's momentum", "simsiam with lars's eta"],
)
def test_values_and_keys_the_code_reads_for_any_method_are_allowed(overrides: tuple[str, ...]) -> None:
    check_options(make_cfg(*overrides))


def test_own_images_fit_a_held_out_sample_and_name_a_batch_that_fits(tmp_path: Path) -> None:
    """README "Your own images" on 96 images: the monitor sample (auto) fits and says what it held
    out; a preset's batch that cannot fit is said with every other such problem, each with a value
    that would work, before the heavy imports."""
    write_images(tmp_path, 96)
    base = images_run(["logger=csv", "data.num_workers=0"], tmp_path, monitor_size=0)[:-1]  # monitor_size: auto
    out = check_options(make_cfg(*base, "method.batch_size=16", tiny=False))
    assert out.data.monitor_size == 19  # a fifth of 96
    with pytest.raises(ConfigError) as err:
        check_options(make_cfg(*base, "method=simsiam", "backbone=resnet18_narrow", tiny=False))
    (line,) = str(err.value).splitlines()
    assert line.startswith("method.batch_size=512 is not allowed: at most 77") and "method.batch_size=64" in line
    with pytest.raises(ConfigError) as err:
        check_options(make_cfg(*base, "data.monitor_size=96", "method.batch_size=256", tiny=False))
    monitor, batch = str(err.value).splitlines()
    assert monitor.startswith("data.monitor_size=96 is not allowed") and "data.monitor_size=19 or auto" in monitor
    assert batch.startswith("method.batch_size=256 is not allowed: at most 77")  # with the monitor sample that fits
    # the same 96 images as tar shards: the same sample held out, the same batch refused
    urls = write_plain_shards(tmp_path / "shards", sorted(tmp_path.rglob("*.jpg")), (40, 56))
    shards = ["logger=csv", "data.num_workers=0", "data=shards", f"data.urls=[{','.join(urls)}]"]
    assert check_options(make_cfg(*shards, "method.batch_size=16", tiny=False)).data.monitor_size == 19
    with pytest.raises(ConfigError, match=r"^method.batch_size=512 is not allowed: at most 77.*method.batch_size=64"):
        check_options(make_cfg(*shards, "method=simsiam", "backbone=resnet18_narrow", tiny=False))


def test_a_key_added_in_one_place_is_validated_listed_and_read(tmp_path: Path) -> None:
    """One line added to hvp_lightning/settings/hvp.py, the library's HVP settings (in a copy of the
    package): the key then takes ``key=value`` without ``+``, a bad value is refused naming its
    range, ``--help``'s listing shows it with its doc, and the settings HardViewMixin's host builds
    (``hvp_config``) carry it."""
    copy = tmp_path / "pkg"
    shutil.copytree(REPO / "hvp_lightning", copy / "hvp_lightning", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "conf", copy / "conf")
    declared = copy / "hvp_lightning" / "settings" / "hvp.py"
    text = declared.read_text()
    anchor = "    def rules(self) -> None:"
    line = '    probe_k: int = setting(3, "candidates probed first", ge=1)\n\n'
    declared.write_text(text.replace(anchor, line + anchor))
    code = (
        "from hvp_lightning.schema import compose, hvp_config, help_listing, train_settings\n"
        "from hvp_lightning.errors import ConfigError\n"
        "cfg = compose('config', ['+hvp=on', 'hvp.probe_k=5'])\n"
        "print(hvp_config(cfg).probe_k)\n"
        "try:\n    train_settings(compose('config', ['+hvp=on', 'hvp.probe_k=0']))\n"
        "except ConfigError as err:\n    print(err)\n"
        "print([l for l in help_listing('train', {}).splitlines() if 'probe_k' in l][0])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    value, refused, listed = proc.stdout.splitlines()
    assert value == "5"
    assert refused == "hvp.probe_k=0 is not allowed: an integer >= 1"
    assert listed.strip() == "hvp.probe_k = 3   (an integer >= 1) -- candidates probed first"


def test_help_lists_every_key_of_the_chosen_groups() -> None:
    cfg = compose("config", ["method=dino", "+hvp=on"])
    text = help_listing("train", OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))
    assert "method.teacher_temp = 0.04   (a number > 0) -- teacher temperature after its warm-up" in text
    assert "hvp.num_views = 4   (an integer >= 2)" in text
    assert "method.temperature" not in text  # SimCLR's, not DINO's


def test_a_key_declared_since_takes_its_old_plus() -> None:
    """``+trainer.strategy=ddp`` was needed before the schema declared the key; it still sets it."""
    assert checked_command_line("config", ["+trainer.strategy=ddp"]) == ["++trainer.strategy=ddp"]


def test_an_offline_hub_name_fails_in_one_line_before_the_heavy_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    from hvp_lightning import hub_reach

    monkeypatch.setattr(hub_reach, "maybe_cached", lambda source: False)
    monkeypatch.setattr(hub_reach, "unreachable", lambda url, timeout_s=None: "huggingface.co:443: down")
    with pytest.raises(ConfigError) as err:
        check_options(make_cfg("backbone=timm", "backbone.name=resnet10t", "backbone.init=timm:resnet10t.c3_in1k"))
    (line,) = str(err.value).splitlines()
    assert (
        line.startswith("backbone.init='timm:resnet10t.c3_in1k' is not allowed: ")
        and "huggingface.co:443: down" in line
    )
    monkeypatch.setattr(hub_reach, "maybe_cached", lambda source: True)  # in the cache: no network needed
    check_options(make_cfg("backbone=timm", "backbone.name=resnet10t", "backbone.init=timm:resnet10t.c3_in1k"))
