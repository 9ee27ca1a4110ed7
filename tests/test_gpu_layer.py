"""The GPU layer's own checks (tests/test_gpu.py), run on the CPU.

No session may have a GPU for a while; a GPU test that has drifted from the package (a renamed
summary key, a changed signature) would then fail for that reason alone on the first GPU that
runs it. One case of the whole-run check runs here on the CPU instead (slow tier), and every
config the layer composes passes the start-up checks: each method once and each precision x HVP
setting once in the default suite, the whole product in the slow tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_gpu import HVP, METHOD, PRECISIONS, check_run, gpu_cfg


@pytest.mark.slow  # a whole run
def test_gpu_run_checks_hold_on_the_cpu(tmp_path: Path) -> None:
    check_run("simsiam", "32-true", True, "auto", tmp_path, trainer="cpu")


def _validate_all(cases) -> None:
    from hvp_lightning.config import validate

    for args in cases:
        validate(gpu_cfg(*args))


@pytest.mark.slow  # every GPU config through the start-up checks
def test_gpu_layer_configs_of_each_method_and_setting_pass_the_start_up_checks() -> None:
    """Every method (HVP on, bf16, resident views) and every precision x HVP setting (SimSiam)."""
    _validate_all(
        [*((m, "bf16-mixed", True, "auto", "data.on_device=true") for m in METHOD)]
        + [("simsiam", p, hvp, selection) for p in PRECISIONS for hvp, selection in HVP]
    )


@pytest.mark.slow  # 80 configs composed and checked: ~15 s on 2 cores
def test_gpu_layer_configs_pass_the_start_up_checks() -> None:
    """Every config the GPU layer composes is one ``train.py`` would accept."""
    _validate_all(
        [(m, p, hvp, selection) for m in METHOD for p in PRECISIONS for hvp, selection in HVP]
        + [(m, "bf16-mixed", True, "auto", "data.on_device=true") for m in METHOD]
    )
