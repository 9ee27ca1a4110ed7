"""iBOT's settings (Zhou et al., 2022): the keys of :class:`~hvp_lightning.methods.ibot.IBOT` (DINO's
teacher-student keys and its masked-patch ones), their defaults the official ViT-S/16 recipe."""

from __future__ import annotations

from typing import ClassVar, Literal

from .declare import SettingError, declared, setting
from .dino import CLIP_GRAD_KINDS, TeacherStudentSettings
from .hvp import HVP


@declared
class IBOTSettings(TeacherStudentSettings):
    """iBOT (Zhou et al., 2022): DINO's [CLS] loss plus masked-patch prediction."""

    name: ClassVar[str] = "ibot"

    out_dim: int = setting(8192, "head output width (prototypes)", ge=1)
    norm_last_layer: bool = setting(False, "weight-normalised output layer with its norm fixed to 1")
    teacher_temp: float = setting(0.07, "teacher temperature after its warm-up", gt=0)
    warmup_teacher_temp_epochs: int = setting(30, "epochs of the teacher temperatures' linear warm-up", ge=0)
    clip_grad_kind: Literal[CLIP_GRAD_KINDS] = setting(
        "per_parameter",
        "global: one norm over all parameters (the HVP code's DINO); per_parameter: each parameter on its own "
        "(upstream DINO, iBOT)",
    )
    num_local_crops: int = setting(10, "local crops per image (L)", ge=0)
    global_scale: tuple[float, float] = setting((0.25, 1.0), "global crops' area range", gt=0, le=1, ordered=True)
    local_scale: tuple[float, float] = setting((0.05, 0.25), "local crops' area range", gt=0, le=1, ordered=True)
    patch_out_dim: int = setting(8192, "patch logits width when shared_head is false (shared: out_dim)", ge=1)
    shared_head: bool = setting(True, "the patch tokens share the [CLS] head's output layer")
    lambda1: float = setting(1.0, "weight of the [CLS] (DINO) term", ge=0)
    lambda2: float = setting(1.0, "weight of the masked-patch term", ge=0)
    teacher_patch_temp: float = setting(0.07, "teacher patch temperature after its warm-up", gt=0)
    warmup_teacher_patch_temp: float = setting(
        0.04, "teacher patch temperature at the start of its warm-up (warmup_teacher_temp_epochs)", gt=0
    )
    center_momentum2: float = setting(0.9, "EMA momentum of the patch-token centre", ge=0, le=1)
    mask_prob: float = setting(0.5, "share of global crops that are masked at all", ge=0, le=1)
    mask_ratio: tuple[float, float] = setting(
        (0.1, 0.5), "masked share of a masked crop's patches, uniform in [min, max]", ge=0, le=1, ordered=True
    )
    mask_min_aspect: float = setting(
        0.3, "masking blocks' aspect ratio, log-uniform in [mask_min_aspect, 1/mask_min_aspect]", gt=0, le=1
    )

    def candidate_counts(self, hvp: HVP) -> tuple[int, int]:
        """(G, L): G = 2, or with HVP ``hvp.num_global_candidates`` (default ``hvp.num_views``)
        global candidates; always the L = ``num_local_crops`` ordinary locals (iBOT selects globals only)."""
        if not hvp.enabled:
            return 2, self.num_local_crops
        return hvp.num_global_candidates or hvp.num_views, self.num_local_crops

    def check_hvp(self, hvp: HVP) -> None:
        lc = hvp.num_local_candidates
        if hvp.enabled and lc is not None and lc != self.num_local_crops:
            raise SettingError(
                "num_local_candidates",
                lc,
                "null or method.num_local_crops: iBOT selects among global views only (leave it unset or = "
                f"method.num_local_crops={self.num_local_crops})",
            )
        super().check_hvp(hvp)
