"""One view's blur and hue on the CPU, one thread (a benchmark, not a test), at 224 px.

PIL's blur: PIL itself with the tensor conversions (the per-view path from ca83e99 to cdd9f2e), the
int32 box passes in torch ops (``pil_blur_view``, the per-view path without a C compiler), the C
kernel (:mod:`hvp_lightning.data.cpu_kernels`, the per-view path), the batched ``pil_blur``, SimCLR's
trimmed separable kernel (23 px). The 9 px blur (``torchvision9``): torch's ``conv2d`` as torchvision
calls it (``torchvision_blur``) and the C convolution. Then the hue: ``batched.hue`` in torch ops
and the C kernel. Milliseconds of thread CPU time per call, mean of ``--calls``, per sigma.

    uv run python benchmarks/blur_cpu.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from hvp_lightning.data import cpu_kernels
from hvp_lightning.data.augment import pil_gaussian_blur
from hvp_lightning.data.batched import (
    gaussian_blur,
    hue,
    pil_blur,
    pil_blur_view,
    pil_box,
    pil_max_radius,
    torchvision_blur,
    torchvision_weights,
)


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
    native = cpu_kernels.kernels()
    if native is None:
        raise SystemExit("no C kernels (the log line above says why)")
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (1, 3, args.size, args.size), generator=g, dtype=torch.uint8).float()
    arms = (
        "PIL itself + conversions",
        "pil_blur_view (int32 torch ops)",
        "pil: C kernel",
        "pil_blur (batched)",
        "SimCLR 23 px, trimmed",
        "9 px: conv2d (torchvision_blur)",
        "9 px: C kernel",
    )
    print("| sigma | box r | " + " | ".join(arms) + " |")
    print("|---|---|" + "---|" * len(arms))
    for sigma in (0.1, 0.5, 1.0, 1.5, 2.0):
        s = torch.tensor([sigma])
        r, ww, fw = (int(b[0]) for b in pil_box(s))
        calls = (
            lambda sigma=sigma: pil_gaussian_blur(x[0].to(torch.uint8), sigma)[None].to(torch.float32),
            lambda s=s: pil_blur_view(x, *(int(b[0]) for b in pil_box(s))),
            lambda s=s: native.pil_blur(x, *(int(b[0]) for b in pil_box(s))),
            lambda s=s: pil_blur(x, s, pil_max_radius(2.0)),
            lambda s=s: gaussian_blur(x, s, 23, trim=True),
            lambda s=s: torchvision_blur(x, s, 9),
            lambda s=s: native.conv_reflect(x, torchvision_weights(s, 9)[0]).round_(),
        )
        ms = [cpu_ms(f, args.calls) for f in calls]
        print(f"| {sigma} | {r} | " + " | ".join(f"{m:.2f}" for m in ms) + " |")
    shift = torch.tensor([0.1])
    eager, c = cpu_ms(lambda: hue(x, shift), args.calls), cpu_ms(lambda: native.hue_(x.clone(), shift), args.calls)
    print(f"\nhue, one view: batched.hue (torch ops) {eager:.2f} ms, C kernel {c:.2f} ms")


if __name__ == "__main__":
    main()
