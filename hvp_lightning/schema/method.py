"""``method``: one schema per SSL method, told apart by ``method.name``. A method's presets
(conf/method/<preset>.yaml) set the values of its keys; a key without a default here is one every
preset of the method sets (its value is the recipe's, with the preset's source)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from .base import (
    COUNT,
    COUNT_OR_ZERO,
    MOMENTUM,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    UNIT_RANGE,
    Section,
    integer,
    number,
    numbers,
)

OPTIMIZERS = ("sgd", "adamw", "lars")
# one norm over all parameters (the HVP code's DINO, clip_grad_norm_) | each parameter on its own
# (upstream DINO's and iBOT's utils.clip_gradients)
CLIP_GRAD_KINDS = ("global", "per_parameter")


class Optimizer(Section):
    """``method.optimizer``: the optimiser and its warm-up + cosine schedule."""

    name: Literal[OPTIMIZERS]
    """sgd, adamw or lars (LARS skips biases and norm parameters for decay and the trust ratio)"""
    base_lr: POSITIVE
    """peak learning rate per 256 images: lr = base_lr x global batch / 256"""
    weight_decay: NON_NEGATIVE
    """weight decay (biases and norm parameters: none)"""
    warmup_epochs: NON_NEGATIVE
    """linear warm-up epochs (fractions allowed), then cosine decay"""
    momentum: number(0, 1, open_high=True) = 0.9
    """SGD's and LARS's momentum"""
    eta: POSITIVE = 0.001
    """LARS trust coefficient"""
    min_lr: NON_NEGATIVE | None = None
    """where the cosine ends, absolute (DINO/iBOT: 1e-6); set this or final_lr_ratio"""
    final_lr_ratio: number(0, 1) | None = None
    """where the cosine ends, as a share of the peak lr; set this or min_lr"""


class CosineDecayOptimizer(Optimizer):
    """DINO's and iBOT's optimiser: the weight decay follows its own cosine."""

    weight_decay_end: NON_NEGATIVE
    """weight decay at the end of the cosine weight-decay schedule"""


class BarlowTwinsOptimizer(Optimizer):
    """Barlow Twins' optimiser: biases and BN parameters at their own learning rate."""

    base_lr_biases: POSITIVE
    """learning rate of biases and BN parameters per 256 images (same scaling and schedule)"""


class MethodBase(Section):
    """What every method has: its name, batch and optimiser."""

    batch_size: integer(2)
    """images per device per step (BatchNorm heads need >= 2); the lr scales with the global batch (x devices x accumulation)"""
    compile: bool = False
    """torch.compile the backbone(s) in place (first steps compile: tens of seconds; CPU needs a C++ compiler)"""
    optimizer: Optimizer


class PairHead(MethodBase):
    """Two-view methods' projection head."""

    proj_hidden_dim: COUNT
    """projector hidden width"""
    proj_dim: COUNT
    """projector output width"""
    proj_layers: COUNT
    """projector linear layers"""


class SimSiamSettings(PairHead):
    """SimSiam (Chen and He, 2021)."""

    name: Literal["simsiam"] = "simsiam"
    pred_hidden_dim: COUNT
    """predictor bottleneck width"""
    fix_pred_lr: bool
    """the predictor keeps the peak learning rate (no schedule), as SimSiam's ImageNet recipe"""


class SimCLRSettings(PairHead):
    """SimCLR (Chen et al., 2020)."""

    name: Literal["simclr"] = "simclr"
    temperature: POSITIVE
    """NT-Xent temperature"""


class MomentumPairHead(PairHead):
    """BYOL's and MoCo v3's online predictor and EMA target."""

    proj_last_bn: bool
    """the projector ends in BatchNorm"""
    pred_hidden_dim: COUNT
    """predictor hidden width"""
    pred_layers: COUNT
    """predictor linear layers"""
    pred_last_bn: bool
    """the predictor ends in BatchNorm (without affine)"""
    base_momentum: MOMENTUM
    """target EMA momentum at the start, cosine to 1 over training"""


class BYOLSettings(MomentumPairHead):
    """BYOL (Grill et al., 2020)."""

    name: Literal["byol"] = "byol"


class MoCoV3Settings(MomentumPairHead):
    """MoCo v3 (Chen, Xie and He, 2021)."""

    name: Literal["mocov3"] = "mocov3"
    temperature: POSITIVE
    """InfoNCE temperature"""


class VICRegSettings(PairHead):
    """VICReg (Bardes, Ponce and LeCun, 2022)."""

    name: Literal["vicreg"] = "vicreg"
    sim_coeff: NON_NEGATIVE
    """lambda: weight of the invariance (MSE) term"""
    std_coeff: NON_NEGATIVE
    """mu: weight of the variance hinge on the std (gamma 1, eps 1e-4)"""
    cov_coeff: NON_NEGATIVE
    """nu: weight of the off-diagonal covariance squared / D"""


class BarlowTwinsSettings(PairHead):
    """Barlow Twins (Zbontar et al., 2021)."""

    name: Literal["barlow_twins"] = "barlow_twins"
    lambd: NON_NEGATIVE
    """weight of the off-diagonal (redundancy) term"""
    optimizer: BarlowTwinsOptimizer


