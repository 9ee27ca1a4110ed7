"""The README's "Your own images" commands, as written there, on generated unlabelled images.

Pretrain from released weights on a folder (the weights saved to a local file first: tests are
offline), watch the label-free monitors, export. What shrinks is what no CPU test can afford: the
timm model (resnet10t for the README's resnet50), the image and crop size, the batch, the heads,
one epoch.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from hvp_lightning.analysis.monitors import main as monitors_main
from hvp_lightning.training.driver import run
from hvp_lightning.training.export import main as export_main

from .conftest import REPO, make_cfg, make_settings

SMALL = [
    "trainer=cpu",
    "logger=csv",
    "trainer.max_epochs=2",
    "method.batch_size=4",
    "data.num_workers=0",
    "data.monitor_size=4",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
    "method.proj_hidden_dim=32",
    "method.proj_dim=32",
    "method.pred_hidden_dim=16",
]
TINY_MODEL = "resnet10t"


def readme_commands() -> list[list[str]]:
    """The three commands of the README's "Your own images" block, split as a shell would."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Your own images", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README 'Your own images' has no bash block"
    lines = [line.split("  #", 1)[0] for line in block.group(1).splitlines() if line.strip()]
    return [shlex.split(line) for line in lines]


def unlabelled_images(root: Path) -> Path:
    """12 images of mixed sizes and formats, flat and nested, no class folders."""
    for i in range(12):
        folder = root / ("" if i < 6 else f"day{i % 2}/cam")
        folder.mkdir(parents=True, exist_ok=True)
        img = Image.new("RGB", (40 + 2 * i, 36), (20 * i, 255 - 15 * i, (37 * i) % 256))
        img.paste((255 - 20 * i, 10 * i, 90), (4 + i, 5, 20 + i, 25))
        img.save(folder / f"img{i}.{'jpg' if i % 3 else 'png'}")
    return root


@pytest.mark.slow  # the README's commands: runs
def test_readme_own_images_commands_run(tmp_path: Path, capsys) -> None:
    import timm

    train, watch, export = readme_commands()
    assert train[:3] == ["uv", "run", "python"] and train[3] == "train.py"
    assert watch[:3] == ["uv", "run", "hvp-monitors"] and export[:3] == ["uv", "run", "hvp-export"]

    # 1. pretrain from released weights: the README's overrides, the folder and weights made here
    released = timm.create_model(TINY_MODEL, pretrained=False, num_classes=0)
    weights = tmp_path / f"{TINY_MODEL}.pth"
    torch.save(released.state_dict(), weights)
    folder = unlabelled_images(tmp_path / "my_images")
    local = {"data.root": str(folder), "backbone.name": TINY_MODEL, "backbone.init": str(weights)}
    overrides = []
    for item in train[4:]:
        key = item.split("=", 1)[0]
        overrides.append(f"{key}={local[key]}" if key in local else item)
    assert {o.split("=", 1)[0] for o in overrides} >= set(local), "the README command lost a key this test sets"
    run_dir = tmp_path / "run"
    summary = run(make_cfg(*overrides, *SMALL, tiny=False), run_dir)
    assert summary["hvp_enabled"] and summary["steps"] == 4  # 8 training images (4 held out), batch 4, 2 epochs
    assert summary["monitor_source"] == "monitor" and summary["monitor_images"] == 4
    assert [h["epoch"] for h in summary["monitor_history"]] == [0, 1, 2]
    assert summary["monitor_rankme_init"] is not None  # the released weights' monitors, before the first step

    # 2. watch the monitors: every pass, and the figure (from the run's own record: any logger's)
    shutil.rmtree(run_dir / "csv")
    plot = tmp_path / "monitors.png"
    argv = [str(run_dir) if a.startswith("runs/") else (str(plot) if a.endswith(".png") else a) for a in watch[3:]]
    capsys.readouterr()
    assert monitors_main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["epoch", "RankMe", "feature", "std"]
    rows = [line.split() for line in out[1:] if line.split() and line.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2]
    assert [float(r[1]) for r in rows] == pytest.approx([h["rankme"] for h in summary["monitor_history"]], abs=0.01)
    assert plot.stat().st_size > 0

    # 3. export, and timm loads it with the run's features
    out_dir = tmp_path / "exported"
    argv = [str(run_dir) if a.startswith("runs/") else str(out_dir) for a in export[3:]]
    assert export_main(argv) == 0
    model = timm.create_model(f"local-dir:{out_dir}", pretrained=True).eval()
    data_cfg = timm.data.resolve_data_config(model=model)  # crop_size: auto = the images' 36 px, not upsampled
    assert tuple(data_cfg["input_size"]) == (3, 36, 36) and data_cfg["crop_pct"] == 1.0
    # the model card and config.json: each monitor once, no path of this machine (data.root, backbone.init)
    card, config = (out_dir / "README.md").read_text(), (out_dir / "config.json").read_text()
    assert str(tmp_path) not in card + config and "| data | images (`my_images`) |" in card
    monitors = json.loads(config)["hvp"]["monitors"]
    assert monitors["monitor_rankme"] == summary["monitor_rankme"] and not [k for k in monitors if "." in k]
    assert card.count("rankme") == 2  # monitor_rankme and monitor_rankme_init, one row each
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    trunk = {
        k.removeprefix("backbone.trunk."): v for k, v in ckpt["state_dict"].items() if k.startswith("backbone.trunk.")
    }
    assert trunk.keys() == model.state_dict().keys()
    assert all(torch.equal(v, trunk[k]) for k, v in model.state_dict().items())
    assert not all(torch.equal(v, released.state_dict()[k]) for k, v in trunk.items())  # it trained


