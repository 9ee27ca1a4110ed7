"""Fast, tidy validation: the allowed values live in one torch-free module, and a bad config
is reported in one line before torch, Lightning or the model code is imported, leaving no
run dir behind (each command in this process; in a fresh interpreter, with its imports, in the
slow tier)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hvp_lightning import schema
from hvp_lightning.cli import evaluate_main, train
from hvp_lightning.data import image_files

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, run_cli, tiered

HEAVY_PACKAGES = ("torch", "lightning", "torchvision", "timm")
HEAVY_MODULES = (
    "hvp_lightning.methods",
    "hvp_lightning.training.driver",
    "hvp_lightning.evaluation",
    "hvp_lightning.training.checkpoint",
)


def _heavy(modules) -> list[str]:
    return sorted(
        m
        for m in modules
        if m.split(".")[0] in HEAVY_PACKAGES or any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES)
    )


def test_registries_hold_exactly_the_option_names():
    import torch
    from pydantic import TypeAdapter
    from torchvision.datasets.folder import IMG_EXTENSIONS

    from hvp_lightning.methods import METHODS
    from hvp_lightning.nn.optim import make_optimizer
    from hvp_lightning.training.build import build_backbone

    assert set(METHODS) == set(schema.METHOD_NAMES)
    assert set(image_files.IMAGE_EXTENSIONS) == {*IMG_EXTENSIONS, ".gif"}
    for name, family in schema.BACKBONE_FAMILIES.items():  # every name builds (tiny: width 8, one block)
        keys = (
            {"width": 8, "cifar_stem": True, "channels_last": False, "zero_init_residual": False}
            if family == "resnet"
            else {"img_size": 16, "patch_size": 8, "drop_path_rate": 0.0, "depth": 1}
        )
        backbone = TypeAdapter(schema.TrainConfig.model_fields["backbone"].annotation)
        section = backbone.validate_python({"name": name, **keys})
        assert build_backbone(section)(torch.zeros(2, 3, 16, 16)).shape[0] == 2
    for name in schema.OPTIMIZERS:
        make_optimizer(
            name, [{"params": [torch.nn.Parameter(torch.zeros(2, 2))]}], lr=0.1, weight_decay=0.0, momentum=0.9
        )


def test_the_start_up_check_imports_no_torch():
    """hvp_lightning.cli and the checks it runs first import neither torch nor Lightning."""
    code = (
        "import sys; import hvp_lightning.cli; from hvp_lightning.config import check_options; "
        "from hydra import compose, initialize_config_dir; "
        f"initialize_config_dir(config_dir={str(REPO / 'conf')!r}, version_base='1.3'); "
        "check_options(compose('config', overrides=['logger=csv'])); print(sorted(sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _heavy(eval(proc.stdout)) == []


# (script, command, the key its one line names)
BAD_COMMANDS = [
    ("train.py", ["seed=-5"], "seed"),
    ("train.py", ["method.name=nope"], "method.name"),
    ("train.py", ["+hvp=on", "hvp.mode=bad"], "hvp.mode"),
    ("train.py", ["+hvp.num_views=8"], "hvp.num_views"),  # Hydra's advice without +hvp=on: would train a baseline
    ("train.py", ["data.name=bad"], "data.name"),
    ("train.py", ["data.on_device=maybe"], "data.on_device"),
    ("train.py", ["method.optimizer.name=adam"], "method.optimizer.name"),
    ("train.py", ["resume=nowhere"], "resume"),
    (
        "train.py",
        ["resume=nowhere/checkpoints/last.ckpt"],
        "resume",
    ),  # a checkpoint file's path: no folder made there
    (
        "train.py",
        ["method=dino_cifar", "backbone=vit_tiny", "backbone.patch_size=4", "method.local_crop_size=18"],
        "method.local_crop_size",
    ),  # a method's own check (config.check_multicrop)
    ("train.py", ["method=ibot_cifar", "backbone=resnet18_narrow"], "backbone.name"),  # iBOT needs a ViT
    (
        "train.py",
        [
            "method=dino_cifar",
            "backbone=vit_tiny",
            "backbone.patch_size=4",
            "+hvp=on",
            "hvp.num_local_candidates=1",
        ],
        "hvp.num_local_candidates",
    ),  # config.check_candidate_counts
    ("eval.py", ["protocol=knn", "ckpt=nowhere"], "ckpt"),
    ("eval.py", ["protocol=knn", "ckpt=."], "ckpt"),  # an empty folder: no checkpoints/last.ckpt
    ("eval.py", ["protocol=knn", "ckpt=.", "devices=2"], "devices"),  # evaluation runs on one device
]


@pytest.mark.parametrize("script,bad,key", tiered(BAD_COMMANDS, 6))
def test_a_bad_config_is_one_line_and_leaves_nothing(tmp_path, script, bad, key):
    """The command, from an empty folder with the default run dir (runs/<date>/<time>_<method>):
    one line naming the key, exit 2, and the folder is as empty as before."""
    main = {"train.py": train, "eval.py": evaluate_main}[script]
    code, out, err = run_cli(main, *bad, cwd=tmp_path)
    said = [line for line in (out + err).splitlines() if line.strip()]
    assert code == 2
    assert len(said) == 1 and said[0].startswith(f"config error: {key}="), said
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a fresh interpreter per command: ~1-2 s each
@pytest.mark.parametrize("script,bad,key", BAD_COMMANDS)
def test_a_bad_config_is_one_line_before_the_heavy_imports_and_leaves_nothing(tmp_path, script, bad, key):
    """Run from an empty folder with the default run dir (runs/<date>/<time>_<method>): one
    line naming the key, exit 2, no torch imported, and the folder is as empty as before."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(REPO / script), *bad],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    said = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip() and not line.startswith("import time:")
    ]
    assert proc.returncode == 2
    assert len(said) == 1 and said[0].startswith(f"config error: {key}="), said
    assert _heavy(imported) == []
    assert list(tmp_path.iterdir()) == []


