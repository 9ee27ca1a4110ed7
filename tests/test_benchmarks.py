"""benchmarks/loader.py's contract with the GPU session script (benchmarks/gpu_session.sh).

The device machine is lent for minutes a session: a benchmark that ignores its time limit, or
fails at the end after its rounds ran, costs the whole stage. Both happened on the first GPU run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from .conftest import REPO
from .test_device_guard import VIT


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_report_names_the_ratios_of_the_arms_it_ran() -> None:
    """A loader run without --shards has a ``pipeline`` but no ``shards`` arm: the report gives
    the rates and only the ratios whose both arms ran (it raised KeyError after all rounds)."""
    loader = load_script("loader")
    args = loader.parse_args(["--device", "cpu", "--reference"])
    res = {"pipeline": [10.0, 30.0], "workers": [20.0, 40.0], "reference": [5.0, 10.0]}
    text = loader.report(args, res, torch.device("cpu"), ["--reference"])
    assert "| pipeline | 20.0 | 10.0 | 30.0 | 2 |" in text
    assert "| pipeline / reference (per round) | 2.50x | 2.00x | 3.00x | 2 |" in text
    assert "shards" not in text and "step" not in text


@pytest.mark.slow
def test_sigterm_ends_the_step_benchmark(tmp_path: Path) -> None:
    """``timeout`` sends SIGTERM: the benchmark ends at once with 128 + 15, instead of Lightning
    stopping the round in progress and the next round starting."""
    cmd = [
        sys.executable,
        "benchmarks/loader.py",
        *("--data", "synthetic", "--image-size", "32", "--images", "64", "--crop", "16", "--views", "2"),
        *("--batch-size", "8", "--batches", "2", "--warmup", "1", "--rounds", "1000", "--workers", "0"),
        *("--step", "--method", "simsiam"),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:  # rounds are running
            if line.startswith("round 1 "):
                break
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_blur_cost_script_times_every_kind(tmp_path: Path) -> None:
    """view_cost.py batch (the GPU session's ``blur`` stage) on the CPU at a tiny size: a row per
    blur kind and shape, the step and the blur alone timed, the section appended to ``--out``."""
    out = tmp_path / "results.md"
    load_script("view_cost").main(
        ["batch", "--device", "cpu", "--shapes", "4x16", "--rounds", "1", "--calls", "1", "--out", str(out)]
    )
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 4x16 |")]
    assert [row.split(" | ")[1] for row in rows] == ["pil", "torchvision9", "simclr"]
    assert all(float(row.split(" | ")[2]) > 0 and float(row.split(" | ")[3]) > 0 for row in rows)


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
    *VIT[1:],  # the tiny ViT of the device guard; the backbone itself is named above
]


def _row(text: str, name: str) -> list[str]:
    """The cells after the first of the markdown table row that starts with ``name``."""
    match = re.search(rf"^\| {re.escape(name)} \|(.*)\|$", text, re.MULTILINE)
    assert match, f"no row {name!r} in the report"
    return [c.strip() for c in match.group(1).split("|")]


@pytest.mark.slow  # five tiny fits: ~20 s on 2 cores
def test_step_profile_reports_rates_split_ranges_and_ops(tmp_path: Path) -> None:
    """step_profile.py (the GPU session's ``profile`` stage) on the CPU at a tiny size: every arm's
    rate, the split between the hooks, the package's profiler ranges once per step, the op tables."""
    sp = load_script("step_profile")
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
