"""Cross-checks of the losses against lightly, an independent implementation (test-only).

Conventions (docs/DESIGN.md): lightly's NTXentLoss equals the official two-direction NT-Xent
averaged over 2B anchors; its DINOLoss takes the teacher list first.
"""

from __future__ import annotations

import pytest
import torch

from hvp_lightning.losses import dino_loss, simsiam_loss

lightly_loss = pytest.importorskip("lightly.loss", reason="lightly is a dev dependency (uv sync installs it)")


def test_simsiam_matches_lightly_negative_cosine_similarity():
    g = torch.Generator().manual_seed(0)
    p1, p2, z1, z2 = (torch.randn(9, 24, generator=g) for _ in range(4))
    crit = lightly_loss.NegativeCosineSimilarity()
    expected = 0.5 * (crit(p1, z2) + crit(p2, z1))
    assert torch.allclose(simsiam_loss(p1, p2, z1, z2).mean(), expected, atol=1e-6)


@pytest.mark.parametrize("num_local", [0, 3])
def test_dino_matches_lightly(num_local):
    g = torch.Generator().manual_seed(num_local)
    b, k, tau_t, tau_s = 5, 32, 0.04, 0.1
    teacher = [torch.randn(b, k, generator=g) for _ in range(2)]
    student = [torch.randn(b, k, generator=g) for _ in range(2 + num_local)]
    oracle = lightly_loss.DINOLoss(
        output_dim=k, warmup_teacher_temp=tau_t, teacher_temp=tau_t, warmup_teacher_temp_epochs=0, student_temp=tau_s
    )
    expected = oracle(teacher, student, epoch=0)  # its centre starts at zero
    ours = dino_loss(teacher, student, torch.zeros(1, k), tau_t, tau_s).mean()
    assert torch.allclose(ours, expected, atol=1e-5)
