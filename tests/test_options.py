"""Fast, tidy validation: the allowed values live in one torch-free module, and a bad config
is reported in one line before torch, Lightning or the model code is imported, leaving no
run dir behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hvp_lightning import options

from .conftest import REPO

HEAVY_PACKAGES = ("torch", "lightning", "torchvision", "timm")
HEAVY_MODULES = ("hvp_lightning.methods", "hvp_lightning.train", "hvp_lightning.evaluation", "hvp_lightning.checkpoint")


def _heavy(modules) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY_PACKAGES
                  or any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES))


def test_registries_hold_exactly_the_option_names():
    from torchvision.datasets.folder import IMG_EXTENSIONS

    from hvp_lightning.backbones import build_backbone
    from hvp_lightning.methods import METHODS
    from hvp_lightning.optim import make_optimizer
    import torch
    from omegaconf import OmegaConf

    assert set(METHODS) == set(options.METHOD_NAMES)
    assert set(options.IMAGE_EXTENSIONS) == {*IMG_EXTENSIONS, ".gif"}
    for name, family in options.BACKBONE_FAMILIES.items():  # every name builds (tiny: width 8, one block)
        keys = ({"width": 8, "cifar_stem": True, "channels_last": False} if family == "resnet" else
                {"img_size": 16, "patch_size": 8, "drop_path_rate": 0.0, "depth": 1})
        assert build_backbone(OmegaConf.create({"name": name, **keys}))(torch.zeros(2, 3, 16, 16)).shape[0] == 2
    for name in options.OPTIMIZERS:
        make_optimizer(name, [{"params": [torch.nn.Parameter(torch.zeros(2, 2))]}], lr=0.1, weight_decay=0.0)


def test_the_start_up_check_imports_no_torch():
    """hvp_lightning.cli and the checks it runs first import neither torch nor Lightning."""
    code = ("import sys; import hvp_lightning.cli; from hvp_lightning.config import check_options; "
            "from hydra import compose, initialize_config_dir; "
            f"initialize_config_dir(config_dir={str(REPO / 'conf')!r}, version_base='1.3'); "
            "check_options(compose('config', overrides=['logger=csv'])); print(sorted(sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _heavy(eval(proc.stdout)) == []


@pytest.mark.parametrize("script,bad,key", [
    ("train.py", ["seed=-5"], "seed"),
    ("train.py", ["method.name=nope"], "method.name"),
    ("train.py", ["+hvp=on", "hvp.mode=bad"], "hvp.mode"),
    ("train.py", ["data.name=bad"], "data.name"),
    ("train.py", ["data.on_device=maybe"], "data.on_device"),
    ("train.py", ["method.optimizer.name=adam"], "method.optimizer.name"),
    ("train.py", ["resume=nowhere"], "resume"),
    ("train.py", ["method=dino_cifar", "backbone=vit_tiny", "backbone.patch_size=4", "method.local_crop_size=18"],
     "method.local_crop_size"),  # a method's own check (config.check_multicrop)
    ("train.py", ["method=ibot_cifar", "backbone=resnet18_narrow"], "backbone.name"),  # iBOT needs a ViT
    ("train.py", ["method=dino_cifar", "backbone=vit_tiny", "backbone.patch_size=4", "+hvp=on",
                  "hvp.num_local_candidates=1"], "hvp.num_local_candidates"),  # config.check_candidate_counts
    ("eval.py", ["protocol=knn", "ckpt=nowhere"], "ckpt"),
    ("eval.py", ["protocol=knn", "ckpt=.", "devices=2"], "ckpt"),  # an empty folder: no checkpoints/last.ckpt
])
def test_a_bad_config_is_one_line_before_the_heavy_imports_and_leaves_nothing(tmp_path, script, bad, key):
    """Run from an empty folder with the default run dir (runs/<date>/<time>_<method>): one
    line naming the key, exit 2, no torch imported, and the folder is as empty as before."""
    proc = subprocess.run([sys.executable, "-X", "importtime", str(REPO / script), *bad], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and not line.startswith("import time:")]
    assert proc.returncode == 2
    assert len(said) == 1 and said[0].startswith(f"config error: {key}="), said
    assert _heavy(imported) == []
    assert list(tmp_path.iterdir()) == []
