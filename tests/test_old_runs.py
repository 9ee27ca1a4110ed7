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

from .conftest import make_cfg

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
