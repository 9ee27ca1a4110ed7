"""The IoU policy: the model-free baseline of the paper's appendix "Deriving an augmentation policy".

A pair of views is redrawn until the IoU of its two crop boxes (source-image pixels) is at most
a threshold scheduled over epochs, so every pair trained on has at least that much task
difficulty -- what HVP's selection seemed to aim at (the paper, Fig. 3 left: selected pairs' IoU
~0.30 -> 0.35). The rule is the official code's (automl/hvp ``msatransform.py``):

* each try draws both crops afresh; a pair whose IoU *exceeds* the threshold is rejected;
* before its IoU check, a try is taken as drawn with probability ``skip_p`` (the official
  ``msat_prob``; 0 = every pair constrained);
* after ``max_tries`` tries (official: 512) the last draw is kept and flagged a fallback;
* the threshold of epoch ``e``: 1 (nothing rejected) during ``warmup_epochs``, then ``start`` ->
  ``end`` over the remaining epochs, linearly (``np.linspace``: ``end`` at the last epoch) or
  by a half cosine (the official ``cosine_scheduler``: ``end`` approached, not reached).

Which pairs: the views ``(0, 1), (2, 3), ...`` among the leading views that share view 0's crop
size and scale (:func:`policy_pairs`): the baseline's pair of a pair method; with HVP's N
candidates, N/2 independently constrained pairs (each drawn as the baseline's pair under the
policy; pairs across them are not constrained); DINO/iBOT's global pairs (pipeline 1, pipeline 2),
their locals free. Odd views out stay free.

Randomness: try ``t`` of a view is the view drawn from key ``try_key(view_key(seed, epoch,
index, slot), t)`` (:mod:`.seeds`), try 0 being the view itself, and the try's skip coin is the
first uniform past the view's own (:data:`.augment.UNIFORMS`) of the pair's first view. The
accepted try -- and so the whole view, colour included -- is a function of (seed, epoch, image,
slot): any worker count, the resident path and a resume give the same views. Loader workers
search one pair at a time in Python scalars (:func:`scalar_try`, crops only: ~10 us a try); the
resident path searches a batch's pairs at once on its device (:func:`constrain_keys`); the
tests check that both pick the same tries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .augment import UNIFORMS, ViewAug, crop_box, cut_views, draw_params, to_uint8_tensor
from .seeds import key_uniform, key_uniforms, try_key, try_keys, view_key

FIRST_BLOCK = 8  # tries searched at once first; each further block doubles


@dataclass(frozen=True)
class IoUPolicy:
    """``data.iou_policy`` with the run's ``trainer.max_epochs`` (``epochs``)."""

    start: float = 0.30
    end: float = 0.35
    schedule: str = "linear"
    warmup_epochs: int = 0
    epochs: int = 100
    skip_p: float = 0.0
    max_tries: int = 512

    def threshold(self, epoch: int) -> float:
        """The IoU above which epoch ``epoch`` rejects a pair (1 during warm-up: none)."""
        if epoch < self.warmup_epochs:
            return 1.0
        n = self.epochs - self.warmup_epochs
        i = min(epoch - self.warmup_epochs, n - 1)  # epochs past the schedule keep its last value
        if self.schedule == "linear":
            frac = i / (n - 1) if n > 1 else 0.0
        else:
            frac = (1 - math.cos(math.pi * i / n)) / 2
        return self.start + (self.end - self.start) * frac


def iou_policy(cfg: Any) -> IoUPolicy | None:
    """The run's policy from ``data.iou_policy`` (None when absent or ``enabled: false``)."""
    node = cfg.data.iou_policy
    if node is None or not node.enabled:
        return None
    return IoUPolicy(
        start=float(node.start),
        end=float(node.end),
        schedule=str(node.schedule),
        warmup_epochs=int(node.warmup_epochs),
        epochs=int(cfg.trainer.max_epochs),
        skip_p=float(node.skip_p),
        max_tries=int(node.max_tries),
    )


def policy_pairs(augs: Sequence[ViewAug]) -> tuple[tuple[int, int], ...]:
    """The constrained view pairs (module docstring)."""
    lead = 0
    while lead < len(augs) and (augs[lead].size, augs[lead].scale) == (augs[0].size, augs[0].scale):
        lead += 1
    return tuple((k, k + 1) for k in range(0, lead - 1, 2))


