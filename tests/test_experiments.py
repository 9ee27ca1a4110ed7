"""conf/experiment/: every file is a whole run in one override (``+experiment=NAME data.root=...``)
that composes and passes the start-up checks (the paper's values: tests/test_paper_presets.py).
Every method preset brings a backbone it runs with, and the command line still picks another."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import DictConfig, OmegaConf

from hvp_lightning.config import check_options
from hvp_lightning.schema import TrainConfig

from .conftest import REPO, compose_conf, tiered

pytestmark = pytest.mark.usefixtures("hub_weights_cached")  # backbone.init=timm:... needs no network

CONF = REPO / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
METHOD_PRESETS = sorted(p.stem for p in (CONF / "method").glob("*.yaml"))

# The paper's values per preset (its appendix tables, with and without +hvp=on): tests/test_paper_presets.py.


def imagenet_folder(root: Path) -> Path:
    """A stand-in ImageNet folder: two classes of one 256 px image in train/ and val/."""
    from PIL import Image

    for split in ("train", "val"):
        for cls in ("n01", "n02"):
            (root / split / cls).mkdir(parents=True)
            Image.new("RGB", (256, 256), (40, 80, 120)).save(root / split / cls / "a.png")
    return root


def composed(*overrides: str) -> DictConfig:
    return compose_conf("config", *overrides)


def experiment_cfg(name: str, tmp_path: Path, *more: str) -> DictConfig:
    """``+experiment=NAME`` with a data root the checks accept (torchvision sets: download=true, so
    that no files are needed; nothing is downloaded without training). Shared by test_paper_presets."""
    kind = composed(f"+experiment={name}").data.name
    if kind == "imagefolder":  # the ImageNet runs
        data = [f"data.root={imagenet_folder(tmp_path / 'imagenet')}"]
    elif kind == "images":  # unlabelled images (dino_vits16_adapt): a list of a whole batch and 1 held out
        image = next((imagenet_folder(tmp_path / "imagenet") / "train").rglob("*.png"))
        listed = tmp_path / "images.txt"
        listed.write_text(f"{image}\n" * (composed(f"+experiment={name}").method.batch_size + 1))
        data = [f"data.files={listed}", "data.monitor_size=1"]
    else:
        data = ["data.download=true"]
    return composed(f"+experiment={name}", *data, *more)


def global_batch(cfg: DictConfig | TrainConfig) -> int:
    t = cfg.trainer
    return cfg.method.batch_size * t.devices * t.num_nodes * t.accumulate_grad_batches


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_is_a_whole_run(name):
    text = (CONF / "experiment" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    defaults = yaml.safe_load(text)["defaults"]
    chosen = {k.removeprefix("override /") for d in defaults if isinstance(d, dict) for k in d}
    assert {"method", "backbone", "data", "trainer"} <= chosen, chosen  # each file bundles the whole run
    assert "max_epochs" in yaml.safe_load(text)["trainer"]
    # it passes the start-up checks (with and without +hvp=on): tests/test_paper_presets.py


def test_dino_vits16_adapt_continues_the_official_dino_vits16(tmp_path):
    """The adaptation preset: timm's copy of the official DINO ViT-S/16 as the start (a local
    file instead on the command line), a slower teacher (official DINO's advice for small
    batches) and a lower, shorter learning-rate schedule than from scratch (docs/backbones.md)."""
    cfg = experiment_cfg("dino_vits16_adapt", tmp_path)
    scratch = experiment_cfg("dino_vits16_imagenet", tmp_path / "scratch")
    b, m = cfg.backbone, cfg.method
    assert (b.name, b.init, b.init_student) == ("vit_small_patch16_224", "timm:vit_small_patch16_224.dino", False)
    assert global_batch(cfg) == 128 and m.momentum_teacher == 0.9995
    assert m.optimizer.base_lr < scratch.method.optimizer.base_lr
    assert m.optimizer.warmup_epochs < scratch.method.optimizer.warmup_epochs
    assert cfg.trainer.max_epochs < scratch.trainer.max_epochs
    weights = tmp_path / "dino_deitsmall16_pretrain.pth"
    weights.write_bytes(b"")
    check_options(experiment_cfg("dino_vits16_adapt", tmp_path / "local", f"backbone.init={weights}"))


def test_the_command_line_still_wins_over_an_experiment(tmp_path):
    cfg = experiment_cfg(
        "dino_vits16_imagenet", tmp_path, "backbone=vit_base", "trainer.max_epochs=300", "method.batch_size=128"
    )
    assert (cfg.backbone.name, cfg.trainer.max_epochs, global_batch(cfg)) == ("vit_base", 300, 1024)


@pytest.mark.parametrize(
    "hvp",
    [pytest.param((), id="baseline"), pytest.param(("+hvp=on",), id="hvp_on", marks=pytest.mark.slow)],
)  # with +hvp=on every preset again (slow); HVP's defaults on four methods: tests/test_train.py
@pytest.mark.parametrize("preset", tiered(METHOD_PRESETS, 6))
def test_every_method_preset_alone_passes_the_start_up_checks(preset, hvp):
    """``method=ibot`` alone used to stop on a config error (iBOT needs a ViT): each preset brings a
    backbone it runs with, with and without +hvp=on. (On textures enough for its batch: the ImageNet
    presets' 4096 do not fit the demo's 2048, which start-up says.)"""
    check_options(composed(f"method={preset}", "logger=csv", "data.train_size=4096", *hvp))


def test_a_methods_own_backbone_gives_way_to_the_command_line():
    assert composed("method=ibot").backbone.name == "vit_small"
    assert composed("method=simsiam").backbone.name == "resnet50"
    assert OmegaConf.to_container(composed("method=dino_cifar").backbone) == {
        "name": "vit_tiny",
        "img_size": 32,
        "patch_size": 4,
        "drop_path_rate": 0.1,
        "depth": None,
        "init": None,
        "init_student": False,
    }
    assert composed("method=ibot", "backbone=vit_tiny").backbone.name == "vit_tiny"
    assert composed("backbone=vit_tiny", "method=ibot").backbone.name == "vit_tiny"  # order on the line is free
    assert composed().backbone.width == 16  # the demo keeps its narrow ResNet-18
