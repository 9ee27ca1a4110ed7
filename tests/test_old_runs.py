"""Run dirs written before the package's modules moved into folders still load and resume.

``tests/fixtures/run-0.1.0`` is a tiny SimSiam + HVP run (1 epoch, 4 steps) written by main at
aeef57a, the last commit with the flat package root. The package has since moved its modules into
folders and its run-dir paths into one object; neither may change what is on disk or in a
checkpoint, so this old run must load, export and continue as it would have then.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hvp_lightning.training.checkpoint import build_method, load_checkpoint, resume_config
from hvp_lightning.training.driver import run
from hvp_lightning.training.export import main as export_main

from .conftest import make_cfg, run_cli

OLD_RUN = Path(__file__).parent / "fixtures" / "run-0.1.0"
# the overrides (on top of conftest's tiny config) that wrote the fixture
OVER = [
    "+hvp=on",
    "hvp.num_views=3",
    "backbone.width=4",
    "method.proj_hidden_dim=16",
    "method.proj_dim=16",
    "method.pred_hidden_dim=8",
]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state_dict"]


def test_an_old_checkpoint_loads_builds_its_method_and_exports(tmp_path: Path) -> None:
    ckpt = load_checkpoint(OLD_RUN / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 4 and ckpt["hvp_lightning"]["images_seen"] == 64
    method = build_method(ckpt)
    assert type(method).__name__ == "SimSiam" and method.hvp.enabled and method.hvp.num_views == 3
    for name, value in method.state_dict().items():
        assert torch.equal(value, ckpt["state_dict"][name]), name
    assert export_main([str(OLD_RUN), str(tmp_path / "backbone.pt")]) == 0
    backbone = torch.load(tmp_path / "backbone.pt", weights_only=True)
    trunk = method.backbone.trunk.state_dict()
    assert backbone.keys() == trunk.keys() and all(torch.equal(backbone[k], trunk[k]) for k in trunk)
    # the export folder: the same tensors, the run's record read from the old checkpoint and summary.json
    assert export_main([str(OLD_RUN), str(tmp_path / "folder")]) == 0
    folder = load_file(tmp_path / "folder" / "model.safetensors")
    assert folder.keys() == trunk.keys() and all(torch.equal(folder[k], trunk[k]) for k in trunk)
    record = json.loads((tmp_path / "folder" / "config.json").read_text())["hvp"]
    assert (record["epochs"], record["images_seen"], record["global_step"]) == (1, 64, 4)
    assert record["knn"]["top1"] == json.loads((OLD_RUN / "summary.json").read_text())["knn_top1"]


@pytest.mark.slow  # the old run continued for a second session, and a run of today
def test_an_old_run_dir_continues_where_it_stopped(tmp_path: Path) -> None:
    """The same command with one more epoch continues the old run dir: its step, k-NN history,
    CSV rows, session clock and view log go on, and its weights are those today's code reaches
    in the same two sessions (equal on the machine that wrote the fixture, within float noise
    on another CPU)."""
    old = tmp_path / "old"
    shutil.copytree(OLD_RUN, old)
    stored = load_checkpoint(OLD_RUN / "checkpoints" / "last.ckpt")["hvp_lightning"]["knn_history"]
    over = [*OVER, "trainer.max_epochs=2"]
    summary = run(resume_config(old, make_cfg(*over), over), old)
    assert (summary["epochs"], summary["steps"], summary["images_seen"]) == (2, 8, 128)
    assert summary["knn_history"][: len(stored)] == stored and summary["knn_history"][-1]["step"] == 8
    assert summary["hvp"]["selected_samples"] == 128  # the old run's HVP totals carried over
    cost = summary["cost"]  # its model FLOPs cover both sessions (counted from those carried-over counts)
    assert (cost["images"], cost["selected_images"], cost["session_images"]) == (128, 128, 64)
    assert cost["total_flops"] == 128 * (cost["train_flops_per_image"] + cost["selection_flops_per_image"])
    assert len(json.loads((old / "sessions.json").read_text())["sessions_s"]) == 2
    rows = list(csv.DictReader((old / "csv" / "metrics.csv").open()))
    old_rows = list(csv.DictReader((OLD_RUN / "csv" / "metrics.csv").open()))
    trained = [{k: v for k, v in o.items() if not k.startswith("knn/")} for o in old_rows]
    assert len(rows) > len(old_rows) and all(r.items() >= o.items() for r, o in zip(rows, trained))
    steps_log = (old / "analysis" / "steps-r0.csv").read_text().splitlines()
    assert len(steps_log) > len((OLD_RUN / "analysis" / "steps-r0.csv").read_text().splitlines())

    # the same two sessions run by today's code from scratch: same weights after each
    new = tmp_path / "new"
    run(make_cfg(*OVER), new)
    _assert_close(_weights(new), _weights(OLD_RUN))
    run(resume_config(new, make_cfg(*over), over), new)
    _assert_close(_weights(new), _weights(old))


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), rtol=1e-4, atol=1e-6), name


# Two more run dirs, each with what its own code gave on resuming it for one more epoch and on a
# k-NN evaluation (<run dir>.expected.json): DINO + HVP around a small timm ViT, written before the
# methods became the library's typed LightningModules (main at c496d71); SimCLR + HVP written on
# 2026-11-25 (main at 8218df3), before backbone.zero_init_residual and other keys existed.
DINO_RUN = Path(__file__).parent / "fixtures" / "run-dino-c496d71"
EARLY_RUN = Path(__file__).parent / "fixtures" / "run-simclr-8218df3"


def _expected(run_dir: Path) -> dict:
    return json.loads(run_dir.with_name(run_dir.name + ".expected.json").read_text())


def test_the_run_dirs_of_earlier_versions_build_their_methods_and_read_their_keys() -> None:
    """Both load: the method built from the stored config holds the checkpoint's weights, the
    DINO run's settings are its config's, and the early run's missing keys take the values its
    code used (zero_init_residual off), not today's defaults."""
    from hvp_lightning.training.checkpoint import checkpoint_config

    for run_dir, name in ((DINO_RUN, "DINO"), (EARLY_RUN, "SimCLR")):
        ckpt = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
        method = build_method(ckpt)
        assert type(method).__name__ == name and method.hvp.enabled
        for key, value in method.state_dict().items():
            assert torch.equal(value, ckpt["state_dict"][key]), key
    dino = build_method(load_checkpoint(DINO_RUN / "checkpoints" / "last.ckpt"))
    assert (dino.settings.out_dim, dino.settings.num_local_crops, dino.hvp.max_combinations) == (64, 2, None)
    early = checkpoint_config(load_checkpoint(EARLY_RUN / "checkpoints" / "last.ckpt"))
    assert (
        early.backbone.zero_init_residual is False
        and "zero_init_residual"
        not in (load_checkpoint(EARLY_RUN / "checkpoints" / "last.ckpt")["hyper_parameters"]["cfg"]["backbone"])
    )


