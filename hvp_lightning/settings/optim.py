"""A method's optimiser settings (:class:`Optimizer`; the optimisers themselves: :mod:`hvp_lightning.nn.optim`)."""

from __future__ import annotations

from typing import Literal

from .declare import SettingError, Settings, declared, setting

OPTIMIZERS = ("sgd", "adamw", "lars")


@declared
class Optimizer(Settings):
    """A method's optimiser and its warm-up + cosine schedule:
    ``Optimizer(name="lars", base_lr=0.3, weight_decay=1e-4, warmup_epochs=10, final_lr_ratio=0.0)``."""

    name: Literal[OPTIMIZERS] = setting(
        doc="sgd, adamw or lars (LARS skips biases and norm parameters for decay and the trust ratio)"
    )
    base_lr: float = setting(doc="peak learning rate per 256 images: lr = base_lr x global batch / 256", gt=0)
    weight_decay: float = setting(doc="weight decay (biases and norm parameters: none)", ge=0)
    warmup_epochs: float = setting(doc="linear warm-up epochs (fractions allowed), then cosine decay", ge=0)
    momentum: float = setting(0.9, "SGD's and LARS's momentum", ge=0, lt=1)
    eta: float = setting(0.001, "LARS trust coefficient", gt=0)
    min_lr: float | None = setting(
        None, "where the cosine ends, absolute (DINO/iBOT: 1e-6); set this or final_lr_ratio", ge=0
    )
    final_lr_ratio: float | None = setting(
        None, "where the cosine ends, as a share of the peak lr; set this or min_lr", ge=0, le=1
    )

    def rules(self) -> None:
        if (self.min_lr is None) == (self.final_lr_ratio is None):
            raise SettingError(
                "min_lr",
                self.min_lr,
                "set exactly one of {min_lr} (absolute end lr) and {final_lr_ratio} (end lr / peak lr)",
            )


@declared
class CosineDecayOptimizer(Optimizer):
    """DINO's and iBOT's optimiser: the weight decay follows its own cosine."""

    weight_decay_end: float = setting(doc="weight decay at the end of the cosine weight-decay schedule", ge=0)


@declared
class BarlowTwinsOptimizer(Optimizer):
    """Barlow Twins' optimiser: biases and BN parameters at their own learning rate."""

    base_lr_biases: float = setting(
        doc="learning rate of biases and BN parameters per 256 images (same scaling and schedule)", gt=0
    )
