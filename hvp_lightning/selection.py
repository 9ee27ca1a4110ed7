"""Hard View Pretraining: the selection step shared by every method.

The whole algorithm lives here. A method that mixes in :class:`HardViewMixin` supplies

* ``candidate_scores(batch) -> Tensor[B, C]``: the method's own per-sample loss for every
  candidate combination ``c`` (pairs for SimSiam/SimCLR, crop sets for DINO/iBOT), computed
  from a forward over all candidate views. The mixin runs it without gradients, with
  BatchNorm running statistics frozen and RNG streams restored afterwards;
* ``select_views(batch, choice) -> batch``: the ordinary 2-view (or multi-crop) batch made of
  each sample's chosen combination (pair methods get this for free);
* ``ssl_step(batch, batch_idx) -> loss``: the method's unchanged training step.

With HVP off, ``training_step`` is exactly ``ssl_step``: the mixin adds nothing.

Gradient accumulation: ``hvp.every_n_steps`` counts optimiser steps (Lightning's
``global_step``), so the k micro-batches of one optimiser step either all select hard views
or all train on plain ones -- the accumulated step is the same kind of step as one big batch.
Random draws (``random`` mode, DINO's sampled locals, iBOT's masks) are seeded by
(seed, global_step, micro-batch index, rank), so the micro-batches of one step draw differently.

Precision: the selection forward runs at ``hvp.selection_precision``. ``auto`` (the default)
is the precision of the training step itself -- the autocast Lightning runs the step under
(bf16 for ``bf16-mixed``, fp16 for ``16-mixed``, none for ``32-true``) -- except on CPU,
where it is fp32; ``fp32`` switches Lightning's autocast off for the selection, ``bf16`` /
``fp16`` force one. The methods compute the candidate tables in fp32 either way, so the
argmax ranks the loss the method computes.

Devices: every index this module builds takes the device of the tensors it indexes
(``pair_index(n, device=...)``), so the gather never sends a CPU index into a GPU batch or a
GPU index into a CPU table (tests/test_device_guard.py checks each method's step for that).
"""

from __future__ import annotations

import hashlib
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .options import GLOBAL_PAIRS, MODES, PRECISIONS

# Autocast dtype Lightning runs a training step under, per trainer.precision (the ones
# config.py allows); None = no autocast.
STEP_DTYPES: dict[str, torch.dtype | None] = {"32-true": None, "bf16-mixed": torch.bfloat16,
                                              "16-mixed": torch.float16}


@dataclass(frozen=True)
class HVPConfig:
    """What the paper varies: number of views, choice rule, frequency, selection precision."""

    enabled: bool = False
    num_views: int = 4
    mode: str = "hard"
    every_n_steps: int = 1
    selection_precision: str = "auto"
    # Multi-crop methods only: score K random combinations instead of the exact maximum
    # (the paper's fidelity setting); None = exact.
    max_combinations: int | None = None
    # Multi-crop methods only: the global pairs scored (GLOBAL_PAIRS).
    global_pairs: str = "cross"

    @property
    def views_per_image(self) -> int:
        """Candidate views the data pipeline must produce per image (2 = baseline)."""
        return self.num_views if self.enabled else 2