def test_hvp_monitors_says_what_is_missing(tmp_path: Path, capsys) -> None:
    assert monitors_main([str(tmp_path / "nowhere")]) == 2
    assert "not a run dir" in capsys.readouterr().err
    # a folder that holds no run (runs/<date> instead of the run): --follow would wait forever
    assert monitors_main([str(tmp_path), "--follow", "60"]) == 2
    assert "not a run dir (no config.yaml, .hydra/, monitors.json, csv/ log or checkpoints/" in capsys.readouterr().err
    (tmp_path / ".hydra").mkdir()  # a run that has just started
    assert monitors_main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "no monitor or k-NN pass recorded yet" in err and "writes monitors.json when training starts" in err
    (tmp_path / "monitors.json").write_text('{"monitor_history": [], "knn_history": []}')  # training started
    assert monitors_main([str(tmp_path)]) == 1
    assert f"no monitor or k-NN pass recorded yet in {tmp_path / 'monitors.json'}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        monitors_main([str(tmp_path), "--follow", "x"])
    assert monitors_main([str(tmp_path), "--follow", "0"]) == 2
    assert monitors_main([str(tmp_path), "--plot", str(tmp_path / "curves.jpeg2")]) == 2  # was matplotlib's traceback
    err = capsys.readouterr().err
    assert "--plot=" in err and "curves.jpeg2 is not allowed" in err and ".png" in err


def _logged_run(run_dir: Path) -> None:
    """A run dir whose CSV log holds two monitor passes, the second collapsed."""
    (run_dir / "csv").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed: 0\n")
    (run_dir / "csv" / "metrics.csv").write_text(
        "epoch,step,monitor/epoch,monitor/rankme,monitor/feature_std\n0,0,0,30.0,0.1\n1,8,1,1.5,0.0001\n"
    )


def test_hvp_monitors_follow_gives_d_once_the_run_has_ended(tmp_path: Path, capsys, monkeypatch) -> None:
    """--follow on an ended run prints what a plain call does (std*sqrt(d), collapse); on a live
    run, the lines without d and, when summary.json appears, the whole table again with d."""
    _logged_run(tmp_path)
    (tmp_path / "summary.json").write_text('{"monitor_dim": 64}')
    assert monitors_main([str(tmp_path)]) == 0
    plain = capsys.readouterr().out
    assert "std*sqrt(d)" in plain and "collapse: " in plain
    assert monitors_main([str(tmp_path), "--follow", "60"]) == 0
    assert capsys.readouterr().out == plain

    live = tmp_path / "live"
    _logged_run(live)
    monkeypatch.setattr(
        "hvp_lightning.analysis.monitors.time.sleep",
        lambda s: (live / "summary.json").write_text('{"monitor_dim": 64}'),
    )
    assert monitors_main([str(live), "--follow", "60"]) == 0
    first, final = capsys.readouterr().out.split("run ended (d=64):\n")
    assert "std*sqrt(d)" not in first and "collapse" not in first and len(first.splitlines()) == 3
    assert final == plain


