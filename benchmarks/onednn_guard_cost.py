"""CPU cost of hvp_lightning/nn/onednn_guard.py: a width-4 CIFAR ResNet-18 (its one guarded layer
is layer2's 1x1 stride-2 shortcut) with and without the guard, forward + backward, rounds
interleaved, 1 thread; prints the medians and their ratio. Run it on an AVX-512 CPU (the
unguarded net corrupts memory under oneDNN's AVX2 kernels).

    uv run python benchmarks/onednn_guard_cost.py
"""

import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hvp_lightning.nn.backbones import build_resnet  # noqa: E402
from hvp_lightning.nn.onednn_guard import NCHWOnCPUConv2d  # noqa: E402


def make(guard: bool) -> nn.Module:
    torch.manual_seed(0)
    net = build_resnet("resnet18", width=4, cifar_stem=True, channels_last=True)
    for m in net.modules():
        if not guard and isinstance(m, NCHWOnCPUConv2d):
            m.__class__ = nn.Conv2d
    return net


def main(rounds: int = 12, warmup: int = 2) -> None:
    torch.set_num_threads(1)
    nets = {"guarded": make(True), "unguarded": make(False)}
    x = torch.randn(64, 3, 32, 32)
    times: dict[str, list[float]] = {k: [] for k in nets}
    for _ in range(rounds):
        for name, net in nets.items():
            start = time.perf_counter()
            net(x).sum().backward()
            times[name].append(time.perf_counter() - start)
    med = {k: sorted(v[warmup:])[(rounds - warmup) // 2] for k, v in times.items()}
    print(
        {k: f"{v * 1e3:.1f} ms" for k, v in med.items()}, f"guarded/unguarded={med['guarded'] / med['unguarded']:.3f}"
    )


if __name__ == "__main__":
    main()
