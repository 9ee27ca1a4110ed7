"""HVP's settings (the ``hvp`` config group)."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig


@dataclass(frozen=True)
class HVPConfig:
    """What the paper varies: number of views, choice rule, frequency, selection precision.

    Args:
        enabled: HVP on; off, a method is the original one (2 views per image).
        num_views: Candidate views per image N (``hvp.num_views``).
        mode: ``"hard"``, ``"easy"`` or ``"random"`` (see :func:`choose`).
        every_n_steps: Select on every n-th optimiser step; other steps train on candidate column 0.
        selection_precision: Precision of the selection forward (``auto``: the step's; fp32 on CPU).
        max_combinations: Multi-crop only: score K random combinations; ``None`` = exact.
        global_pairs: Multi-crop only: ``"cross"`` or ``"all"`` (see :func:`global_pair_index`).
        colour: ``"per_view"`` (each candidate its own colour draw) or ``"static"`` (one per
            image, applied to the chosen pair after an uncoloured selection; paper section 6).
    """

    enabled: bool = False
    num_views: int = 4
    mode: str = "hard"
    every_n_steps: int = 1
    selection_precision: str = "auto"
    # Multi-crop methods only: score K random combinations instead of the exact maximum
    # (the paper's fidelity setting); None = exact.
    max_combinations: int | None = None
    # Multi-crop methods only: the global pairs scored (GLOBAL_PAIRS).
    global_pairs: str = "cross"
    colour: str = "per_view"

    @property
    def views_per_image(self) -> int:
        """Candidate views the data pipeline must produce per image (2 = baseline)."""
        return self.num_views if self.enabled else 2


def hvp_config(cfg: DictConfig) -> HVPConfig:
    """The run's :class:`HVPConfig`: off unless the config has an ``hvp`` node with ``enabled``."""
    node = cfg.get("hvp")
    if node is None or not node.get("enabled", False):
        return HVPConfig(enabled=False)
    return HVPConfig(
        enabled=True,
        num_views=node.num_views,
        mode=node.mode,
        every_n_steps=node.every_n_steps,
        selection_precision=node.selection_precision,
        max_combinations=node.get("max_combinations"),
        global_pairs=node.get("global_pairs", "cross"),
        colour=node.get("colour", "per_view"),
    )