PASSES = {  # a run's monitors.json: three passes, the last collapsed, k-NN at the first two
    "monitor_dim": 64,
    "monitor_history": [
        {"step": 0, "epoch": 0.0, "images_seen": 0, "rankme": 30.0, "feature_std": 0.1},
        {"step": 8, "epoch": 1.0, "images_seen": 64, "rankme": 20.0, "feature_std": 0.05},
        {"step": 16, "epoch": 2.0, "images_seen": 128, "rankme": 1.5, "feature_std": 0.0001},
    ],
    "knn_history": [
        {"step": 0, "epoch": 0.0, "images_seen": 0, "top1": 0.1, "top5": 0.5},
        {"step": 8, "epoch": 1.0, "images_seen": 64, "top1": 0.25, "top5": 0.75},
    ],
}


def test_hvp_monitors_reads_the_runs_own_record_under_any_logger(tmp_path: Path, capsys, monkeypatch) -> None:
    """A W&B run has no CSV log: its record gives every pass, with d (std*sqrt(d), collapse) while
    it trains; --follow prints each pass once as it comes, and a line while none has."""
    (tmp_path / ".hydra").mkdir()
    record = tmp_path / "monitors.json"
    counts = [1, 1, 3]  # passes recorded after each wait: one, no new one, two more and the run's end

    def next_pass(seconds: float) -> None:
        n = counts.pop(0)
        record.write_text(json.dumps({**PASSES, **{k: PASSES[k][:n] for k in ("monitor_history", "knn_history")}}))
        if not counts:
            (tmp_path / "summary.json").write_text('{"monitor_dim": 64}')

    monkeypatch.setattr("hvp_lightning.analysis.monitors.time.sleep", next_pass)
    assert monitors_main([str(tmp_path), "--follow", "60"]) == 0
    out, err = capsys.readouterr()
    assert "no monitor or k-NN pass recorded yet" in err and "checking every 60 s" in err  # said once
    lines = out.splitlines()
    assert lines[0].split() == ["epoch", "RankMe", "feature", "std", "std*sqrt(d)", "k-NN", "top-1"]
    assert [line.split()[:2] for line in lines[1:]] == [["0", "30.00"], ["1", "20.00"], ["2", "1.50"]]
    assert lines[1].split()[4] == "10.00%" and lines[2].split()[4] == "25.00%" and lines[3].split()[4] == "-"
    assert "collapse: " in lines[3] and "collapse" not in lines[2]
    assert monitors_main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == out  # a plain call on the ended run: the same table


