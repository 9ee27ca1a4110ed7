"""Per-sample losses and candidate tables, one file per method; pure functions of torch tensors.

Each method's loss per sample (``[B]``, whose batch mean is the official loss) and the table of
that loss over every candidate pair or combination, which :mod:`hvp_lightning.selection`
searches and :mod:`hvp_lightning.methods` trains with. A file here imports torch and, at most,
a sibling (:mod:`.pairs` for the pair order, :mod:`.precision` for fp32 tables): nothing from
Lightning, Hydra or the rest of the package, so the formulas can be read and tested alone.
"""

from .byol import byol_loss, byol_pair_table
from .dino import combination_loss, dino_ce_table, dino_cross_entropy, dino_loss, student_log_probs, teacher_probs
from .ibot import ibot_loss, ibot_loss_terms, ibot_pair_table, ibot_patch_loss
from .mocov3 import mocov3_loss, mocov3_pair_table
from .pairs import pair_index
from .precision import exact_fp32
from .simclr import gather_with_grad, nt_xent_loss, simclr_pair_table
from .simsiam import simsiam_loss, simsiam_pair_table

__all__ = [
    "byol_loss", "byol_pair_table", "combination_loss", "dino_ce_table", "dino_cross_entropy", "dino_loss",
    "exact_fp32", "gather_with_grad", "ibot_loss", "ibot_loss_terms", "ibot_pair_table", "ibot_patch_loss",
    "mocov3_loss", "mocov3_pair_table", "nt_xent_loss", "pair_index", "simclr_pair_table", "simsiam_loss",
    "simsiam_pair_table", "student_log_probs", "teacher_probs",
]
