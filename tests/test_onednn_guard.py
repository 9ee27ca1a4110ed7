"""The guard for oneDNN's AVX2 1x1 weight-gradient bug (hvp_lightning/nn/onednn_guard.py).

The bug corrupts the heap only where oneDNN runs its AVX2 kernel; ``ONEDNN_MAX_CPU_ISA=AVX2``
forces that kernel on AVX-512 CPUs too, so the subprocess test fails without the guard on
any x86 machine (abort, segfault or, with threads, a hang caught by the subprocess timeout)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from hvp_lightning.nn.backbones import build_resnet
from hvp_lightning.nn.onednn_guard import NCHWOnCPUConv2d, hits_onednn_avx2_bug

from .conftest import REPO, SUBPROCESS_TIMEOUT_S

# A width-4 CIFAR ResNet-18 (layer2's downsample: 1x1, stride 2, 4 input channels), as the
# accumulation tests train it; 10 steps of forward + backward.
STEPS = """
import torch
from hvp_lightning.nn.backbones import build_resnet
torch.manual_seed(0)
net = build_resnet("resnet18", width=4, cifar_stem=True, channels_last=True)
for _ in range(10):
    net(torch.randn(16, 3, 16, 16)).sum().backward()
print("done")
"""


@pytest.mark.slow  # a fresh interpreter importing torch: ~10 s on 2 cores
def test_narrow_resnet_trains_with_onednn_avx2_kernels() -> None:
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", STEPS], cwd=REPO, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr[-2000:]


def test_guard_covers_exactly_the_faulty_layers_and_keeps_the_maths() -> None:
    torch.manual_seed(0)
    net = build_resnet("resnet18", width=4, cifar_stem=True, channels_last=True)
    guarded = [n for n, m in net.named_modules() if isinstance(m, NCHWOnCPUConv2d)]
    assert guarded == ["trunk.layer2.0.downsample.0"]  # IC 4; layer3/4 shortcuts have 8 and 16
    assert not any(hits_onednn_avx2_bug(m) for m in net.modules())
    assert "trunk.layer2.0.downsample.0.weight" in net.state_dict()  # keys unchanged
    wide = build_resnet("resnet18", width=8, cifar_stem=True, channels_last=True)
    assert not any(isinstance(m, NCHWOnCPUConv2d) for m in wide.modules())

    conv = net.trunk.layer2[0].downsample[0]
    plain = nn.Conv2d(4, 8, 1, stride=2, bias=False)
    plain.weight.data.copy_(conv.weight.data)
    x = torch.randn(2, 4, 6, 6).contiguous(memory_format=torch.channels_last)
    y, y_ref = conv(x), plain(x.contiguous())
    assert y.is_contiguous()  # ran in NCHW
    torch.testing.assert_close(y, y_ref)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    torch.testing.assert_close(conv.weight.grad, plain.weight.grad)
