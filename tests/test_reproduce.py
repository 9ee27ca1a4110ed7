"""The README's "Reproduce the paper" commands, each in a short CPU version: the paper's Table 1
presets with and without ``+hvp=on``, the IoU policy, static colour, and the transfer table (its
own end-to-end test: tests/test_transfer.py), on a generated image folder.

The presets keep their methods, schedules and views; what shrinks is what no CPU test can afford:
the network's width or depth, the crop sizes, the batch, one epoch, one process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from hvp_lightning.training.driver import run

from .conftest import make_cfg

SMALL = [
    "trainer=cpu",
    "logger=csv",
    "trainer.max_epochs=1",
    "method.batch_size=4",
    "data.crop_size=32",
    "data.num_workers=0",
    "eval.at_start=false",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
]
RESNET = ["backbone.width=8"]
VIT = [
    "trainer.precision=32-true",  # the presets train in fp16 mixed precision, a GPU-only mode
    "backbone.patch_size=8",
    "backbone.img_size=32",
    "backbone.depth=1",
    "method.local_crop_size=16",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
]
TABLE_1 = {
    "simsiam_resnet50_imagenet": RESNET
    + ["method.proj_hidden_dim=32", "method.proj_dim=32", "method.pred_hidden_dim=16"],
    "simclr_resnet50_imagenet": RESNET + ["method.proj_hidden_dim=32", "method.proj_dim=16"],
    "dino_vits16_imagenet": VIT + ["method.num_local_crops=2"],
    "ibot_vits16_imagenet": VIT + ["method.patch_out_dim=64"],  # global views only, as the preset
}


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory) -> Path:
    """Two classes of 4 small images each, in train/ and val/ (an ImageNet-like folder)."""
    root = tmp_path_factory.mktemp("imagenet")
    for split in ("train", "val"):
        for c, cls in enumerate(("n01", "n02")):
            (root / split / cls).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (48, 40), (40 + 60 * c, 20 * i, 120)).save(root / split / cls / f"{i}.png")
    return root


def short(name: str, root: Path, *more: str):
    return make_cfg(f"+experiment={name}", f"data.root={root}", *SMALL, *TABLE_1.get(name, RESNET), *more, tiny=False)


@pytest.mark.slow  # a run of each Table 1 preset (short CPU version)
@pytest.mark.parametrize("hvp", [False, True], ids=["baseline", "hvp"])
@pytest.mark.parametrize("name", sorted(TABLE_1))
def test_table_1_commands_run(name: str, hvp: bool, image_folder: Path, tmp_path: Path) -> None:
    cfg = short(name, image_folder, *(["+hvp=on"] if hvp else []))
    if hvp and name.startswith("dino"):
        assert cfg.hvp.max_combinations == 128  # the paper's setting, from the preset
    summary = run(cfg, tmp_path)
    assert summary["steps"] == 2 and summary["hvp_enabled"] is hvp
    assert summary["knn_top1"] is not None


@pytest.mark.slow  # two runs
def test_the_iou_policy_and_static_colour_commands_run(image_folder: Path, tmp_path: Path) -> None:
    summary = run(short("simsiam_resnet50_imagenet", image_folder, "+data/iou_policy=on"), tmp_path / "iou")
    assert summary["iou_policy"]["fallback_pairs"] >= 0 and not summary["hvp_enabled"]
    summary = run(short("simsiam_resnet50_imagenet", image_folder, "+hvp=on", "hvp.colour=static"), tmp_path / "static")
    assert summary["hvp_enabled"]