class TeacherStudent(MethodBase):
    """DINO's and iBOT's EMA teacher, head, centring and multi-crop views."""

    # head
    out_dim: COUNT
    """head output width (prototypes)"""
    head_hidden_dim: COUNT
    """head MLP hidden width"""
    bottleneck_dim: COUNT
    """head bottleneck width"""
    head_layers: COUNT
    """head MLP layers"""
    use_bn_in_head: bool
    """BatchNorm in the head MLP"""
    norm_last_layer: bool
    """weight-normalised output layer with its norm fixed to 1"""
    # teacher, centre, temperatures
    momentum_teacher: MOMENTUM
    """teacher EMA momentum at the start, cosine to 1 over training"""
    teacher_temp: POSITIVE
    """teacher temperature after its warm-up"""
    warmup_teacher_temp: POSITIVE
    """teacher temperature at the start of its warm-up"""
    warmup_teacher_temp_epochs: COUNT_OR_ZERO
    """epochs of the teacher temperature's linear warm-up"""
    student_temp: POSITIVE
    """student temperature"""
    center_momentum: MOMENTUM
    """EMA momentum of the teacher-output centre"""
    teacher_reuse: bool
    """HVP: the step takes the teacher's outputs for the chosen globals from the selection pass (exact without BatchNorm)"""
    freeze_last_layer: COUNT_OR_ZERO
    """epochs with the head's output layer frozen"""
    clip_grad: NON_NEGATIVE | None
    """gradient-norm clipping threshold; 0 or null: off"""
    clip_grad_kind: Literal[CLIP_GRAD_KINDS]
    """global: one norm over all parameters (the HVP code's DINO); per_parameter: each parameter on its own (upstream DINO, iBOT)"""
    # multi-crop (globals use data.crop_size; flip/jitter/grayscale/normalisation from data)
    num_local_crops: COUNT_OR_ZERO
    """local crops per image (L)"""
    local_crop_size: COUNT
    """local crops' side in px (a multiple of a ViT's patch size)"""
    global_scale: UNIT_RANGE
    """global crops' area range"""
    local_scale: UNIT_RANGE
    """local crops' area range"""
    global_blur_p: numbers(2, 0, 1)
    """blur probability of global pipelines 1 and 2"""
    global_solarize_p: numbers(2, 0, 1)
    """solarize probability of global pipelines 1 and 2"""
    local_blur_p: PROBABILITY
    """local crops' blur probability"""
    jitter_saturation: NON_NEGATIVE
    """colour jitter's saturation strength (brightness and contrast come from data.aug)"""
    optimizer: CosineDecayOptimizer


class DinoSettings(TeacherStudent):
    """DINO (Caron et al., 2021)."""

    name: Literal["dino"] = "dino"
    hvp_max_combinations: integer(1) | None = None
    """with +hvp=on, hvp.max_combinations' default: K random (global pair, locals) combinations scored (the paper's 128); null: the exact maximum"""


class IBOTSettings(TeacherStudent):
    """iBOT (Zhou et al., 2022): DINO's [CLS] loss plus masked-patch prediction."""

    name: Literal["ibot"] = "ibot"
    patch_out_dim: COUNT
    """patch logits width when shared_head is false (shared: out_dim)"""
    shared_head: bool
    """the patch tokens share the [CLS] head's output layer"""
    lambda1: NON_NEGATIVE
    """weight of the [CLS] (DINO) term"""
    lambda2: NON_NEGATIVE
    """weight of the masked-patch term"""
    teacher_patch_temp: POSITIVE
    """teacher patch temperature after its warm-up"""
    warmup_teacher_patch_temp: POSITIVE
    """teacher patch temperature at the start of its warm-up (warmup_teacher_temp_epochs)"""
    center_momentum2: MOMENTUM
    """EMA momentum of the patch-token centre"""
    mask_prob: PROBABILITY
    """share of global crops that are masked at all"""
    mask_ratio: numbers(2, 0, 1, ordered=True)
    """masked share of a masked crop's patches, uniform in [min, max]"""
    mask_min_aspect: number(0, 1, open_low=True)
    """masking blocks' aspect ratio, log-uniform in [mask_min_aspect, 1/mask_min_aspect]"""


METHOD_SCHEMAS = (
    SimSiamSettings,
    SimCLRSettings,
    DinoSettings,
    IBOTSettings,
    BYOLSettings,
    MoCoV3Settings,
    VICRegSettings,
    BarlowTwinsSettings,
)
METHOD_NAMES = tuple(m.model_fields["name"].default for m in METHOD_SCHEMAS)
MULTI_CROP = ("dino", "ibot")
MethodSettings = Annotated[
    SimSiamSettings
    | SimCLRSettings
    | DinoSettings
    | IBOTSettings
    | BYOLSettings
    | MoCoV3Settings
    | VICRegSettings
    | BarlowTwinsSettings,
    Field(discriminator="name"),
]
