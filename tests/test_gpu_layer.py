"""The GPU layer's own checks (tests/test_gpu.py), run on the CPU in the default suite.

No session may have a GPU for a while; a GPU test that has drifted from the package (a renamed
summary key, a changed signature) would then fail for that reason alone on the first GPU that
runs it. One case of the whole-run check runs here on the CPU instead.
"""

from __future__ import annotations

from pathlib import Path

from .test_gpu import check_run


def test_gpu_run_checks_hold_on_the_cpu(tmp_path: Path) -> None:
    check_run("simsiam", "32-true", True, "auto", tmp_path, trainer="cpu")


def test_gpu_layer_configs_pass_the_start_up_checks() -> None:
    """Every config the GPU layer composes is one ``train.py`` would accept."""
    from hvp_lightning.config import validate

    from .test_gpu import HVP, METHOD, PRECISIONS, gpu_cfg

    for method in METHOD:
        for precision in PRECISIONS:
            for hvp, selection in HVP:
                validate(gpu_cfg(method, precision, hvp, selection))
        validate(gpu_cfg(method, "bf16-mixed", True, "auto", "data.on_device=true"))
