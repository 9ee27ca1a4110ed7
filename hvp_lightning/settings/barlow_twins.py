"""Barlow Twins' settings (Zbontar et al., 2021): the keys of
:class:`~hvp_lightning.methods.barlow_twins.BarlowTwins`, their defaults the paper's ImageNet recipe."""

from __future__ import annotations

from typing import ClassVar

from .declare import declared, setting
from .method import LinearRecipe, PairHeadSettings
from .optim import BarlowTwinsOptimizer


@declared
class BarlowTwinsSettings(PairHeadSettings):
    """Barlow Twins (Zbontar et al., 2021)."""

    name: ClassVar[str] = "barlow_twins"
    # the official evaluate.py: SGD, batch 256, 100 epochs, weight decay 1e-6, lr 0.3 (README's --lr-classifier)
    linear_recipe: ClassVar[LinearRecipe] = LinearRecipe(
        optimizer="sgd", base_lr=0.3, batch_size=256, epochs=100, weight_decay=1e-6
    )

    proj_hidden_dim: int = setting(8192, "projector hidden width", ge=1)
    proj_dim: int = setting(8192, "projector output width", ge=1)
    proj_layers: int = setting(3, "projector linear layers", ge=1)
    lambd: float = setting(0.0051, "weight of the off-diagonal (redundancy) term", ge=0)
    optimizer: BarlowTwinsOptimizer = setting(
        BarlowTwinsOptimizer(
            name="lars", base_lr=0.2, base_lr_biases=0.0048, weight_decay=1.5e-6, warmup_epochs=10, final_lr_ratio=0.001
        ),
        "the optimiser and its warm-up + cosine schedule (LARS; biases and BN parameters at base_lr_biases)",
    )
