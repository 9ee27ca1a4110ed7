"""Checkpoints and resume: an interrupted run (SIGKILL) continued from last.ckpt ends with the
same weights as an uninterrupted one; atomic writes; safe loading and clear errors."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hvp_lightning.cli import evaluate_main, train
from hvp_lightning.training.checkpoint import (
    RESUMABLE_KEYS,
    AtomicCheckpointIO,
    CheckpointError,
    atomic_save,
    load_checkpoint,
    resume_checkpoint,
    resume_config,
    rng_state,
    set_rng_state,
)
from hvp_lightning.training.driver import run

from .conftest import (
    COST_COUNTS,
    REPO,
    SUBPROCESS_TIMEOUT_S,
    images_run,
    make_cfg,
    make_settings,
    run_cli,
    write_images,
)

# A tiny SimSiam + HVP run, spelled as train.py command-line overrides so that the same
# config runs in a subprocess (to be killed) and in this process (make_cfg(..., tiny=False)).
RUN = [
    "logger=csv",
    "data.train_size=96",
    "data.test_size=32",
    "data.crop_size=16",
    "data.num_workers=0",
    "method.batch_size=16",
    "method.proj_hidden_dim=64",
    "method.proj_dim=32",
    "backbone.width=8",
    "trainer.max_epochs=3",
    "eval.at_start=false",
    "eval.every_n_epochs=1",
    "checkpoint.every_n_epochs=1",
    "+hvp=on",
    "hvp.num_views=3",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
    "+trainer.deterministic=true",
]


def _state(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow  # a train.py subprocess killed with SIGKILL, and two runs in this process
def test_killed_run_resumes_to_the_same_weights(tmp_path):
    straight = run(make_cfg(*RUN, tiny=False), tmp_path / "straight")

    # Start the same run in a subprocess and SIGKILL it as soon as its first checkpoint exists.
    resumed_dir = tmp_path / "resumed"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="offline")
    proc = subprocess.Popen(
        [sys.executable, "train.py", *RUN, f"hydra.run.dir={resumed_dir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    last = resumed_dir / "checkpoints" / "last.ckpt"
    deadline = time.time() + SUBPROCESS_TIMEOUT_S
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert last.exists(), err[-2000:]
    killed_at = torch.load(last, map_location="cpu", weights_only=True)["epoch"]
    assert killed_at < 2, "the run finished before it could be killed"  # "epoch": 0-based, saved at its end
    assert not (resumed_dir / "summary.json").exists()

    # Same run dir again: last.ckpt is found and continued (model, optimizer, scheduler, EMA,
    # loops, HVP totals, counters, RNG streams).
    resumed = run(make_cfg(*RUN, tiny=False), resumed_dir)
    a, b = _state(tmp_path / "straight"), _state(resumed_dir)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)
    for key in ("epochs", "steps", "images_seen", "knn_top1", "knn_top5"):
        assert resumed[key] == straight[key], key
    assert resumed["hvp"]["selected_samples"] == straight["hvp"]["selected_samples"] == 3 * 6 * 16
    # The cost's counts cover the whole run, the killed session's checkpointed part included;
    # its rates are the resumed session's own.
    assert {k: resumed["cost"][k] for k in COST_COUNTS} == {k: straight["cost"][k] for k in COST_COUNTS}
    assert straight["cost"]["images"] == 3 * 6 * 16 and resumed["cost"]["session_images"] < 3 * 6 * 16
    assert resumed["hvp"]["selection_selected_loss_mean"] == pytest.approx(
        straight["hvp"]["selection_selected_loss_mean"], rel=1e-5
    )
    # The CSV log continues: one file, every epoch's k-NN row.
    rows = (resumed_dir / "csv" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    knn = [r for r in rows[1:] if r.split(",")[header.index("knn/top1")]]
    assert len(knn) >= 3  # every epoch's k-NN: those before the kill were flushed with the checkpoint
    kept = sorted(p.name for p in (resumed_dir / "checkpoints").iterdir())
    assert kept == ["epoch=001.ckpt", "epoch=002.ckpt", "epoch=003.ckpt", "last.ckpt"]


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_resume_config_is_the_runs_own_config_with_the_command_lines_changes(simsiam_run, tmp_path):
    """train.py resume=<run_dir>: the stored config, plus key=value overrides of existing keys;
    a run dir is not continued with another method, nor a path that holds no run."""
    run_dir = tmp_path / "run"
    shutil.copytree(simsiam_run[0], run_dir)
    over = ["resume=" + str(run_dir), "trainer.max_epochs=2"]
    cfg = resume_config(run_dir, make_cfg(*over), over)
    assert cfg.trainer.max_epochs == 2 and cfg.resume == str(run_dir) and cfg.backbone.width == 8
    other = resume_config(run_dir, make_cfg("method=simclr_cifar"), ["method=simclr_cifar"])
    with pytest.raises(CheckpointError, match=r"config differs in .*method.name.*'simsiam' there, 'simclr' here"):
        run(other, run_dir)
    with pytest.raises(CheckpointError, match=r"resume='.*nowhere' is not allowed"):
        resume_config(tmp_path / "nowhere", make_cfg())


@pytest.mark.slow  # two runs
def test_resume_cli_uses_the_runs_own_config(tmp_path):
    """train.py resume=<run_dir> trainer.max_epochs=2 continues a 1-epoch run for a second epoch."""
    run_dir = tmp_path / "run"
    run(make_cfg("trainer.max_epochs=1", "checkpoint.every_n_epochs=1"), run_dir)
    over = ["resume=" + str(run_dir), "trainer.max_epochs=2"]
    summary = run(resume_config(run_dir, make_cfg(*over), over), run_dir)
    assert summary["epochs"] == 2 and summary["steps"] == 8 and summary["images_seen"] == 2 * 4 * 16


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_run_dir_of_another_run_is_not_continued(simsiam_run, tmp_path):
    with pytest.raises(
        CheckpointError, match=r"holds last.ckpt of a run whose config differs in .*method.name \('simsiam' there"
    ):
        resume_checkpoint(make_settings("method=simclr_cifar"), simsiam_run[0])
    with pytest.raises(CheckpointError, match=r"resume='.*' is not allowed: a run dir holding checkpoints/last.ckpt"):
        resume_checkpoint(make_settings(f"resume={tmp_path / 'empty'}"), tmp_path / "empty")


def test_docs_list_the_keys_a_resumed_run_may_change():
    """docs/checkpoints.md "Which keys may change" names RESUMABLE_KEYS, no more, no fewer."""
    text = (REPO / "docs" / "checkpoints.md").read_text()
    section = text.split("### Which keys may change", 1)[1].split("\n### ", 1)[0]
    listed = [line for line in section.splitlines() if line.startswith(("- ", "  "))]
    keys = {k.removesuffix(".*") for line in listed for k in re.findall(r"`([a-z_.*]+)`", line)}
    assert keys == set(RESUMABLE_KEYS) - {"resume"}


def test_atomic_save_never_leaves_a_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_save({"x": torch.ones(3)}, path)

    def crash(obj, f):  # a crash half-way through writing
        f.write(b"PK\x03\x04 partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        AtomicCheckpointIO().save_checkpoint({"x": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.ones(3))  # the old one, intact
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary left behind


def test_rng_state_round_trip():
    import random

    import numpy as np

    state = rng_state()
    want = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(123), np.random.seed(1), random.seed(2)
    set_rng_state(torch.load(_roundtrip(state), weights_only=True))  # survives weights_only loading
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


def _roundtrip(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


@pytest.fixture
def tiny_ckpt(simsiam_run) -> Path:
    return simsiam_run[0] / "checkpoints" / "last.ckpt"


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_checkpoints_load_with_weights_only(tiny_ckpt):
    ckpt = load_checkpoint(tiny_ckpt)  # torch.load(weights_only=True) inside
    assert ckpt["hvp_lightning"]["config"]["method"]["name"] == "simsiam"  # the run's config
    assert ckpt["hyper_parameters"]["settings"]["proj_dim"] == 32  # the method's own settings
    assert set(ckpt["hvp_lightning"]) >= {"images_seen", "skipped_files", "knn_result", "hvp_totals"}
    assert "RunCheckpoint" in ckpt["callbacks"] and ckpt["optimizer_states"] and ckpt["lr_schedulers"]


@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_missing_truncated_and_foreign_checkpoints(tiny_ckpt, tmp_path):
    with pytest.raises(CheckpointError, match=r"ckpt='.*nothere.ckpt' is not allowed: no such checkpoint file"):
        load_checkpoint(tmp_path / "nothere.ckpt")
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(tiny_ckpt.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=r"is not allowed: the file is truncated or not a PyTorch checkpoint"):
        load_checkpoint(truncated)
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(garbage)
    # torch's own reason, not its advice half-quoted ("Re-running torch.load with weights_only set to False")
    assert "truncated or not a PyTorch checkpoint (UnpicklingError)" in str(err.value)
    assert "weights_only" not in str(err.value)
    foreign = tmp_path / "foreign.pth"
    torch.save({"conv1.weight": torch.zeros(1)}, foreign)
    with pytest.raises(CheckpointError, match=r"not an hvp-lightning training checkpoint"):
        load_checkpoint(foreign)


class _RunsCode:
    def __reduce__(self):  # what a crafted checkpoint does: call os.system when unpickled
        return (os.system, ("true",))


@pytest.mark.parametrize(
    ("obj", "why"),
    [
        (Path("x"), "(pathlib.PosixPath)"),  # not on torch's allowlist
        (_RunsCode(), "(posix.system)"),  # a blocked module
    ],
)
def test_a_refused_pickle_is_named_as_such_with_torchs_warning(tmp_path, obj, why):
    """Both refusals (an object not on torch's allowlist, a blocked module) are said as such with
    the objects named (not "truncated"), and with torch's warning that weights_only=False can run
    arbitrary code."""
    path = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": {}, "obj": obj}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert "refuses to unpickle" in message and why in message and "truncated" not in message
    assert "weights_only=False can result in arbitrary code execution" in message and "trusted source" in message
    assert "\n" not in message and "\x1b" not in message


def _truncated_run(tiny_ckpt: Path, tmp_path: Path) -> Path:
    """A run dir whose last.ckpt is cut short, with the first session's command."""
    bad = tmp_path / "run"
    (bad / "checkpoints").mkdir(parents=True)
    (bad / "checkpoints" / "last.ckpt").write_bytes(tiny_ckpt.read_bytes()[:3000])
    (bad / ".hydra").mkdir()
    (bad / ".hydra" / "overrides.yaml").write_text("- seed=3\n")  # the first session's command
    return bad


def _files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("main", [evaluate_main, train], ids=["eval.py", "train.py"])
@pytest.mark.slow  # reads a finished run (a whole run, made once per process)
def test_a_truncated_checkpoint_is_one_line_exit_2_and_its_run_dir_untouched(tiny_ckpt, tmp_path, main):
    bad = _truncated_run(tiny_ckpt, tmp_path)
    before = _files(bad)
    args = ["protocol=knn", f"ckpt={bad}"] if main is evaluate_main else [f"resume={bad}"]
    code, _, err = run_cli(main, *args, cwd=tmp_path)
    assert code == 2, err[-2000:]
    assert err.startswith("config error:") and "truncated or not a PyTorch checkpoint" in err
    assert len(err.splitlines()) == 1
    assert _files(bad) == before


@pytest.mark.slow  # a fresh interpreter per command: ~10-25 s each on 2 cores
@pytest.mark.parametrize("script", ["eval.py", "train.py"])
def test_cli_checkpoint_errors_are_one_line_exit_2(tiny_ckpt, tmp_path, script):
    bad = _truncated_run(tiny_ckpt, tmp_path)
    before = _files(bad)
    args = ["protocol=knn", f"ckpt={bad}"] if script == "eval.py" else [f"resume={bad}"]
    proc = subprocess.run(
        [sys.executable, script, *args], cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "config error:" in proc.stderr and "truncated or not a PyTorch checkpoint" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert _files(bad) == before  # the refused run dir is untouched


@pytest.mark.slow  # two runs each
@pytest.mark.parametrize("method", ["dino", "ibot"])
def test_resume_from_an_epoch_checkpoint_matches_straight_run(tmp_path, method):
    """The EMA teacher, the centres and HVP's running totals of DINO/iBOT continue exactly: a
    run restarted from the epoch-1 checkpoint of a 2-epoch run ends where that run ended."""
    over = [
        f"method={method}_cifar",
        "backbone=vit_tiny",
        "backbone.patch_size=8",
        "backbone.img_size=32",
        "backbone.depth=2",
        "data.crop_size=32",
        "data.train_size=32",
        "method.local_crop_size=16",
        "method.out_dim=256",
        "method.head_hidden_dim=64",
        "method.bottleneck_dim=32",
        "+hvp=on",
        "trainer.max_epochs=2",
        "checkpoint.every_n_epochs=1",
        "eval.every_n_epochs=1",
    ]
    straight = run(make_cfg(*over), tmp_path / "straight")
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    (tmp_path / "resumed" / "checkpoints" / "last.ckpt").write_bytes(
        (tmp_path / "straight" / "checkpoints" / "epoch=001.ckpt").read_bytes()
    )
    resumed = run(make_cfg(*over), tmp_path / "resumed")
    a, b = _state(tmp_path / "straight"), _state(tmp_path / "resumed")
    assert any(k.startswith("teacher.") for k in a) and any("center" in k for k in a)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)
    for key in ("steps", "images_seen", "knn_top1"):
        assert resumed[key] == straight[key], key
    assert resumed["hvp"] == pytest.approx(straight["hvp"])


@pytest.mark.slow  # two runs
def test_wandb_resume_continues_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run(make_cfg("logger=wandb"), tmp_path)
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    run(resume_config(tmp_path, make_cfg("logger=wandb", "trainer.max_epochs=2"), ["trainer.max_epochs=2"]), tmp_path)
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    # offline-run-<date>_<time>-<id>; W&B appends -1 when two sessions start within the same second
    assert len(runs) == 2 and all(
        re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", r.name) for r in runs
    ), runs


def test_checkpoint_settings_are_validated():
    from hvp_lightning.config import ConfigError, validate

    with pytest.raises(ConfigError, match=r"trainer.enable_checkpointing=False is not allowed: not set here"):
        validate(make_cfg("+trainer.enable_checkpointing=false"))
    with pytest.raises(ConfigError, match=r"checkpoint.every_n_epochs=0 is not allowed"):
        validate(make_cfg("checkpoint.every_n_epochs=0"))
    with pytest.raises(ConfigError, match=r"checkpoint.every_n_steps=0 is not allowed"):
        validate(make_cfg("checkpoint.every_n_steps=0"))


@pytest.mark.slow  # two runs each
@pytest.mark.parametrize("data", ["synthetic", "images"])
def test_resume_with_resident_images_matches_straight_run(tmp_path, data):
    """``data.on_device=true``: the views' generator lives outside the checkpoint but is seeded
    per epoch, so a run restarted from its epoch-1 checkpoint ends where the 2-epoch run ended;
    for data=images (96 JPEGs + 5 held out) with its label-free monitors too."""
    over = [*RUN, "trainer.max_epochs=2", "data.on_device=true"]
    if data == "images":
        write_images(tmp_path / "images", 101)
        over = images_run(over, tmp_path / "images", 5)
    straight = run(make_cfg(*over, tiny=False), tmp_path / "straight")
    (tmp_path / "resumed" / "checkpoints").mkdir(parents=True)
    (tmp_path / "resumed" / "checkpoints" / "last.ckpt").write_bytes(
        (tmp_path / "straight" / "checkpoints" / "epoch=001.ckpt").read_bytes()
    )
    resumed = run(make_cfg(*over, tiny=False), tmp_path / "resumed")
    a, b = _state(tmp_path / "straight"), _state(tmp_path / "resumed")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=key)
    assert resumed["steps"] == straight["steps"] == 12 and resumed["knn_top1"] == straight["knn_top1"]
    assert resumed["monitor_history"] == straight["monitor_history"] and len(straight["monitor_history"]) == 2
    assert straight["cost"]["time_split"]["augment"] > 0  # the views cut and coloured after the copy: timed apart