def test_resume_takes_a_run_dir_or_its_last_ckpt_and_refuses_other_checkpoint_files(tmp_path):
    """resume=<run>/checkpoints/last.ckpt is that run dir; another .ckpt file is refused in one
    line (a run continues from its own last.ckpt) instead of Hydra's traceback from making a
    run dir at the file's path."""
    from hvp_lightning.cli import checked_resume, resume_run_dir
    from hvp_lightning.errors import CheckpointError

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (run / "checkpoints" / "other.ckpt").write_bytes(b"x")
    assert resume_run_dir(str(run)) == str(run)
    assert resume_run_dir(str(run / "checkpoints" / "last.ckpt")) == str(run)
    assert resume_run_dir(str(run / "checkpoints" / "other.ckpt")) == str(run)
    assert checked_resume(str(run / "checkpoints" / "last.ckpt"), run, fresh=False) == str(run)
    assert checked_resume(str(run), run, fresh=False) == str(run)
    with pytest.raises(CheckpointError, match=r"resume='.*other.ckpt' is not allowed: a run dir"):
        checked_resume(str(run / "checkpoints" / "other.ckpt"), run, fresh=False)
    with pytest.raises(CheckpointError, match=r"no run at that path"):
        checked_resume(str(tmp_path / "new"), tmp_path / "new", fresh=True)

    code, _, err = run_cli(train, f"resume={run / 'checkpoints' / 'other.ckpt'}", cwd=tmp_path)
    assert code == 2, err[-2000:]
    assert err.startswith("config error: resume=") and "Traceback" not in err


def test_path_overrides_holding_equals_are_quoted_whole_and_only_those(tmp_path):
    """Kept checkpoints (epoch=100.ckpt) and sweep job dirs (0_method=simclr,seed=1) hold '=' and
    ',': the value is one path, quoted for Hydra; what is Hydra's grammar already stays as typed."""
    from hvp_lightning.cli import quote_path_overrides

    job = "multirun/d/t/0_method=simclr,seed=1"
    argv = [
        "eval.py",
        "ckpt=runs/x/checkpoints/epoch=100.ckpt",
        f"ckpt={job}",
        "backbone.init=runs/x/checkpoints/epoch\\=100.ckpt",  # Hydra's own escape
        "ckpt='runs/x/epoch=1.ckpt'",
        "data.root=/data/imagenet",
        "seed=0,1",
        "+data.test_subset=50",
    ]
    assert quote_path_overrides(argv) == [
        "eval.py",
        "ckpt='runs/x/checkpoints/epoch=100.ckpt'",
        f"ckpt='{job}'",
        *argv[3:],
    ]
    a, b = tmp_path / "0_seed=0", tmp_path / "1_seed=1"
    a.mkdir(), b.mkdir()
    assert quote_path_overrides(["-m", f"ckpt={a},{b}"])[1] == f"ckpt='{a}','{b}'"  # a sweep over two runs
    assert quote_path_overrides([f"ckpt={a},{b}"])[0] == f"ckpt='{a},{b}'"  # no -m: one path
    # Hydra's sweep job dirs hold ',' themselves: no comma-separated piece exists alone
    c, d = tmp_path / "0_+hvp=on,hvp.enabled=true,seed=0", tmp_path / "1_+hvp=on,hvp.enabled=true,seed=1"
    c.mkdir(), d.mkdir()
    assert quote_path_overrides(["-m", f"budget.match={c},{d}"])[1] == f"budget.match='{c}','{d}'"
    assert quote_path_overrides(["-m", f"budget.match={c}"])[1] == f"budget.match='{c}'"
    assert quote_path_overrides([f"budget.match={c},{d}"])[0] == f"budget.match='{c},{d}'"
    assert quote_path_overrides(["-m", f"ckpt={c},{tmp_path}/gone"])[1] == f"ckpt='{c},{tmp_path}/gone'"  # as typed
