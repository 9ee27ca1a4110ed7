"""One view's blur on the CPU, one thread, per blur kind (``data.aug.blur_kind``), at 224 and 96 px:
PIL's GaussianBlur (``pil``), torchvision's GaussianBlur(9, sigma) call that the ``torchvision9``
kind runs view by view (bit-exact), and the separable 9-tap blur of ``batched.gaussian_blur``
(within one level of it). Median of 5 rounds of 50 calls, the kinds alternated in each round.

    uv run python benchmarks/blur_kinds_cost.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from hvp_lightning.data.augment import pil_gaussian_blur, torchvision_gaussian_blur
from hvp_lightning.data.batched import gaussian_blur

SIGMA = 1.05  # the middle of the presets' sigma range 0.1-2


def kinds(x: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    return {
        "pil": lambda: pil_gaussian_blur(x, SIGMA),
        "torchvision9 (torchvision's call)": lambda: torchvision_gaussian_blur(x, SIGMA, 9),
        "separable 9 taps": lambda: gaussian_blur(x[None].float(), torch.tensor([SIGMA]), 9, trim=True),
    }


def main() -> None:
    torch.set_num_threads(1)
    print("| crop | blur | ms per view |\n|---|---|---|")
    for size in (224, 96):
        fns = kinds((torch.rand(3, size, size) * 256).to(torch.uint8))
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(5):
            for name, fn in fns.items():
                start = time.perf_counter()
                for _ in range(50):
                    fn()
                times[name].append((time.perf_counter() - start) / 50 * 1e3)
        for name, ms in times.items():
            print(f"| {size} | {name} | {statistics.median(ms):.2f} |")


if __name__ == "__main__":
    main()
