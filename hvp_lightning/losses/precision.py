"""Plain fp32 arithmetic for candidate tables: a table's argmax must rank the loss the method computes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def exact_fp32(device_type: str) -> Iterator[None]:
    """Plain fp32 arithmetic for the candidate tables, whatever the step runs at: autocast off
    and no TF32. ``train.py`` allows TF32 matmuls on GPUs for the networks; in a table's
    einsum it would round the inputs to 10 mantissa bits and move DINO's cross-entropies by
    ~1e-3 of their size, enough to reorder near-tied candidates of the loss the method
    computes (elementwise, in fp32).

    Both of torch's precision APIs are set and put back exactly. The legacy one
    (``set_float32_matmul_precision``, train.py's) alone would crash the step of a user who set
    the newer ``fp32_precision`` flags (``torch.backends.fp32_precision = "tf32"``, the form
    PyTorch's TF32 notes recommend): the legacy getter then raises. The new flags alone would
    leave the legacy state at "high" while CUDA's matmul flag says "ieee", a mix that torch's
    ``allowTF32CuBLAS`` check rejects.
    """
    flags = (torch.backends.cuda.matmul, torch.backends.mkldnn.matmul)
    previous = [f.fp32_precision for f in flags]
    try:
        legacy: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:  # the new flags are set to a state the legacy API cannot name
        legacy = None
    try:
        if legacy is not None:
            torch.set_float32_matmul_precision("highest")
        for f in flags:
            f.fp32_precision = "ieee"
        with torch.autocast(device_type, enabled=False):
            yield
    finally:
        if legacy is not None:
            torch.set_float32_matmul_precision(legacy)
        for f, p in zip(flags, previous):  # after the legacy call, which rewrites both
            f.fp32_precision = p