def test_hvp_monitors_on_run_dirs_from_before_the_record(tmp_path: Path, capsys) -> None:
    """A W&B run from before monitors.json: its summary.json's histories once it ended; while it
    trains, one line saying why there is nothing to read and where the passes are."""
    (tmp_path / "checkpoints").mkdir(parents=True)
    assert monitors_main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "predates monitors.json" in err and "its passes are in its W&B run" in err
    (tmp_path / "summary.json").write_text(json.dumps(PASSES))
    assert monitors_main([str(tmp_path)]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [r.split()[1] for r in rows] == ["30.00", "20.00", "1.50"]


@pytest.mark.parametrize(
    ("side", "backbone", "crop", "ratio"),
    [
        (32, {"name": "resnet18"}, 32, 1.0),  # CIFAR-like: its own size, the whole image evaluated
        (128, {"name": "resnet18"}, 128, 1.0),  # was 224: every crop upsampled
        (240, {"name": "resnet18"}, 224, 0.9333),  # resize to 240 (its own size), not 256, for the centre crop
        (500, {"name": "resnet18"}, 224, 0.875),  # the ImageNet protocol: resize 256, crop 224
        (100, {"name": "vit_small", "patch_size": 16}, 96, 1.0),  # a ViT: whole patches
        (100, {"name": "vit_small_patch14_dinov2", "model_args": None}, 98, 0.98),  # timm: the name's patch
        (100, {"name": "vit_small_patch16_224", "model_args": {"patch_size": 8}}, 96, 1.0),  # its model_args'
        (10, {"name": "vit_small", "patch_size": 16}, 16, 1.0),  # smaller than one patch: one patch
    ],
)
def test_auto_crop_follows_the_images_median_shorter_side(tmp_path: Path, side, backbone, crop, ratio) -> None:
    from hvp_lightning.data.layout import resolve_auto_crop
    from hvp_lightning.schema.backbone import ResNetSettings, TimmSettings, ViTSettings

    for i, short in enumerate((max(1, side // 2), side, side, side + 50, side + 200)):  # the median: side
        Image.new("RGB", (short + 7, short) if i % 2 else (short, short + 7)).save(tmp_path / f"{i}.png")
    data = make_settings(
        "data=images", f"data.root={tmp_path}", "data.crop_size=auto", "data.eval_crop_ratio=auto"
    ).data
    if "model_args" in backbone:
        section = TimmSettings(**backbone)
    elif "patch_size" in backbone:
        section = ViTSettings(**backbone, img_size=None, drop_path_rate=0.0)
    else:
        section = ResNetSettings(**backbone, width=64, cifar_stem=False, zero_init_residual=False, channels_last=False)
    resolved = resolve_auto_crop(data, section)
    assert (resolved.crop_size, resolved.eval_crop_ratio) == (crop, ratio)


def test_auto_crops_and_their_evaluation_never_upsample_where_one_patch_fits() -> None:
    """Every median side 8..600 px, every patch: the crop and the evaluation resize stay within
    the images (224 at most), and the crop is a whole number of patches."""
    from hvp_lightning.data.layout import auto_crop_size, auto_eval_crop_ratio

    for multiple in (1, 8, 14, 16, 32):
        for side in range(max(8, multiple), 601):
            crop = auto_crop_size(side, multiple)
            ratio = auto_eval_crop_ratio(crop, side)
            assert crop % multiple == 0 and crop <= min(side, 224) and crop > min(side, 224) - multiple
            assert round(crop / ratio) <= side and math.floor(crop / ratio) <= side  # ours and timm's resize
            assert 0.875 <= ratio <= 1.0 and (ratio == 0.875 or crop <= 96 or round(crop / ratio) == side)


def test_the_upsampling_warning_names_the_crop_to_set(tmp_path: Path, caplog) -> None:
    from hvp_lightning.config import validate

    root = tmp_path / "imgs"
    root.mkdir()
    for i in range(4):
        Image.new("RGB", (128 + i, 128)).save(root / f"{i}.png")
    cfg = make_cfg(
        "data=images",
        f"data.root={root}",
        "data.monitor_size=1",
        "data.crop_size=224",
        "trainer=cpu",
        "method.batch_size=2",
    )
    validate(cfg)
    assert (
        "data.crop_size=224 is larger than the images (shorter side 128 px): every crop is upsampled; "
        "set data.crop_size=128 to crop them at their own size" in caplog.text
    )


@pytest.mark.slow  # a run
def test_unreadable_held_out_images_are_left_out_of_the_monitors(tmp_path: Path, caplog) -> None:
    """An unreadable file's row holds the next readable image; counted in, its duplicate would pull
    RankMe down and the summary would claim images the monitors never saw."""
    from hvp_lightning.data.datamodule import monitor_split
    from hvp_lightning.data.layout import images_under

    root = unlabelled_images(tmp_path / "imgs")
    for i in range(4):
        (root / f"broken{i}.jpg").write_bytes(b"not a jpeg")
    paths = images_under(root)
    held = monitor_split(len(paths), 10)[1]
    broken = sum("broken" in paths[i] for i in held)
    assert 0 < broken < 10  # the seeded split holds some out, and keeps readable ones too
    base = ["method=simsiam", "data=images", f"data.root={root}", *SMALL, "data.monitor_size=10"]
    cfg = make_cfg(*base, "trainer.max_epochs=1", "method.batch_size=2", tiny=False)
    summary = run(cfg, tmp_path / "run")
    assert summary["monitor_images"] == 10 - broken
    assert f"{broken} unreadable monitor images left out ({10 - broken} used)" in caplog.text
