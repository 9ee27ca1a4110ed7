"""The candidate views HVP asks the loader for, per image, of a multi-crop method."""

from __future__ import annotations

import math

from omegaconf import DictConfig

from ..schema import hvp_config


def num_global_candidates(cfg: DictConfig) -> int:
    """G, the global candidates per image of a multi-crop method with HVP on:
    ``hvp.num_global_candidates``, default ``hvp.num_views``."""
    hvp = hvp_config(cfg)
    return hvp.num_global_candidates or hvp.num_views


def candidate_counts(cfg: DictConfig) -> tuple[int, int]:
    """(G global, Lc local) views the loader produces per image (DINO).

    HVP off: (2, L). HVP on: ``hvp.num_global_candidates`` (default ``hvp.num_views``, i.e.
    4) and ``hvp.num_local_candidates`` (default ``ceil(L * num_views / 2)``, i.e. 2L): each
    of DINO's crops is drawn ``num_views / 2`` times, as in the paper's 4 + 16 setting.
    """
    num_local = int(cfg.method.num_local_crops)
    hvp = hvp_config(cfg)
    if not hvp.enabled:
        return 2, num_local
    lc = hvp.num_local_candidates
    return num_global_candidates(cfg), int(math.ceil(num_local * hvp.num_views / 2) if lc is None else lc)
