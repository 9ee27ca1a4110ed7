"""BYOL's settings (Grill et al., 2020): the keys of :class:`~hvp_lightning.methods.byol.BYOL`, their
defaults the paper's ImageNet recipe."""

from __future__ import annotations

from typing import ClassVar

from .declare import declared, setting
from .method import LinearRecipe, MomentumPairSettings
from .optim import Optimizer


@declared
class BYOLSettings(MomentumPairSettings):
    """BYOL (Grill et al., 2020)."""

    name: ClassVar[str] = "byol"
    # appendix C.1: SGD (momentum 0.9), batch 1024, 80 epochs, no weight decay; the paper swept the lr,
    # MoCo v3's 0.1 x batch / 256 stands in
    linear_recipe: ClassVar[LinearRecipe] = LinearRecipe(optimizer="sgd", base_lr=0.1, batch_size=1024, epochs=80)

    proj_hidden_dim: int = setting(4096, "projector hidden width", ge=1)
    proj_dim: int = setting(256, "projector output width", ge=1)
    optimizer: Optimizer = setting(
        Optimizer(name="lars", base_lr=0.2, weight_decay=1.5e-6, warmup_epochs=10, final_lr_ratio=0.0),
        "the optimiser and its warm-up + cosine schedule (LARS, lr 0.2 x batch / 256)",
    )
