"""Per-sample losses and candidate tables, one file per method; pure functions of torch tensors."""

from .barlow_twins import (all_reduce_with_grad, barlow_twins_loss, barlow_twins_loss_terms, barlow_twins_pair_table,
                           standardise)
from .swap import RowSwap, row_swap
from .vicreg import vicreg_loss, vicreg_loss_terms, vicreg_pair_table
