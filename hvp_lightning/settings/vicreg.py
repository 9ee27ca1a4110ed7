"""VICReg's settings (Bardes, Ponce and LeCun, 2022): the keys of
:class:`~hvp_lightning.methods.vicreg.VICReg`, their defaults the paper's ImageNet recipe."""

from __future__ import annotations

from typing import ClassVar

from .declare import declared, setting
from .method import LinearRecipe, PairHeadSettings
from .optim import Optimizer


@declared
class VICRegSettings(PairHeadSettings):
    """VICReg (Bardes, Ponce and LeCun, 2022)."""

    name: ClassVar[str] = "vicreg"
    # the official evaluate.py: SGD, batch 256, 100 epochs, weight decay 1e-6, lr 0.02 (README's --lr-head)
    linear_recipe: ClassVar[LinearRecipe] = LinearRecipe(
        optimizer="sgd", base_lr=0.02, batch_size=256, epochs=100, weight_decay=1e-6
    )

    proj_hidden_dim: int = setting(8192, "projector hidden width", ge=1)
    proj_dim: int = setting(8192, "projector output width", ge=1)
    proj_layers: int = setting(3, "projector linear layers", ge=1)
    sim_coeff: float = setting(25.0, "lambda: weight of the invariance (MSE) term", ge=0)
    std_coeff: float = setting(25.0, "mu: weight of the variance hinge on the std (gamma 1, eps 1e-4)", ge=0)
    cov_coeff: float = setting(1.0, "nu: weight of the off-diagonal covariance squared / D", ge=0)
    optimizer: Optimizer = setting(
        Optimizer(name="lars", base_lr=0.2, weight_decay=1e-6, warmup_epochs=10, final_lr_ratio=0.001),
        "the optimiser and its warm-up + cosine schedule (LARS, lr 0.2 x batch / 256, ending at 0.001 of it)",
    )
