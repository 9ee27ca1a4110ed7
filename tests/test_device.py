"""The main job's device choice (trainer=auto, precision auto) and its start-up and final lines."""

from __future__ import annotations

import pytest
import torch

from hvp_lightning.config import validate
from hvp_lightning.device import auto_precision, device_line
from hvp_lightning.train import final_line

from .conftest import make_cfg


@pytest.mark.parametrize(("cuda", "bf16", "accelerator", "expected"), [
    (False, False, "auto", "32-true"),       # CPU-only machine: fp32, no flag needed
    (True, True, "auto", "bf16-mixed"),      # a bf16-capable GPU
    (True, False, "auto", "32-true"),        # an older GPU: fp32 rather than an fp16 surprise
    (True, True, "cpu", "32-true"),          # CPU asked for on a GPU machine: still fp32
])
def test_auto_precision(monkeypatch, cuda, bf16, accelerator, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert auto_precision(accelerator) == expected


def test_default_trainer_is_auto_and_validate_resolves_precision():
    cfg = make_cfg(tiny=False)
    assert cfg.trainer.accelerator == "auto" and cfg.trainer.precision == "auto"
    cfg = make_cfg("trainer=auto", "trainer.accelerator=cpu")
    validate(cfg)
    assert cfg.trainer.precision == "32-true"


def test_device_line_names_device_and_precision():
    line = device_line(torch.device("cpu"), "32-true")
    assert line == f"device: cpu ({torch.get_num_threads()} threads) | precision: 32-true"
    assert "x 2 processes" in device_line(torch.device("cpu"), "bf16-mixed", world_size=2)


def test_final_line_is_one_line_with_init_chance_run_dir_and_hvp_gap():
    summary = {"knn_top1": 0.5, "knn_top1_init": 0.125, "knn_chance": 0.1, "run_dir": "runs/x"}
    assert final_line(summary) == "k-NN top-1: 50.00% (at init 12.50%, chance 10.0%) | run dir: runs/x"
    hvp = dict(summary, hvp={"selection_selected_loss_mean": 5.25, "selection_candidate_loss_mean": 5.0})
    line = final_line(hvp)
    assert "\n" not in line and "| HVP selected - candidate loss: +0.2500 |" in line
    assert line.endswith("| run dir: runs/x")
    assert "at init" not in final_line(dict(summary, knn_top1_init=None))


def test_a_gpu_accelerator_without_a_gpu_is_one_line_naming_the_key(monkeypatch) -> None:
    """trainer=gpu (or eval's accelerator=gpu) on a machine without CUDA: the key and value,
    not Lightning's "No supported gpu backend found!"."""
    import torch

    from hvp_lightning.device import check_accelerator
    from hvp_lightning.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for accelerator in ("gpu", "cuda"):
        with pytest.raises(ConfigError, match=rf"^trainer.accelerator='{accelerator}' is not allowed: cpu or auto"):
            check_accelerator("trainer.accelerator", accelerator)
    for accelerator in ("cpu", "auto"):
        check_accelerator("trainer.accelerator", accelerator)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_accelerator("accelerator", "gpu")