def pair_index(n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """All unordered pairs ``(k, l)``, ``k < l``, of ``n`` views: LongTensor ``[n(n-1)/2, 2]``.

    The order is row-major (``(0,1), (0,2), ..., (n-2,n-1)``), so with ``n == 2`` the only
    pair is ``(0, 1)`` -- the baseline's pair. Inside a step pass ``device``: that of the
    choice or table it meets (a CPU pair table indexed by a GPU choice fails on GPU).
    """
    return torch.triu_indices(n, n, offset=1, device=device).T.contiguous()


def global_pair_index(g: int, rule: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """The global-candidate pairs a multi-crop method scores: LongTensor ``[P, 2]``.

    Global candidates alternate DINO's two asymmetric pipelines (even positions: pipeline 1,
    odd: pipeline 2). ``cross`` keeps that asymmetry in every pair, as the official HVP code
    does (``itertools.product(range(0, G, 2), range(1, G, 2))``, in that order: pipeline-1
    crop first); ``all`` is :func:`pair_index`. Either way column 0 is ``(0, 1)``, the
    baseline's pair.
    """
    if rule == "all":
        return pair_index(g, device)
    if rule != "cross":
        raise ValueError(f"hvp.global_pairs={rule!r}; allowed: {', '.join(GLOBAL_PAIRS)}")
    first = torch.arange(0, g, 2, device=device)
    second = torch.arange(1, g, 2, device=device)
    return torch.cartesian_prod(first, second).reshape(-1, 2)


def choose(table: torch.Tensor, mode: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """Per-sample choice over candidate combinations: ``table`` is ``[B, C]`` -> LongTensor ``[B]``.

    ``hard`` = argmax of the loss (the paper's HVP), ``easy`` = argmin (the "cooperative"
    ablation), ``random`` = uniform over the same candidates (isolates the effect of the
    choice from the effect of drawing more views).

    Non-finite entries (NaN, +-inf: a diverged model, an fp16 overflow in the selection
    forward) are never chosen, in any mode -- unmasked, a NaN would win both argmax and
    argmin. A sample with no finite entry at all raises :class:`FloatingPointError`: there
    is nothing sound to train on (this check costs one host sync).
    """
    if mode not in MODES:
        raise ValueError(f"hvp.mode={mode!r}; allowed: {', '.join(MODES)}")
    finite = torch.isfinite(table)
    if not bool(finite.any(dim=1).all()):
        bad = (~finite.any(dim=1)).nonzero().flatten().tolist()
        raise FloatingPointError(
            f"HVP selection: every candidate loss is non-finite (NaN/inf) for {len(bad)} of {table.shape[0]} "
            f"samples (batch positions {bad[:8]}); refusing to train on them. The model may have diverged "
            "(learning rate?), or hvp.selection_precision=fp16 overflowed (try bf16 or fp32).")
    if mode == "hard":
        return table.masked_fill(~finite, float("-inf")).argmax(dim=1)
    if mode == "easy":
        return table.masked_fill(~finite, float("inf")).argmin(dim=1)
    # Uniform over each sample's finite entries: the argmax of i.i.d. uniform keys.
    keys = torch.rand(table.shape, generator=generator).to(table.device)
    return keys.masked_fill(~finite, -1.0).argmax(dim=1)


def step_autocast_dtype(trainer_precision: str) -> torch.dtype | None:
    """The autocast dtype of a training step under ``trainer.precision`` (None: fp32)."""
    if trainer_precision not in STEP_DTYPES:
        raise ValueError(f"trainer.precision={trainer_precision!r}; allowed: {', '.join(STEP_DTYPES)}")
    return STEP_DTYPES[trainer_precision]


def ambient_autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force for ``device_type`` here (None: no autocast): inside a
    Lightning training step, the step's own precision."""
    if not torch.amp.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def resolve_selection_dtype(precision: str, device_type: str,
                            step_dtype: torch.dtype | None = None) -> torch.dtype | None:
    """Autocast dtype for the selection forward, or None for full fp32.

    ``auto`` follows the training step (``step_dtype``, see :func:`step_autocast_dtype`) so
    that the selection costs what a forward of the step costs. On CPU it is always fp32:
    bf16/fp16 autocast convolutions were measured 30-37x *slower* than fp32 there (docs/DESIGN.md);
    an explicit ``bf16``/``fp16`` falls back loudly, never silently.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"hvp.selection_precision={precision!r}; allowed: {', '.join(PRECISIONS)}")
    if precision == "fp32" or device_type == "cpu" and precision == "auto":
        return None
    if device_type == "cpu":
        warnings.warn(
            f"hvp.selection_precision={precision} is not used on CPU: low-precision autocast "
            "convolutions run 30-37x slower than fp32 there; selecting in fp32 instead.",
            stacklevel=2,
        )
        return None
    if precision == "auto":
        return step_dtype
    return torch.bfloat16 if precision == "bf16" else torch.float16


@contextmanager
def frozen_state(module: nn.Module, device: torch.device) -> Iterator[None]:
    """No gradients, no BatchNorm running-stat updates, RNG streams restored on exit.

    BatchNorm keeps normalising with the *batch* statistics in train mode (as the loss it
    imitates does); ``track_running_stats=False`` only stops the buffer updates (running
    mean/var and ``num_batches_tracked``). SyncBatchNorm (DDP, ``trainer.sync_batchnorm``) is
    a ``_BatchNorm`` too: candidates are then normalised with the statistics of the global
    batch of their view set, as the training step normalises its views. Forking the RNG
    means dropout/drop-path in the selection forward cannot shift the random streams of the
    training step or the loader.
    """
    bns = [m for m in module.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    for m in bns:
        m.track_running_stats = False
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            yield
    finally:
        for m in bns:
            m.track_running_stats = True


def gather_pairs(views: torch.Tensor, pairs: torch.Tensor, choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick each sample's chosen pair from stacked candidates ``views`` ``[N, B, ...]``.

    Returns the two view batches ``[B, ...]`` -- vectorised, no loop over samples.
    """
    b = torch.arange(views.shape[1], device=views.device)
    k, l = pairs[choice].to(views.device).unbind(1)
    return views[k, b], views[l, b]


def stable_seed(*parts: int) -> int:
    digest = hashlib.blake2b(" ".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class HardViewMixin:
    """Overrides ``training_step`` with HVP's select-then-train step (see module docstring).

    Put it before the LightningModule base: ``class SimSiam(HardViewMixin, SSLMethod)``.
    The host sets ``self.hvp`` (an :class:`HVPConfig`) in ``__init__``.
    """

    hvp: HVPConfig
    hvp_batch_idx: int = 0  # micro-batch being selected: part of the private generators' seeds

    # --- hooks the method provides -------------------------------------------------------
    def candidate_scores(self, batch: dict[str, Any]) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def ssl_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def select_views(self, batch: dict[str, Any], choice: torch.Tensor) -> dict[str, Any]:
        """Default for pair methods: ``batch['views']`` is a list of N candidate batches."""
        stacked = torch.stack(batch["views"])
        pairs = pair_index(stacked.shape[0], device=choice.device)
        v1, v2 = gather_pairs(stacked, pairs, choice)
        out = dict(batch, views=[v1, v2])
        if "params" in batch:  # augmentation parameters travel with their views
            out["params"] = _gather_params(batch["params"], pairs, choice)
        return out

    # --- the step --------------------------------------------------------------------------
    def hvp_active(self) -> bool:
        """HVP on this optimiser step? Same answer for every micro-batch of one step."""
        return self.hvp.enabled and self.global_step % self.hvp.every_n_steps == 0  # type: ignore[attr-defined]

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if not self.hvp.enabled:
            return self.ssl_step(batch, batch_idx)
        self.hvp_batch_idx = batch_idx
        if not self.hvp_active():
            # Alternating schedule: an ordinary step on the first two (i.i.d.) candidates.
            return self.ssl_step(self.select_views(batch, self._first_combination(batch)), batch_idx)
        table = self.score_candidates(batch)
        choice = choose(table, self.hvp.mode, self._choice_generator(batch_idx))
        loss = self.ssl_step(self.select_views(batch, choice), batch_idx)
        self._record_selection(table, choice, loss)
        return loss

    def score_candidates(self, batch: dict[str, Any]) -> torch.Tensor:
        """The selection pass: ``candidate_scores`` under :func:`frozen_state`, at the selection
        precision: the step's autocast (``auto``), its own, or none at all for fp32 (even
        inside the training step's ``bf16-mixed``/``16-mixed`` autocast)."""
        device = batch["views"][0].device
        self.hvp_step_dtype = ambient_autocast_dtype(device.type)
        dtype = self._selection_dtype(device.type)
        amp = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
        with frozen_state(self, device), amp:  # type: ignore[arg-type]
            table = self.candidate_scores(batch)
        return table.float()

    def selection_outputs_reusable(self) -> bool:
        """May outputs of the current selection pass stand in for the training step's own (DINO
        and iBOT reuse the BatchNorm-free teacher's)? Yes if the selection runs in fp32 or at
        the step's own precision (``auto``), not if it runs lower than the step. Valid inside
        ``candidate_scores``."""
        dtype = self._selection_dtype(self.device.type)  # type: ignore[attr-defined]
        return dtype is None or dtype == getattr(self, "hvp_step_dtype", None)

    # --- helpers ---------------------------------------------------------------------------
    def _first_combination(self, batch: dict[str, Any]) -> torch.Tensor:
        label = batch["label"]
        return torch.zeros(label.shape[0], dtype=torch.long, device=label.device)

    def _selection_dtype(self, device_type: str) -> torch.dtype | None:
        """The selection's autocast dtype here; the same answer inside the selection pass
        (whose autocast is then the ambient one), so methods may ask it there too."""
        key = (self.hvp.selection_precision, device_type, ambient_autocast_dtype(device_type))
        resolved = self.__dict__.setdefault("_hvp_dtypes", {})
        if key not in resolved:  # resolve (and warn) once per setting
            resolved[key] = resolve_selection_dtype(*key)
        return resolved[key]

    def _choice_generator(self, batch_idx: int) -> torch.Generator | None:
        """Private generator for ``random`` mode: reproducible, distinct per micro-batch under
        gradient accumulation, and it leaves the global RNG (and so the data loader's views)
        exactly where the baseline would have it."""
        if self.hvp.mode != "random":
            return None
        seed = getattr(self, "seed", 0)
        return torch.Generator().manual_seed(stable_seed(seed, self.global_step, batch_idx, self.global_rank))  # type: ignore[attr-defined]

    def _record_selection(self, table: torch.Tensor, choice: torch.Tensor, trained_loss: torch.Tensor) -> None:
        """Log what this HVP step did, under names that say which pass each value comes from.

        ``hvp/selection_*`` are the selection pass's own values (frozen BatchNorm buffers,
        candidates normalised per view set; SimCLR's negatives from the candidate sets);
        ``hvp/trained_loss`` is the loss the training step then computed on the chosen views
        -- with BatchNorm or batch-level negatives the two differ. Non-finite table entries
        (never chosen, see :func:`choose`) are counted and left out of the candidate mean.
        """
        finite = torch.isfinite(table)
        selected = table.gather(1, choice[:, None]).squeeze(1)
        candidates = torch.where(finite, table, 0.0).sum(1) / finite.sum(1)  # per sample; >= 1 finite (choose)
        nonfinite = (~finite).sum().to(table.dtype)
        trained = trained_loss.detach().to(table.dtype)
        sel, cand = selected.mean(), candidates.mean()
        b = table.shape[0]
        log = self.log  # type: ignore[attr-defined]
        log("hvp/selection_selected_loss", sel, on_step=True, on_epoch=True, batch_size=b)
        log("hvp/selection_candidate_loss", cand, on_step=True, on_epoch=True, batch_size=b)
        log("hvp/selection_selected_minus_candidate", sel - cand, on_step=True, on_epoch=False, batch_size=b)
        log("hvp/trained_loss", trained, on_step=True, on_epoch=True, batch_size=b)
        log("hvp/nonfinite_candidates", nonfinite, on_step=True, on_epoch=False, batch_size=b)
        # Run totals (TOTALS order) stay on device: no sync per step.
        n = table.new_tensor(float(b))
        inc = torch.stack([selected.sum(), candidates.sum(), n, trained * n, n, nonfinite]).double()
        totals = getattr(self, "hvp_totals", None)
        if totals is not None and totals.numel() < inc.numel():  # a checkpoint from before trained/nonfinite totals
            totals = torch.cat([totals.to(inc.device), inc.new_zeros(inc.numel() - totals.numel())])
        self.hvp_totals = inc if totals is None else totals.to(inc.device) + inc
        self.last_selection = {"table": table.detach(), "choice": choice.detach()}


# Layout of ``HardViewMixin.hvp_totals`` (sums over all HVP steps, all micro-batches).
TOTALS = ("selection_selected_loss_sum", "selection_candidate_loss_sum", "selection_samples", "trained_loss_sum",
          "trained_samples", "nonfinite_candidates")


def summarise_totals(totals: torch.Tensor | None) -> dict[str, float | int | None]:
    """``summary.json``'s HVP statistics from the run totals (already summed over ranks):
    the selection pass's means (chosen and all candidates), the trained loss's mean over the
    HVP steps, the samples behind them and how many non-finite candidate entries were masked."""
    t = dict(zip(TOTALS, totals.double().tolist())) if totals is not None else {}
    sel_n, trained_n = t.get("selection_samples", 0.0), t.get("trained_samples", 0.0)
    return {
        "selection_selected_loss_mean": t["selection_selected_loss_sum"] / sel_n if sel_n else None,
        "selection_candidate_loss_mean": t["selection_candidate_loss_sum"] / sel_n if sel_n else None,
        "trained_loss_mean": t["trained_loss_sum"] / trained_n if trained_n else None,
        "selected_samples": int(sel_n),
        "nonfinite_candidates": int(t.get("nonfinite_candidates", 0)),
    }


def _gather_params(params: dict[str, torch.Tensor], pairs: torch.Tensor, choice: torch.Tensor) -> dict[str, torch.Tensor]:
    """Keep the augmentation parameters of the chosen views: ``[B, N, ...]`` -> ``[B, 2, ...]``."""
    k, l = pairs[choice].unbind(1)
    b = torch.arange(choice.shape[0], device=choice.device)
    out = {}
    for name, p in params.items():
        kk, ll, bb = k.to(p.device), l.to(p.device), b.to(p.device)
        out[name] = torch.stack([p[bb, kk], p[bb, ll]], dim=1)
    return out
