"""What every method's settings share (:class:`MethodSettings`), the views a method asks its
loader for (:class:`ViewSpec`), and its evaluation recipes (:class:`LinearRecipe`).

A method's settings class (``hvp_lightning/settings/<method>.py``) is the one declaration of its
keys: the method's constructor takes them (``SimCLR(backbone, temperature=0.2)``), the ``method``
config group is derived from them, and its class attributes say what the rest of the project needs
to know of the method: its ``name``, whether it is ``multi_crop``, its official linear-probe recipe
and which of the paper's fine-tuning tables it uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from .declare import SettingError, Settings, declared, setting
from .hvp import HVP
from .optim import OPTIMIZERS, Optimizer


@dataclasses.dataclass(frozen=True)
class ViewSpec:
    """One view per image that a method asks its loader for: the data's augmentation (its crop
    size, crop scale, blur, solarize and jitter saturation) with the changes set here (None: the
    data's). Pair methods ask for N plain views; DINO for its asymmetric global pipelines and
    smaller local crops.

    Args:
        size: The crop's side in px (None: the data's crop size).
        scale: The random-resized-crop's area range (None: the data's).
        blur_p: The blur's probability (None: the data's).
        solarize_p: The solarize probability (None: the data's).
        saturation: The colour jitter's saturation strength (None: the data's).
    """

    size: int | None = None
    scale: tuple[float, float] | None = None
    blur_p: float | None = None
    solarize_p: float | None = None
    saturation: float | None = None


@declared
class LinearRecipe(Settings):
    """A method's official linear-evaluation recipe (``protocol=linear`` takes it for the method's checkpoints)."""

    optimizer: Literal[OPTIMIZERS] = setting(doc="the head's optimiser")
    base_lr: float = setting(doc="lr = base_lr * batch_size / lr_ref_batch", gt=0)
    batch_size: int = setting(doc="the head's batch", ge=1)
    epochs: int = setting(doc="training epochs of the head", ge=1)
    weight_decay: float = setting(0.0, "the head's weight decay", ge=0)
    momentum: float = setting(0.9, "SGD's and LARS's momentum", ge=0, lt=1)
    n_last_blocks: int = setting(1, "ViTs: the head sees the CLS tokens of the last n blocks, concatenated", ge=1)
    avgpool_patchtokens: bool = setting(False, "ViTs: also the mean patch token of the last block")


@declared
class MethodSettings(Settings):
    """What every method has: its batch, its optimiser, whether its backbones are compiled.

    Class attributes of a method's settings: ``name`` (``method=...``: its presets' ``method.name``),
    ``multi_crop`` (DINO's global and local candidates), ``linear_recipe`` (its official linear
    evaluation), ``finetune_table`` (which of the paper's fine-tuning tables, ``dino`` or ``simsiam``)
    and ``eval_interpolation`` (the resize of its official evaluation code)."""

    name: ClassVar[str]
    multi_crop: ClassVar[bool] = False
    linear_recipe: ClassVar[LinearRecipe]
    finetune_table: ClassVar[str] = "simsiam"
    eval_interpolation: ClassVar[str] = "bilinear"

    batch_size: int | None = setting(
        None,
        "images per device per step (BatchNorm heads need >= 2); the lr scales with the global batch (x devices x "
        "accumulation); null: the training loader's batch",
        ge=2,
    )
    compile: bool = setting(
        False, "torch.compile the backbone(s) in place (first steps compile: tens of seconds; CPU needs a C++ compiler)"
    )
    optimizer: Optimizer = setting(doc="the optimiser and its warm-up + cosine schedule")

    # --- what the method asks of its loader and of HVP ------------------------------------------------
    def views(self, hvp: HVP) -> tuple[ViewSpec, ...]:
        """The views per image the loader makes, in order: 2 without HVP, ``hvp.num_views`` candidates with it."""
        return (ViewSpec(),) * hvp.views_per_image

    def resolve_hvp(self, hvp: HVP) -> HVP:
        """``hvp`` as this method runs it (``max_combinations: auto`` resolved), or a
        :class:`SettingError` (key ``hvp.<key>``) for a key this method would not read."""
        try:
            self.check_hvp(hvp)
        except SettingError as err:
            raise err.at("hvp.") from None
        return hvp.replace(max_combinations=None) if hvp.max_combinations == "auto" else hvp

    def check_hvp(self, hvp: HVP) -> None:
        """HVP keys only some methods read: a method that would ignore one refuses it."""
        if not hvp.enabled:
            return
        if hvp.max_combinations not in ("auto", None):
            raise SettingError(
                "max_combinations",
                hvp.max_combinations,
                f"only with method dino (it samples (global pair, locals) combinations); {self.name} scores every "
                "candidate combination",
            )
        if not self.multi_crop:
            for key in ("global_pairs", "num_global_candidates", "num_local_candidates"):
                default = next(f.default for f in dataclasses.fields(HVP) if f.name == key)
                if getattr(hvp, key) != default:
                    raise SettingError(
                        key,
                        getattr(hvp, key),
                        f"{'null' if default is None else default} for method {self.name}: only DINO and iBOT have "
                        "global and local candidates",
                    )


@declared
class PairHeadSettings(MethodSettings):
    """Two-view methods' projection head."""

    proj_hidden_dim: int = setting(2048, "projector hidden width", ge=1)
    proj_dim: int = setting(128, "projector output width", ge=1)
    proj_layers: int = setting(2, "projector linear layers", ge=1)


@declared
class MomentumPairSettings(PairHeadSettings):
    """BYOL's and MoCo v3's online predictor and EMA target."""

    proj_last_bn: bool = setting(False, "the projector ends in BatchNorm")
    pred_hidden_dim: int = setting(4096, "predictor hidden width", ge=1)
    pred_layers: int = setting(2, "predictor linear layers", ge=1)
    pred_last_bn: bool = setting(False, "the predictor ends in BatchNorm (without affine)")
    base_momentum: float = setting(0.996, "target EMA momentum at the start, cosine to 1 over training", ge=0, le=1)


def method_hparams(settings: MethodSettings, hvp: HVP) -> dict[str, Any]:
    """A method's constructor arguments as plain values (``save_hyperparameters``)."""
    return {"settings": settings.to_dict(), "hvp": hvp.to_dict()}
