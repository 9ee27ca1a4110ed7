"""``hvp``: Hard View Pretraining's keys (``+hvp=on``), the section made from the library's
:class:`~hvp_lightning.settings.HVP` (:func:`.core.section_of`)."""

from __future__ import annotations

from ..settings.hvp import GLOBAL_PAIRS, HVP, HVP_COLOURS, HVP_OFF, LOSS_MODES, MODES, PRECISIONS, selection_side
from .core import section_of

# A run's hvp.max_combinations defaults to its method's hvp_max_combinations (DINO's preset: the
# paper's 128; none for the others): the Hydra node writes that interpolation in place of auto.
HVPSection = section_of(HVP, node_values=(("max_combinations", "${oc.select:method.hvp_max_combinations,null}"),))

__all__ = [
    "GLOBAL_PAIRS",
    "HVP",
    "HVPSection",
    "HVP_COLOURS",
    "HVP_OFF",
    "LOSS_MODES",
    "MODES",
    "PRECISIONS",
    "selection_side",
]
