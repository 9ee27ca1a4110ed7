"""DINO's settings (Caron et al., 2021): the keys of :class:`~hvp_lightning.methods.dino.DINO`, their
defaults the official ViT-S/16 recipe (= the HVP paper's appendix table), and the teacher-student
keys iBOT shares (:class:`TeacherStudentSettings`)."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from .declare import SettingError, declared, setting
from .hvp import HVP
from .method import LinearRecipe, MethodSettings, ViewSpec
from .optim import CosineDecayOptimizer

# one norm over all parameters (the HVP code's DINO, clip_grad_norm_) | each parameter on its own
# (upstream DINO's and iBOT's utils.clip_gradients)
CLIP_GRAD_KINDS = ("global", "per_parameter")


@declared
class TeacherStudentSettings(MethodSettings):
    """DINO's and iBOT's EMA teacher, head, centring and multi-crop views."""

    multi_crop: ClassVar[bool] = True
    finetune_table: ClassVar[str] = "dino"
    eval_interpolation: ClassVar[str] = "bicubic"  # the HVP code's dino transfer transforms
    # the paper's linear evaluation: SGD, lr 0.00075, batch 1024, 100 epochs, the CLS tokens of the last 4 blocks
    linear_recipe: ClassVar[LinearRecipe] = LinearRecipe(
        optimizer="sgd", base_lr=0.00075, batch_size=1024, epochs=100, n_last_blocks=4
    )

    # head
    out_dim: int = setting(65536, "head output width (prototypes)", ge=1)
    head_hidden_dim: int = setting(2048, "head MLP hidden width", ge=1)
    bottleneck_dim: int = setting(256, "head bottleneck width", ge=1)
    head_layers: int = setting(3, "head MLP layers", ge=1)
    use_bn_in_head: bool = setting(False, "BatchNorm in the head MLP")
    norm_last_layer: bool = setting(True, "weight-normalised output layer with its norm fixed to 1")
    # teacher, centre, temperatures
    momentum_teacher: float = setting(0.996, "teacher EMA momentum at the start, cosine to 1 over training", ge=0, le=1)
    teacher_temp: float = setting(0.04, "teacher temperature after its warm-up", gt=0)
    warmup_teacher_temp: float = setting(0.04, "teacher temperature at the start of its warm-up", gt=0)
    warmup_teacher_temp_epochs: int = setting(0, "epochs of the teacher temperature's linear warm-up", ge=0)
    student_temp: float = setting(0.1, "student temperature", gt=0)
    center_momentum: float = setting(0.9, "EMA momentum of the teacher-output centre", ge=0, le=1)
    teacher_reuse: bool = setting(
        True,
        "HVP: the step takes the teacher's outputs for the chosen globals from the selection pass (exact without "
        "BatchNorm)",
    )
    freeze_last_layer: int = setting(1, "epochs with the head's output layer frozen", ge=0)
    clip_grad: float | None = setting(3.0, "gradient-norm clipping threshold; 0 or null: off", ge=0)
    clip_grad_kind: Literal[CLIP_GRAD_KINDS] = setting(
        "global",
        "global: one norm over all parameters (the HVP code's DINO); per_parameter: each parameter on its own "
        "(upstream DINO, iBOT)",
    )
    # multi-crop (globals use the data's crop size; flip/jitter/grayscale/normalisation from the data)
    num_local_crops: int = setting(8, "local crops per image (L)", ge=0)
    local_crop_size: int = setting(96, "local crops' side in px (a multiple of a ViT's patch size)", ge=1)
    global_scale: tuple[float, float] = setting((0.4, 1.0), "global crops' area range", gt=0, le=1, ordered=True)
    local_scale: tuple[float, float] = setting((0.05, 0.4), "local crops' area range", gt=0, le=1, ordered=True)
    global_blur_p: tuple[float, float] = setting((1.0, 0.1), "blur probability of global pipelines 1 and 2", ge=0, le=1)
    global_solarize_p: tuple[float, float] = setting(
        (0.0, 0.2), "solarize probability of global pipelines 1 and 2", ge=0, le=1
    )
    local_blur_p: float = setting(0.5, "local crops' blur probability", ge=0, le=1)
    jitter_saturation: float = setting(
        0.2, "colour jitter's saturation strength (brightness and contrast come from the data's augmentation)", ge=0
    )
    optimizer: CosineDecayOptimizer = setting(
        CosineDecayOptimizer(
            name="adamw", base_lr=0.0005, weight_decay=0.04, weight_decay_end=0.4, warmup_epochs=10, min_lr=1e-6
        ),
        "the optimiser and its warm-up + cosine schedule (AdamW; the weight decay follows its own cosine)",
    )

    # --- views ------------------------------------------------------------------------------------
    def candidate_counts(self, hvp: HVP) -> tuple[int, int]:
        """(G global, Lc local) views the loader makes per image. HVP off: (2, L). HVP on:
        ``hvp.num_global_candidates`` (default ``hvp.num_views``) and ``hvp.num_local_candidates``
        (default ``ceil(L * num_views / 2)``): each of DINO's crops drawn ``num_views / 2`` times, as
        in the paper's 4 + 16 setting."""
        if not hvp.enabled:
            return 2, self.num_local_crops
        lc = hvp.num_local_candidates
        locals_ = math.ceil(self.num_local_crops * hvp.num_views / 2) if lc is None else lc
        return hvp.num_global_candidates or hvp.num_views, int(locals_)

    def views(self, hvp: HVP) -> tuple[ViewSpec, ...]:
        """DINO's multi-crop: two asymmetric global pipelines (1: blur p=1; 2: blur p=0.1, solarize
        p=0.2) at the data's crop size and ``global_scale``, then the locals (blur p=0.5) at
        ``local_crop_size`` and ``local_scale``; jitter saturation ``jitter_saturation``. With HVP,
        global candidates alternate the two pipelines."""
        g, lc = self.candidate_counts(hvp)
        glob = [
            ViewSpec(
                scale=self.global_scale,
                blur_p=self.global_blur_p[i],
                solarize_p=self.global_solarize_p[i],
                saturation=self.jitter_saturation,
            )
            for i in range(2)
        ]
        loc = ViewSpec(
            size=self.local_crop_size,
            scale=self.local_scale,
            blur_p=self.local_blur_p,
            solarize_p=0.0,
            saturation=self.jitter_saturation,
        )
        return tuple(glob[i % 2] for i in range(g)) + (loc,) * lc

    def check_hvp(self, hvp: HVP) -> None:
        super().check_hvp(hvp)
        if not hvp.enabled:
            return
        if hvp.colour == "static":
            raise SettingError(
                "colour",
                hvp.colour,
                f"per_view for method {self.name} (static colour shares one colour draw between the candidates of a "
                "pair method; DINO/iBOT's global pipelines differ in blur and solarize)",
            )
        lc = hvp.num_local_candidates
        if lc is not None and lc < self.num_local_crops:
            raise SettingError(
                "num_local_candidates", lc, f"an integer >= method.num_local_crops={self.num_local_crops}"
            )


@declared
class DINOSettings(TeacherStudentSettings):
    """DINO (Caron et al., 2021)."""

    name: ClassVar[str] = "dino"

    hvp_max_combinations: int | None = setting(
        128,
        "with HVP, hvp.max_combinations' default (auto): K random (global pair, locals) combinations scored (the "
        "paper's 128); null: the exact maximum",
        ge=1,
    )

    def check_hvp(self, hvp: HVP) -> None:
        if hvp.max_combinations in ("auto", None) or not hvp.enabled:
            super().check_hvp(hvp)
        else:  # DINO samples combinations: the base rule's refusal does not apply
            super().check_hvp(hvp.replace(max_combinations=None))

    def resolve_hvp(self, hvp: HVP) -> HVP:
        auto = hvp.max_combinations == "auto"
        resolved = super().resolve_hvp(hvp)
        return resolved.replace(max_combinations=self.hvp_max_combinations) if auto else resolved
