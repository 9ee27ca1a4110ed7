"""MoCo v3's settings (Chen, Xie and He, 2021): the keys of :class:`~hvp_lightning.methods.mocov3.MoCoV3`,
their defaults the paper's ResNet-50 recipe."""

from __future__ import annotations

from typing import ClassVar

from .declare import declared, setting
from .method import LinearRecipe, MomentumPairSettings
from .optim import Optimizer


@declared
class MoCoV3Settings(MomentumPairSettings):
    """MoCo v3 (Chen, Xie and He, 2021)."""

    name: ClassVar[str] = "mocov3"
    # main_lincls.py (ResNet-50): SGD lr 0.1 x batch / 256, batch 1024, 90 epochs, no weight decay
    linear_recipe: ClassVar[LinearRecipe] = LinearRecipe(optimizer="sgd", base_lr=0.1, batch_size=1024, epochs=90)

    proj_hidden_dim: int = setting(4096, "projector hidden width", ge=1)
    proj_dim: int = setting(256, "projector output width", ge=1)
    proj_last_bn: bool = setting(True, "the projector ends in BatchNorm")
    base_momentum: float = setting(0.99, "target EMA momentum at the start, cosine to 1 over training", ge=0, le=1)
    temperature: float = setting(1.0, "InfoNCE temperature", gt=0)
    optimizer: Optimizer = setting(
        Optimizer(name="lars", base_lr=0.6, weight_decay=1e-6, warmup_epochs=10, final_lr_ratio=0.0),
        "the optimiser and its warm-up + cosine schedule (LARS, lr 0.6 x batch / 256)",
    )
