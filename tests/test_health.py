"""The label-free monitors (hvp_lightning/monitors/health.py) against their definitions computed
directly in NumPy, and at the cases that give them meaning: complete collapse, collapse to a
subspace, and an isotropic Gaussian."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hvp_lightning.monitors import health
from hvp_lightning.monitors.health import collapse_reason, feature_std, rankme


def numpy_rankme(z: np.ndarray, eps: float = 1e-7) -> float:
    """Garrido et al. (ICML 2023), eq. 1: p_k = s_k / ||s||_1 + eps, exp of the entropy of p."""
    s = np.linalg.svd(z.astype(np.float64), compute_uv=False)
    p = s / np.abs(s).sum() + eps
    return float(np.exp(-(p * np.log(p)).sum()))


def numpy_feature_std(z: np.ndarray) -> float:
    """SimSiam section 4.1: the std over samples of each dimension of z / ||z||_2, averaged."""
    u = z.astype(np.float64) / np.linalg.norm(z.astype(np.float64), axis=1, keepdims=True)
    return float(u.std(axis=0).mean())


@pytest.mark.parametrize("shape", [(300, 40), (25, 64), (64, 64)])
def test_equal_to_the_definitions(shape):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(*shape, generator=g) * torch.linspace(0.01, 3, shape[1]) + torch.rand(shape[1], generator=g)
    assert rankme(z) == pytest.approx(numpy_rankme(z.numpy()), rel=1e-9)
    assert feature_std(z) == pytest.approx(numpy_feature_std(z.numpy()), rel=1e-9)


def test_row_chunks_give_the_whole_matrix_result(monkeypatch):
    z = torch.randn(1000, 32, generator=torch.Generator().manual_seed(1)) + 2
    whole = rankme(z), feature_std(z)
    monkeypatch.setattr(health, "CHUNK", 97)
    assert (rankme(z), feature_std(z)) == pytest.approx(whole, rel=1e-9)


def test_constant_embeddings_are_complete_collapse():
    z = torch.full((200, 128), 0.7)
    assert rankme(z) == pytest.approx(1.0, abs=1e-3) and feature_std(z) == 0.0
    assert "RankMe" in collapse_reason(rankme(z), feature_std(z), 128)
    assert "feature std" in collapse_reason(rankme(z), feature_std(z), 128)


def test_isotropic_gaussian_has_full_rank_and_std_one_over_sqrt_d():
    d = 64
    z = torch.randn(40 * d, d, generator=torch.Generator().manual_seed(2))
    assert 0.97 * d < rankme(z) <= d
    assert feature_std(z) * math.sqrt(d) == pytest.approx(1.0, abs=0.02)
    assert collapse_reason(rankme(z), feature_std(z), d) is None


def test_embeddings_on_a_k_dimensional_subspace_have_rankme_k():
    """Equal singular values on k directions: RankMe is k, whatever d (up to the paper's eps,
    which adds eps to the d - k zero singular values' shares too)."""
    g = torch.Generator().manual_seed(3)
    n, d, k = 200, 96, 5
    left = torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64))[0]
    right = torch.linalg.qr(torch.randn(d, k, generator=g, dtype=torch.float64))[0]
    z = left @ right.T
    assert rankme(z) == pytest.approx(k, abs=1e-3) and rankme(z) == pytest.approx(numpy_rankme(z.numpy()), rel=1e-5)


def test_nearly_collapsed_cloud_is_flagged_and_a_spread_one_is_not():
    """A shared direction plus noise: flagged when the noise is 1/1000 of it (cosines ~1 - 1e-6),
    not when it is 1/10 (a random-init ResNet's level of spread)."""
    g = torch.Generator().manual_seed(4)
    n, d = 512, 128
    mean, noise = torch.rand(d, generator=g) + 0.5, torch.randn(n, d, generator=g)
    tight = mean + noise * mean.norm() / math.sqrt(d) * 1e-3
    loose = mean + noise * mean.norm() / math.sqrt(d) * 0.1
    assert collapse_reason(rankme(tight), feature_std(tight), d) is not None
    assert collapse_reason(rankme(loose), feature_std(loose), d) is None
