"""Label-free health of an embedding: is the representation collapsing?

Two numbers on embeddings ``z`` ``[n, d]`` of a fixed sample of images (the evaluation backbone's
pooled features, what k-NN uses), pure functions of ``z``:

* :func:`rankme` -- the effective rank of ``z`` (Garrido et al., "RankMe: Assessing the
  downstream performance of pretrained self-supervised representations by their rank", ICML
  2023, eq. 1): with ``s`` the singular values of ``z`` (raw, not centred or normalised, as
  there), ``p_k = s_k / ||s||_1 + eps`` and ``RankMe = exp(-sum_k p_k log p_k)``, eps = 1e-7.
  It lies in ``[1, min(n, d)]`` (up to eps): 1 when every embedding is one vector (complete
  collapse), ``min(n, d)`` when all singular values are equal.
* :func:`feature_std` -- the mean over dimensions of the standard deviation (over samples) of
  the l2-normalised embeddings (Chen & He, "Exploring Simple Siamese Representation Learning",
  CVPR 2021, section 4.1): 0 when the embeddings collapse to one direction, ``1/sqrt(d)``
  when they are spread as a d-dimensional isotropic Gaussian's directions are.

:func:`collapse_reason` turns them into a verdict, thresholds below.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

RANKME_EPS = 1e-7  # the paper's epsilon

# Collapse thresholds (docs/data.md "Label-free monitors"); the warning is for a collapse to
# (nearly) one vector, which both numbers show; a slow fall of RankMe (dimensional collapse) is for
# the curves, not for a warning.
# feature std < 0.01 / sqrt(d). The per-dimension variances of unit vectors sum to 1 - |mean|^2,
# so std * sqrt(d) ~ sqrt(1 - mean cosine similarity): 0.01 is a cloud whose pairwise cosines are
# ~0.9999. Not SimSiam's 1/sqrt(d) scale divided by 10: a ResNet's ReLU features share a large mean
# direction, and at random init (CIFAR images, CIFAR-stem ResNet-18, width 16 or 64) they measure
# 0.095 / sqrt(d), so 0.1 would flag the start of every ResNet run; 0.01 is 100x less spread than that.
STD_COLLAPSE = 0.01
# RankMe < 2: the embeddings span effectively fewer than two directions, whatever d is (the same
# random-init ResNets measure 14 and 42, complete collapse measures 1). An absolute floor, not a
# fraction of min(n, d), so that the verdict does not depend on the monitor sample's size.
RANKME_COLLAPSE = 2.0


CHUNK = 8192  # rows a time: a 50,000-image test set of 2048-d features never meets a float64 copy whole


def singular_values(z: torch.Tensor) -> torch.Tensor:
    """Singular values of ``z`` ``[n, d]``, largest first, float64: the square roots of the
    eigenvalues of its ``min(n, d)``-sided Gram matrix, summed over row chunks, so the memory is
    ``min(n, d)^2`` whatever ``n``. Their absolute error is ~1e-8 of the largest, below what
    RankMe's eps lets count."""
    n, d = z.shape
    if n >= d:
        gram = sum((c.double().T @ c.double() for c in z.detach().split(CHUNK)), torch.zeros((), dtype=torch.float64))
    else:
        zd = z.detach().double()
        gram = zd @ zd.T
    return torch.linalg.eigvalsh(gram).clamp_min(0).sqrt().flip(0)


def rankme(z: torch.Tensor, eps: float = RANKME_EPS) -> float:
    """RankMe of embeddings ``z`` ``[n, d]``."""
    s = singular_values(z)
    p = s / s.sum().clamp_min(torch.finfo(torch.float64).tiny) + eps
    return float(torch.exp(-(p * p.log()).sum()))


def feature_std(z: torch.Tensor) -> float:
    """Mean per-dimension std (population, over the ``n`` samples) of the l2-normalised ``z``."""
    total = torch.zeros(2, z.shape[1], dtype=torch.float64, device=z.device)
    for c in z.detach().split(CHUNK):
        u = F.normalize(c.double(), dim=1)
        total += torch.stack([u.sum(0), (u * u).sum(0)])
    mean, square = total / z.shape[0]
    return float((square - mean * mean).clamp_min(0).sqrt().mean())


def collapse_reason(rank: float, std: float, dim: int) -> str | None:
    """Why the monitors say "collapse" (the warning's text), or None when they do not:
    ``std < 0.01 / sqrt(dim)`` or ``rank < 2``."""
    reasons = []
    if std * math.sqrt(dim) < STD_COLLAPSE:
        reasons.append(f"feature std {std * math.sqrt(dim):.3f}/sqrt(d) < {STD_COLLAPSE}/sqrt(d)")
    if rank < RANKME_COLLAPSE:
        reasons.append(f"RankMe {rank:.2f} < {RANKME_COLLAPSE:g}")
    return " and ".join(reasons) or None
