"""One view's blur on the CPU, one thread (a benchmark, not a test): PIL itself with the tensor
conversions (what the per-view path ran from ca83e99 to cdd9f2e), the int32 box passes
(``pil_blur_view``, the per-view path now), the batched ``pil_blur`` and SimCLR's trimmed separable
kernel (23 px), at 224 px. Milliseconds of thread CPU time per call, mean of ``--calls``, per sigma.

    uv run python benchmarks/blur_cpu.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from hvp_lightning.data.augment import pil_gaussian_blur
from hvp_lightning.data.batched import gaussian_blur, pil_blur, pil_blur_view, pil_box, pil_max_radius


def cpu_ms(f: Callable[[], object], calls: int) -> float:
    f()
    start = time.thread_time()
    for _ in range(calls):
        f()
    return (time.thread_time() - start) / calls * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--calls", type=int, default=100)
    args = p.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (1, 3, args.size, args.size), generator=g, dtype=torch.uint8).float()
    arms = ("PIL itself + conversions", "pil_blur_view (int32)", "pil_blur (batched)", "SimCLR 23 px, trimmed")
    print("| sigma | box r | " + " | ".join(arms) + " |")
    print("|---|---|---|---|---|---|")
    for sigma in (0.1, 0.5, 1.0, 1.5, 2.0):
        s = torch.tensor([sigma])
        r, ww, fw = (int(b[0]) for b in pil_box(s))
        calls = (
            lambda sigma=sigma: pil_gaussian_blur(x[0].to(torch.uint8), sigma)[None].to(torch.float32),
            lambda s=s: pil_blur_view(x, *(int(b[0]) for b in pil_box(s))),
            lambda s=s: pil_blur(x, s, pil_max_radius(2.0)),
            lambda s=s: gaussian_blur(x, s, 23, trim=True),
        )
        ms = [cpu_ms(f, args.calls) for f in calls]
        print(f"| {sigma} | {r} | " + " | ".join(f"{m:.2f}" for m in ms) + " |")


if __name__ == "__main__":
    main()
