"""Per-sample losses and candidate tables, one file per method; pure functions of torch tensors.

Each method's loss per sample (``[B]``, whose batch mean is the official loss) and the table of
that loss over every candidate pair or combination, which :mod:`hvp_lightning.selection`
searches and :mod:`hvp_lightning.methods` trains with. A file here imports torch and, at most,
a sibling (:mod:`.pairs` for the pair order, :mod:`.precision` for fp32 tables): nothing from
Lightning, Hydra or the rest of the package, so the formulas can be read and tested alone.

VICReg and Barlow Twins have no per-sample loss (theirs are functions of the whole batch): their
tables hold the leave-one-out increase of the batch loss (docs/DESIGN.md, section 3), computed by
rank-one updates of the batch statistics (:mod:`.swap`).
"""

from .barlow_twins import (
    all_reduce_with_grad,
    barlow_twins_loss,
    barlow_twins_loss_terms,
    barlow_twins_pair_table,
    standardise,
)
from .byol import byol_loss, byol_pair_table
from .dino import combination_loss, dino_ce_table, dino_cross_entropy, dino_loss, student_log_probs, teacher_probs
from .ibot import ibot_loss, ibot_loss_terms, ibot_pair_table, ibot_patch_loss
from .mocov3 import mocov3_loss, mocov3_pair_table
from .pairs import pair_index
from .precision import exact_fp32
from .simclr import gather_with_grad, nt_xent_loss, simclr_pair_table
from .simsiam import simsiam_loss, simsiam_pair_table
from .swap import RowSwap, row_swap
from .vicreg import vicreg_loss, vicreg_loss_terms, vicreg_pair_table

__all__ = [
    "RowSwap",
    "all_reduce_with_grad",
    "barlow_twins_loss",
    "barlow_twins_loss_terms",
    "barlow_twins_pair_table",
    "byol_loss",
    "byol_pair_table",
    "combination_loss",
    "dino_ce_table",
    "dino_cross_entropy",
    "dino_loss",
    "exact_fp32",
    "gather_with_grad",
    "ibot_loss",
    "ibot_loss_terms",
    "ibot_pair_table",
    "ibot_patch_loss",
    "mocov3_loss",
    "mocov3_pair_table",
    "nt_xent_loss",
    "pair_index",
    "simclr_pair_table",
    "simsiam_loss",
    "row_swap",
    "simsiam_pair_table",
    "standardise",
    "student_log_probs",
    "teacher_probs",
    "vicreg_loss",
    "vicreg_loss_terms",
    "vicreg_pair_table",
]
