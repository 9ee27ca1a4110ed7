"""SimCLR's settings (Chen et al., 2020): the keys of :class:`~hvp_lightning.methods.simclr.SimCLR`,
their defaults the HVP paper's ImageNet recipe (appendix table "SimCLR")."""

from __future__ import annotations

from typing import ClassVar

from .declare import declared, setting
from .method import LinearRecipe, PairHeadSettings
from .optim import Optimizer


@declared
class SimCLRSettings(PairHeadSettings):
    """SimCLR (Chen et al., 2020)."""

    name: ClassVar[str] = "simclr"
    # the paper's linear evaluation: SGD, lr 0.1, batch 4096, 90 epochs
    linear_recipe: ClassVar[LinearRecipe] = LinearRecipe(optimizer="sgd", base_lr=0.1, batch_size=4096, epochs=90)
    eval_interpolation: ClassVar[str] = "bicubic"  # the HVP code's simclr transfer transforms

    temperature: float = setting(0.1, "NT-Xent temperature", gt=0)  # not in the paper's table: SimCLR's ImageNet value
    optimizer: Optimizer = setting(
        Optimizer(name="lars", base_lr=0.3, weight_decay=1e-4, warmup_epochs=10, final_lr_ratio=0.0),
        "the optimiser and its warm-up + cosine schedule (LARS, lr 0.3 x batch / 256)",
    )
