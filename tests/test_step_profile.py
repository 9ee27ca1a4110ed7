"""benchmarks/step_profile.py on the CPU at a tiny size: the GPU stage (benchmarks/gpu_session.sh
``profile``) runs the same code, so it must not first fail on the device."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from .conftest import REPO

TINY_DINO = [
    "--method",
    "dino_cifar",
    "--data",
    "synthetic",
    "--images",
    "64",
    "--crop",
    "16",
    "--views",
    "3",
    "--batch-size",
    "8",
    "--workers",
    "0",
    "--warmup",
    "1",
    "--batches",
    "2",
    "--device",
    "cpu",
    "--top",
    "5",
    "--backbone",
    "vit_tiny",
    "--override",
    "backbone.patch_size=8",
    "backbone.img_size=16",
    "+backbone.depth=1",
    "method.local_crop_size=8",
    "method.out_dim=32",
    "method.head_hidden_dim=16",
    "method.bottleneck_dim=8",
]


def _load():
    spec = importlib.util.spec_from_file_location("step_profile", REPO / "benchmarks" / "step_profile.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["step_profile"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _row(text: str, name: str) -> list[str]:
    """The cells after the first of the markdown table row that starts with ``name``."""
    match = re.search(rf"^\| {re.escape(name)} \|(.*)\|$", text, re.MULTILINE)
    assert match, f"no row {name!r} in the report"
    return [c.strip() for c in match.group(1).split("|")]


@pytest.mark.slow  # five tiny fits: ~25 s on 2 cores
def test_step_profile_reports_rates_split_ranges_and_ops(tmp_path: Path) -> None:
    sp = _load()
    out = tmp_path / "profile.md"
    text = sp.main([*TINY_DINO, "--out", str(out)])
    assert out.read_text().endswith(text)
    for arm in ("hvp", "hvp_fixed_batch", "no_hvp", "no_hvp_fixed_batch"):
        steps, to_return = (float(x) for x in _row(text, arm))
        assert steps > 0 and to_return > 0
    for segment in ("batch_start", "before_backward", "before_optimizer_step", "batch_end"):
        assert float(_row(text, sp.SEGMENTS[segment])[0]) > 0
        assert _row(text, sp.SEGMENTS[segment])[1] == "n/a"  # no CUDA events on the CPU
    for name in ("hvp/selection", "hvp/train_forward"):
        host, _, calls = _row(text, name)
        assert float(host) > 0 and int(calls) == 2  # once per timed step
    assert int(_row(text, "hvp/ema")[2]) >= 1
    assert "By cpu_time_total" in text and "aten::" in text
    assert "Host syncs: n/a on the CPU" in text
