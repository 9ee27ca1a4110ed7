"""DINO's per-sample loss against the official loop form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hvp_lightning.losses import dino_cross_entropy, dino_loss


def reference_dino_loss(
    student_output: torch.Tensor,
    teacher_output: torch.Tensor,
    center: torch.Tensor,
    tau_t: float,
    tau_s: float,
    ncrops: int,
) -> torch.Tensor:
    """The official DINO loss, written in its loop form (concatenated crops, chunked)."""
    student_out = (student_output / tau_s).chunk(ncrops)
    teacher_out = F.softmax((teacher_output - center) / tau_t, dim=-1).chunk(2)
    total, n_terms = 0.0, 0
    for iq, q in enumerate(teacher_out):
        for v in range(len(student_out)):
            if v == iq:
                continue
            loss = torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1)
            total += loss.mean()
            n_terms += 1
    return total / n_terms  # type: ignore[return-value]


def _logits(*shape: int, seed: int) -> torch.Tensor:
    return 3 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("num_local", [0, 3])
def test_dino_loss_matches_official_loop(num_local: int) -> None:
    b, k = 5, 12
    t = _logits(2, b, k, seed=0)
    s = _logits(2 + num_local, b, k, seed=1)
    center = _logits(1, k, seed=2) * 0.1
    per_sample = dino_loss(list(t), list(s), center, 0.04, 0.1)
    assert per_sample.shape == (b,)
    expected = reference_dino_loss(s.flatten(0, 1), t.flatten(0, 1), center, 0.04, 0.1, 2 + num_local)
    torch.testing.assert_close(per_sample.mean(), expected)
    # dino_cross_entropy is one term of it.
    ce = dino_cross_entropy(t[0], s[1], center, 0.04, 0.1)
    ref = -(F.softmax((t[0] - center) / 0.04, -1) * F.log_softmax(s[1] / 0.1, -1)).sum(-1)
    torch.testing.assert_close(ce, ref)
