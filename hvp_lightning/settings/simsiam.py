"""SimSiam's settings (Chen and He, 2021): the keys of :class:`~hvp_lightning.methods.simsiam.SimSiam`,
their defaults the paper's ImageNet recipe."""

from __future__ import annotations

from typing import ClassVar

from .declare import declared, setting
from .method import LinearRecipe, PairHeadSettings
from .optim import Optimizer


@declared
class SimSiamSettings(PairHeadSettings):
    """SimSiam (Chen and He, 2021)."""

    name: ClassVar[str] = "simsiam"
    # the paper's linear evaluation (appendix): LARS, lr 0.1, batch 4096, 90 epochs, no weight decay
    linear_recipe: ClassVar[LinearRecipe] = LinearRecipe(optimizer="lars", base_lr=0.1, batch_size=4096, epochs=90)

    proj_hidden_dim: int = setting(2048, "projector hidden width", ge=1)
    proj_dim: int = setting(2048, "projector output width", ge=1)
    proj_layers: int = setting(3, "projector linear layers", ge=1)
    pred_hidden_dim: int = setting(512, "predictor bottleneck width", ge=1)
    fix_pred_lr: bool = setting(
        True, "the predictor keeps the peak learning rate (no schedule), as SimSiam's ImageNet recipe"
    )
    optimizer: Optimizer = setting(
        Optimizer(name="sgd", base_lr=0.05, weight_decay=1e-4, warmup_epochs=0, final_lr_ratio=0.0),
        "the optimiser and its warm-up + cosine schedule",
    )