@pytest.mark.slow  # two runs resumed for an epoch each, and their k-NN evaluations
@pytest.mark.parametrize("run_dir", [DINO_RUN, EARLY_RUN], ids=["dino-c496d71", "simclr-8218df3"])
def test_a_run_dir_of_an_earlier_version_resumes_and_evaluates(run_dir: Path, tmp_path: Path) -> None:
    """``train.py resume=<run dir> trainer.max_epochs=2`` continues it for its second epoch, and
    ``eval.py protocol=knn`` evaluates it. The DINO run continues as its own code continued it
    (weights and loss; equal on one machine and thread count, within float noise else); the early
    run, whose views have changed since (counter-based seeds, the blur kinds), continues from its
    checkpoint with its first session's k-NN history, step and images kept."""
    from hvp_lightning.cli import evaluate_main, train

    expected = _expected(run_dir)
    old = tmp_path / "run"
    shutil.copytree(run_dir, old)
    stored = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["hvp_lightning"]
    code, out, err = run_cli(train, f"resume={old}", "trainer.max_epochs=2", "data.num_workers=0", cwd=tmp_path)
    assert code == 0, err[-2000:]
    summary = json.loads((old / "summary.json").read_text())
    assert (summary["steps"], summary["epochs"]) == (expected["global_step"], 2)
    assert summary["knn_history"][: len(stored["knn_history"])] == stored["knn_history"]
    assert summary["images_seen"] == 2 * stored["images_seen"]
    if run_dir == DINO_RUN:  # the same code path as its own version's
        assert summary["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-5)
        state = load_checkpoint(old / "checkpoints" / "last.ckpt")["state_dict"]
        for key, (_, absolute) in expected["tensor_sums"].items():
            assert float(state[key].double().abs().sum()) == pytest.approx(absolute, rel=1e-5, abs=1e-8), key
    code, out, err = run_cli(
        evaluate_main, "protocol=knn", f"ckpt={run_dir}", f"out_dir={tmp_path / 'eval'}", cwd=tmp_path
    )
    assert code == 0, err[-2000:]
    metrics = json.loads((tmp_path / "eval" / "eval_summary.json").read_text())["metrics"]
    knn = expected["eval_knn_of_fixture"]
    assert (metrics["top1"], metrics["top5"], metrics["k10"]["top1"]) == (knn["top1"], knn["top5"], knn["k10_top1"])
