"""A tiny ``+hvp=on`` run of each method added after the paper's four (BYOL, MoCo v3, VICReg,
Barlow Twins) on the built-in data, then the console commands on its checkpoint: hvp-export and
eval.py (k-NN, linear probe with the method's recipe)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hvp_lightning.evaluation import evaluate
from hvp_lightning.nn.backbones import build_resnet
from hvp_lightning.training import export

from ..conftest import eval_cfg, make_cfg

# The method's CIFAR preset and, for the predictor methods, a small predictor.
TINY = {
    "byol": ["method=byol_cifar", "method.pred_hidden_dim=32"],
    "mocov3": ["method=mocov3_cifar", "method.pred_hidden_dim=32"],
    "vicreg": ["method=vicreg_cifar"],
    "barlow_twins": ["method=barlow_twins_cifar"],
}


@pytest.mark.slow  # a run, its export and two evaluations
@pytest.mark.parametrize("method", list(TINY))
def test_tiny_train_with_hvp_then_export_and_eval(method: str, tmp_path: Path) -> None:
    """One epoch; the hard choice's loss is at least the candidates' mean; a momentum method's
    target moved and is in the checkpoint; the export is the (online) backbone, what every paper
    evaluates, with the projector dropped."""
    from hvp_lightning.training.driver import run

    summary = run(make_cfg(*TINY[method], "+hvp=on", "data.image_size=16"), tmp_path)
    assert summary["method"] == method and summary["hvp_enabled"] is True and summary["steps"] == 4
    assert summary["train_loss"] is not None and math.isfinite(summary["train_loss"])
    assert summary["hvp"]["selected_samples"] == 64
    cost = summary["cost"]  # the method's step counted on the meta device: its views and networks
    assert cost["selected_images"] == 64 and 0 < cost["selection_flops_per_image"] < cost["train_flops_per_image"]
    assert summary["hvp"]["selection_selected_loss_mean"] >= summary["hvp"]["selection_candidate_loss_mean"]
    assert summary["knn_top1"] is not None
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    momentum = method in ("byol", "mocov3")
    assert ("target.projector.0.weight" in state) == momentum
    if momentum:
        w, t = state["projector.0.weight"], state["target.projector.0.weight"]
        assert w.shape == t.shape and not torch.equal(w, t)
    # eval.py's k-NN repeats the run's final monitor; the linear probe takes the method's own
    # recipe (conf/protocol/linear.yaml).
    assert export.main([str(tmp_path), str(tmp_path / "backbone.pth")]) == 0
    exported = torch.load(tmp_path / "backbone.pth", weights_only=True)
    build_resnet("resnet18", width=8, cifar_stem=True).trunk.load_state_dict(exported, strict=True)
    torch.testing.assert_close(exported["conv1.weight"], state["backbone.trunk.conv1.weight"])
    if momentum:
        assert not torch.equal(exported["conv1.weight"], state["target.backbone.trunk.conv1.weight"])
    knn = evaluate(eval_cfg(f"ckpt={tmp_path}", "protocol=knn"))
    assert knn["features"] == "backbone" and knn["metrics"]["k20"]["top1"] == summary["knn_top1"]
    linear = evaluate(eval_cfg(f"ckpt={tmp_path}", "protocol=linear", "protocol.epochs=1", "protocol.batch_size=32"))
    assert linear["settings"]["recipe"] == method and 0 <= linear["metrics"]["top1"] <= 1
