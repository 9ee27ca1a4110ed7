"""Guard against a oneDNN kernel bug that corrupts memory on AVX2-only x86 CPUs.

oneDNN's AVX2 weight-gradient kernel for 1x1 convolutions (``jit_1x1:avx2``; torch 2.13 ships
oneDNN 3.12) writes past its workspace when the source is channels_last (nhwc), the stride is
> 1 and the layer has fewer input channels than the kernel's 8-channel block (2..7 measured;
upstream: uxlfoundation/oneDNN#6035). glibc then aborts ("double free or corruption",
"corrupted size vs. prev_size"), the process segfaults, or with 2+ threads it spins forever,
often a few steps after the bad write. In this project's ResNets that layer is the stride-2
downsample shortcut of a narrow trunk (``backbone.width`` < 8, e.g. the tests' width 4).
AVX-512 CPUs run another kernel (``jit_1x1:avx512_core``, correct); AVX/SSE CPUs run a GEMM.
Minimal reproducer (``ONEDNN_MAX_CPU_ISA=AVX2`` makes an AVX-512 CPU take the AVX2 kernel)::

    OMP_NUM_THREADS=1 ONEDNN_MAX_CPU_ISA=AVX2 python -c "import torch; cl = torch.channels_last
    w = torch.randn(8, 4, 1, 1).to(memory_format=cl).requires_grad_()
    for _ in range(20): torch.nn.functional.conv2d(
        torch.randn(16, 4, 16, 16).to(memory_format=cl), w, stride=2).sum().backward()"

The guard runs exactly those convolutions with NCHW input and weight on CPU, where oneDNN's
blocked-layout path is correct. It does so on every CPU, so no result depends on the
instruction set; the rest of the trunk stays channels_last and CUDA is untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

AVX2_IC_BLOCK = 8  # input-channel block of the AVX2 kernel: layers with fewer channels are hit


def hits_onednn_avx2_bug(conv: nn.Module) -> bool:
    """Would this layer's CPU weight gradient run the faulty kernel (given channels_last)?"""
    return (
        type(conv) is nn.Conv2d
        and conv.kernel_size == (1, 1)
        and conv.stride != (1, 1)
        and conv.in_channels < AVX2_IC_BLOCK
        and conv.padding_mode == "zeros"
    )


def nchw(t: torch.Tensor) -> torch.Tensor:
    """``t`` with NCHW strides. ``contiguous()`` is not enough: a 1x1 weight ``[O, I, 1, 1]``
    (or an input with H = W = 1) in channels_last strides already counts as contiguous, and
    torch then still picks the channels_last kernel for it."""
    if t.is_contiguous(memory_format=torch.channels_last):
        return t.clone(memory_format=torch.contiguous_format)
    return t.contiguous()


class NCHWOnCPUConv2d(nn.Conv2d):
    """A ``Conv2d`` that computes in NCHW on CPU whatever the memory format of its input and
    weight, so oneDNN takes its blocked-layout path (output NCHW: the next add or conv takes
    the channels_last layout back from its other operand)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return super().forward(x)
        return F.conv2d(nchw(x), nchw(self.weight), self.bias, self.stride, self.padding, self.dilation, self.groups)


def guard_onednn_avx2_1x1(module: nn.Module) -> int:
    """Turn every layer of ``module`` that :func:`hits_onednn_avx2_bug` into a
    :class:`NCHWOnCPUConv2d` in place (same parameters, so state_dict keys and values are
    unchanged); returns how many were guarded."""
    hit = [m for m in module.modules() if hits_onednn_avx2_bug(m)]
    for conv in hit:
        conv.__class__ = NCHWOnCPUConv2d  # a subclass without state of its own: only forward changes
    return len(hit)