def box_iou(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> torch.Tensor:
    """IoU of the crop boxes ``(crop_x, crop_y, crop_w, crop_h)`` of ``a`` and ``b``, float64."""
    xa, ya, wa, ha = (a[k].double() for k in ("crop_x", "crop_y", "crop_w", "crop_h"))
    xb, yb, wb, hb = (b[k].double() for k in ("crop_x", "crop_y", "crop_w", "crop_h"))
    iw = (torch.minimum(xa + wa, xb + wb) - torch.maximum(xa, xb)).clamp(min=0)
    ih = (torch.minimum(ya + ha, yb + hb) - torch.maximum(ya, yb)).clamp(min=0)
    inter = iw * ih
    return inter / (wa * ha + wb * hb - inter)


def _accepted(
    keys_a: torch.Tensor,
    keys_b: torch.Tensor,
    augs: tuple[ViewAug, ViewAug],
    src: tuple[int, int],
    threshold: float,
    skip_p: float,
) -> torch.Tensor:
    """Which tries (try keys ``[R, C]`` of both views) pass: skip coin, else IoU <= threshold."""
    ua = key_uniforms(keys_a, UNIFORMS + 1)
    pa = draw_params(ua[..., :UNIFORMS].reshape(-1, UNIFORMS), *src, augs[0])
    pb = draw_params(key_uniforms(keys_b, UNIFORMS).reshape(-1, UNIFORMS), *src, augs[1])
    iou = box_iou(pa, pb).view(keys_a.shape)
    return (ua[..., UNIFORMS] < skip_p) | (iou <= threshold)


def first_tries(
    policy: IoUPolicy,
    threshold: float,
    augs: tuple[ViewAug, ViewAug],
    keys_a: torch.Tensor,
    keys_b: torch.Tensor,
    src: tuple[int, int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each pair's first accepted try (int64 ``[n]``) and whether none was (``[n]`` bool: the
    try is then the last, ``max_tries - 1``), searching blocks of tries of growing size."""
    n, device = keys_a.shape[0], keys_a.device
    chosen = torch.full((n,), -1, dtype=torch.int64, device=device)
    start, block = 0, FIRST_BLOCK
    while start < policy.max_tries:
        rows = (chosen < 0).nonzero()[:, 0]
        if rows.numel() == 0:
            break
        t = torch.arange(start, min(start + block, policy.max_tries), device=device)
        ok = _accepted(
            try_keys(keys_a[rows, None], t), try_keys(keys_b[rows, None], t), augs, src, threshold, policy.skip_p
        )
        hit = ok.any(1)
        chosen[rows[hit]] = t[ok.to(torch.uint8).argmax(1)[hit]]
        start, block = start + block, 2 * block
    failed = chosen < 0
    return torch.where(failed, policy.max_tries - 1, chosen), failed


def constrain_keys(
    policy: IoUPolicy, augs: Sequence[ViewAug], keys: torch.Tensor, src_h: int, src_w: int, epoch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys to draw the views of ``n`` images of one size from under the policy: int64
    ``keys`` ``[n, V]`` (:func:`.seeds.view_keys`) -> (``[n, V]`` with each constrained pair's
    accepted try, float32 ``[n, V]`` fallback flags: 1 on both views of a pair that kept its
    last try)."""
    fallback = torch.zeros(keys.shape, dtype=torch.float32, device=keys.device)
    threshold = policy.threshold(epoch)
    pairs = policy_pairs(augs)
    if threshold >= 1.0 or not pairs:  # nothing is rejected: every first try stands
        return keys, fallback
    keys = keys.clone()
    for a, b in pairs:
        t, failed = first_tries(policy, threshold, (augs[a], augs[b]), keys[:, a], keys[:, b], (src_h, src_w))
        keys[:, a], keys[:, b] = try_keys(keys[:, a], t), try_keys(keys[:, b], t)
        fallback[:, a] = fallback[:, b] = failed.float()
    return keys, fallback


def box_iou_scalar(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    """:func:`box_iou` of two ``(left, top, w, h)`` boxes in Python (the same float64 value)."""
    iw = max(0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    ih = max(0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def scalar_try(
    policy: IoUPolicy, threshold: float, augs: tuple[ViewAug, ViewAug], key_a: int, key_b: int, src: tuple[int, int]
) -> tuple[int, bool]:
    """:func:`first_tries` for one pair in Python scalars: (accepted try, fallback)."""
    for t in range(policy.max_tries):
        ka, kb = try_key(key_a, t), try_key(key_b, t)
        if key_uniform(ka, UNIFORMS) < policy.skip_p:
            return t, False
        if box_iou_scalar(crop_box(*src, augs[0], ka), crop_box(*src, augs[1], kb)) <= threshold:
            return t, False
    return policy.max_tries - 1, True


@dataclass(frozen=True)
class IoUPolicyViews:
    """:class:`.augment.MultiViewTransform` under the policy (loader workers): the same views
    wherever the policy accepts a first try, plus ``params["iou_fallback"]`` ``[V]`` (1 on both
    views of a pair that kept its last try)."""

    augs: tuple[ViewAug, ...]
    policy: IoUPolicy
    seed: int = 0

    def __call__(self, img, epoch: int, index: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        img = to_uint8_tensor(img)
        keys = [view_key(self.seed, epoch, index, slot) for slot in range(len(self.augs))]
        fallback = [0.0] * len(keys)
        threshold = self.policy.threshold(epoch)
        if threshold < 1.0:
            for a, b in policy_pairs(self.augs):
                pair = (self.augs[a], self.augs[b])
                t, failed = scalar_try(self.policy, threshold, pair, keys[a], keys[b], tuple(img.shape[1:]))
                keys[a], keys[b] = try_key(keys[a], t), try_key(keys[b], t)
                fallback[a] = fallback[b] = float(failed)
        views, params = cut_views(img, self.augs, keys)
        params["iou_fallback"] = torch.tensor(fallback)
        return views, params
