"""Online hard-view statistics and the optional Parquet view log (paper section 6).

:class:`HardViewAnalysis` is a Lightning callback, so the methods and the selection code stay
untouched: after every training batch it reads the batch's augmentation parameters and, on
HVP steps, the mixin's ``last_selection`` (``{"table": [B, C], "choice": [B]}``), and

* logs ``analysis/*`` metrics (IoU, relative centre distance and colour distance of the
  selected pair vs all candidate pairs, the share of samples whose selected pair is also the
  lowest-IoU pair, and its chance level) and appends them to ``<run_dir>/analysis/steps-r<rank>.csv``
  (one row per step; the offline analysis reads it whatever the logger);
* every ``log_every_n_steps`` steps, buffers one row per candidate view and one per candidate
  pair of every image and writes them as Parquet part files (``views-*.parquet``,
  ``pairs-*.parquet``) under ``<run_dir>/analysis/``.

Baseline runs (HVP off) log the ``*_selected`` statistics of the pair they train on, so the
two runs compare directly. Multi-crop methods (DINO/iBOT) are analysed on their global views
only: with HVP their score table has one column per scored global pair
(``global_pair_index(G, hvp.global_pairs)``); DINO with ``hvp.max_combinations`` scores
random combinations instead, which is not a pair table, so its statistics are skipped with
one warning saying so.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from ..data.augment import PARAM_NAMES
from ..nn.sync_free import host_to_device
from ..run.atomic import atomic_write_text
from ..run.directory import RunDir
from ..schema import TrainConfig
from ..selection import global_pair_index, pair_index
from .metrics import JITTER_NAMES, jitter_differences, pair_metrics

# Columns of steps-r<rank>.csv after step, micro, epoch, hvp, samples (NaN where not applicable).
STAT_KEYS = (
    "iou_selected",
    "iou_candidates",
    "iou_lowest",
    "lowest_iou_share",
    "lowest_iou_chance",
    "lowest_iou_chance_ties",
    "rel_dist_selected",
    "rel_dist_candidates",
    "color_dist_selected",
    "color_dist_candidates",
    "loss_selected",
    "loss_candidates",
)
INT_PARAMS = ("crop_x", "crop_y", "crop_w", "crop_h", "src_w", "src_h")
BOOL_PARAMS = ("flip", "jitter", "grayscale", "solarize")
PAIR_FEATURES = ("iou", "rel_dist", "color_dist", *(f"{n}_diff" for n in JITTER_NAMES))
TIE_EPS = 1e-6


def head_views(params: Mapping[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    """The first ``n`` views' parameters (multi-crop: the global candidates)."""
    return {k: v[:, :n] for k, v in params.items()}


def step_statistics(
    params: Mapping[str, torch.Tensor],
    table: torch.Tensor | None = None,
    choice: torch.Tensor | None = None,
    pairs: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Selection statistics of one batch, as 0-d tensors (no host sync).

    ``params`` holds the N candidate views; ``pairs`` ``[P, 2]`` are the view pairs of
    ``table``'s columns (default ``pair_index(N)``; multi-crop methods may score a subset of
    the global pairs). Without a ``choice`` (baseline, or an HVP off-step) the trained pair is
    views 0 and 1 and only the ``*_selected`` keys are returned. ``lowest_iou_share`` counts a
    hit when the selected pair's IoU equals the minimum over the P pairs (ties included);
    ``lowest_iou_chance`` is the nominal ``1 / P`` and ``lowest_iou_chance_ties`` the
    tie-aware chance of a uniform choice (mean share of pairs that attain the minimum).
    """
    n = params["crop_x"].shape[1]
    device = params["crop_x"].device
    pairs = pair_index(n, device=device) if pairs is None else host_to_device(pairs, device)
    m = pair_metrics(params, pairs)
    if choice is None:
        return {f"{k}_selected": v[:, 0].mean() for k, v in m.items()}
    choice = choice.to(m["iou"].device)[:, None]
    out = {}
    for k, v in m.items():
        out[f"{k}_selected"] = v.gather(1, choice).mean()
        out[f"{k}_candidates"] = v.mean()
    iou = m["iou"]
    low = iou.min(1, keepdim=True).values
    ties = (iou <= low + TIE_EPS).float()
    out["iou_lowest"] = low.mean()
    out["lowest_iou_share"] = ties.gather(1, choice).mean()
    out["lowest_iou_chance"] = torch.full((), 1.0 / pairs.shape[0], dtype=iou.dtype, device=iou.device)  # no host copy
    out["lowest_iou_chance_ties"] = ties.mean(1).mean()
    if table is not None:
        t = table.float().to(iou.device)
        out["loss_selected"] = t.gather(1, choice).nanmean()  # NaN: not scored (hvp.selection_fraction)
        out["loss_candidates"] = t.masked_fill(~torch.isfinite(t), float("nan")).nanmean()  # masked entries out
    return out


def pair_table(pl_module: Any, params: Mapping[str, torch.Tensor]) -> tuple[int, torch.Tensor, str | None]:
    """(candidate views whose pairs the score table indexes, those pairs ``[P, 2]`` in column
    order, reason it is not a pair table or None)."""
    g = getattr(pl_module, "num_globals", None)
    if g is None:  # pair methods: every view is a candidate, every pair a column
        n = int(params["crop_x"].shape[1])
        return n, pair_index(n), None
    hvp = getattr(pl_module, "hvp", None)
    pairs = global_pair_index(int(g), getattr(hvp, "global_pairs", "cross"))
    k = getattr(hvp, "max_combinations", None)
    scored = hvp is not None and hvp.enabled and hvp.mode != "min_iou"  # min_iou samples no combinations
    if k is not None and scored and hasattr(pl_module, "num_locals_cand"):
        total = pairs.shape[0] * math.comb(int(pl_module.num_locals_cand), int(pl_module.num_local))
        if int(k) < total:  # DINO's sampled setting (iBOT rejects max_combinations)
            return (
                int(g),
                pairs,
                (
                    f"hvp.max_combinations={k} scores {k} random (global pair, locals) combinations "
                    "per sample, not a table over global pairs; selection statistics are skipped"
                ),
            )
    return int(g), pairs, None


class ViewLog:
    """Buffers every candidate view and pair of a logged batch; writes Parquet part files.

    Part files (``views-r<rank>-s<first step>.parquet``, ``pairs-...``) are written every
    ``flush_every`` logged batches and at the end, so a crash loses at most that many and no
    file is ever half written. ``index`` is the image's index in the training set *as the
    data module builds it* (after ``data.train_subset``).
    """

    def __init__(self, out_dir: Path, rank: int = 0, flush_every: int = 20) -> None:
        self.out_dir, self.rank, self.flush_every = Path(out_dir), int(rank), max(1, int(flush_every))
        self._views: list[dict[str, np.ndarray]] = []
        self._pairs: list[dict[str, np.ndarray]] = []
        self._first_step: int | None = None
        self.files: list[Path] = []

    def add(
        self,
        step: int,
        index: torch.Tensor,
        params: Mapping[str, torch.Tensor],
        table: torch.Tensor | None,
        choice: torch.Tensor | None,
        micro: int = 0,
        pairs: torch.Tensor | None = None,
    ) -> None:
        """One batch: ``params`` of its N candidate views, the ``[B, P]`` loss ``table`` and the
        ``[B]`` ``choice`` (None without a selection: the pair trained on is then views 0, 1).
        ``micro`` is the batch's position within a gradient-accumulation step; ``pairs`` the
        view pairs of ``table``'s columns (default ``pair_index(N)``)."""
        p = {k: v.detach().cpu() for k, v in params.items()}
        b, n = p["crop_x"].shape
        pairs = pair_index(n) if pairs is None else pairs.cpu()
        nump = pairs.shape[0]
        ch = choice.detach().cpu().long() if choice is not None else torch.zeros(b, dtype=torch.long)
        idx = index.detach().cpu().long()
        sel_views = torch.zeros(b, n, dtype=torch.bool)
        sel_views[torch.arange(b), pairs[ch, 0]] = True
        sel_views[torch.arange(b), pairs[ch, 1]] = True
        v: dict[str, np.ndarray] = {
            "step": np.full(b * n, step, np.int64),
            "micro": np.full(b * n, micro, np.int16),
            "rank": np.full(b * n, self.rank, np.int16),
            "sample": np.repeat(np.arange(b, dtype=np.int32), n),
            "index": np.repeat(idx.numpy(), n),
            "view": np.tile(np.arange(n, dtype=np.int8), b),
            "selected": sel_views.reshape(-1).numpy(),
        }
        for name in PARAM_NAMES:
            x = p[name].reshape(-1).numpy()
            v[name] = (
                x.round().astype(np.int32)
                if name in INT_PARAMS
                else (x > 0 if name in BOOL_PARAMS else x.astype(np.float32))
            )
        if "jitter_order" in p:
            v["jitter_order"] = p["jitter_order"].reshape(b * n, -1).numpy().astype(np.int8)
        feats = {**pair_metrics(p, pairs), **jitter_differences(p, pairs)}
        sel_pairs = torch.zeros(b, nump, dtype=torch.bool)
        sel_pairs[torch.arange(b), ch] = True
        loss = table.detach().float().cpu() if table is not None else torch.full((b, nump), float("nan"))
        q: dict[str, np.ndarray] = {
            "step": np.full(b * nump, step, np.int64),
            "micro": np.full(b * nump, micro, np.int16),
            "rank": np.full(b * nump, self.rank, np.int16),
            "sample": np.repeat(np.arange(b, dtype=np.int32), nump),
            "index": np.repeat(idx.numpy(), nump),
            "pair": np.tile(np.arange(nump, dtype=np.int8), b),
            "view_a": np.tile(pairs[:, 0].numpy().astype(np.int8), b),
            "view_b": np.tile(pairs[:, 1].numpy().astype(np.int8), b),
            "hvp": np.full(b * nump, choice is not None),
            "selected": sel_pairs.reshape(-1).numpy(),
            "loss": loss.reshape(-1).numpy().astype(np.float32),
        }
        for name in PAIR_FEATURES:
            q[name] = feats[name].reshape(-1).numpy().astype(np.float32)
        if self._first_step is None:
            self._first_step = step
        self._views.append(v)
        self._pairs.append(q)
        if len(self._views) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._views:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.out_dir.mkdir(parents=True, exist_ok=True)
        tag = f"r{self.rank}-s{self._first_step:09d}"
        for kind, rows in (("views", self._views), ("pairs", self._pairs)):
            cols: dict[str, Any] = {}
            for key in rows[0]:
                data = np.concatenate([r[key] for r in rows])
                if data.ndim == 2:  # jitter_order: a fixed-size list column
                    cols[key] = pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1)), data.shape[1])
                else:
                    cols[key] = pa.array(data)
            path = self.out_dir / f"{kind}-{tag}.parquet"
            pq.write_table(pa.table(cols), path, compression="zstd")
            self.files.append(path)
        self._views, self._pairs, self._first_step = [], [], None


class HardViewAnalysis(L.Callback):
    """See the module docstring. ``log_every_n_steps=None`` keeps only the online statistics."""

    def __init__(
        self,
        out_dir: Path | str,
        log_every_n_steps: int | None = None,
        online: bool = True,
        flush_every_n_logs: int = 20,
        csv_flush_every: int = 50,
    ) -> None:
        if log_every_n_steps is not None and int(log_every_n_steps) < 1:
            raise ValueError(f"analysis.log_every_n_steps={log_every_n_steps!r}: expected null or an integer >= 1")
        self.out_dir = Path(out_dir)
        self.log_every = None if log_every_n_steps is None else int(log_every_n_steps)
        self.online = online
        self.flush_every_n_logs = flush_every_n_logs
        self.csv_flush_every = max(1, int(csv_flush_every))
        self.view_log: ViewLog | None = None
        self._rows: list[tuple[int, int, int, bool, int, dict[str, torch.Tensor]]] = []
        self._step = self._micro = 0
        self._warned: set[str] = set()

    # --- Lightning hooks --------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.log_every is not None and self.view_log is None:
            self.view_log = ViewLog(self.out_dir, trainer.global_rank, self.flush_every_n_logs)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step = trainer.global_step  # the step the method sees (before the optimiser step)
        self._micro = batch_idx % max(1, int(getattr(trainer, "accumulate_grad_batches", 1) or 1))
        pl_module.last_selection = None  # a selection of this batch, if any, replaces it

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        params = batch.get("params") if isinstance(batch, dict) else None
        if not params or "crop_x" not in params:
            self._warn_once("noparams", "analysis: the batch carries no augmentation params; nothing to analyse")
            return
        n, pairs, reason = pair_table(pl_module, params)
        params = head_views(params, n)
        sel = getattr(pl_module, "last_selection", None)
        hvp_on = bool(getattr(getattr(pl_module, "hvp", None), "enabled", False))
        table = choice = None
        if sel is not None:
            table, choice = sel["table"], sel["choice"]
            if reason is None and table is not None and table.shape[1] != pairs.shape[0]:  # None: min_iou
                reason = f"the score table has {table.shape[1]} columns, not the {pairs.shape[0]} global pairs"
            if reason is not None:
                self._warn_once(reason, f"analysis: {reason}")
                return
        elif hvp_on and reason is not None:
            return
        if self.online:
            stats = step_statistics(params, table, choice, pairs)
            if sel is not None or not hvp_on:  # an HVP run's off-steps are not logged (recorded in CSV)
                b = int(params["crop_x"].shape[0])
                for k, v in stats.items():
                    pl_module.log(f"analysis/{k}", v, on_step=True, on_epoch=True, batch_size=b)
            self._rows.append(
                (self._step, self._micro, trainer.current_epoch, sel is not None, int(params["crop_x"].shape[0]), stats)
            )
            if len(self._rows) >= self.csv_flush_every:
                self._flush_csv(trainer.global_rank)
        if self.view_log is not None and self.log_every is not None and self._step % self.log_every == 0:
            index = batch.get("index")
            if index is None:
                index = torch.full((params["crop_x"].shape[0],), -1)
            self.view_log.add(self._step, torch.as_tensor(index), params, table, choice, self._micro, pairs)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Drop what an earlier session logged after the step this one starts from (0 for a
        fresh run): it was logged after the checkpoint, and this session logs it again."""
        drop_rows_from(self.out_dir / f"steps-r{trainer.global_rank}.csv", trainer.global_step)
        for part in self.out_dir.glob(f"*-r{trainer.global_rank}-s*.parquet"):
            if int(part.stem.rsplit("-s", 1)[1]) >= trainer.global_step:
                part.unlink()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        """What was logged up to a checkpoint reaches the disk with it: a kill after it loses nothing."""
        self._flush_all(trainer.global_rank)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._flush_all(trainer.global_rank)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._flush_all(trainer.global_rank)

    # --- output -----------------------------------------------------------------------------
    def _flush_all(self, rank: int) -> None:
        self._flush_csv(rank)
        if self.view_log is not None:
            self.view_log.flush()

    def _flush_csv(self, rank: int) -> None:
        """Append the buffered step rows (one host transfer for all of them)."""
        if not self._rows:
            return
        device = next(iter(self._rows[0][-1].values())).device
        nan = torch.tensor(float("nan"), device=device)
        values = (
            torch.stack(
                [torch.stack([s.get(k, nan).detach().float().to(device) for k in STAT_KEYS]) for *_, s in self._rows]
            )
            .cpu()
            .tolist()
        )
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"steps-r{rank}.csv"
        new = not path.exists()
        with path.open("a", newline="") as f:
            w = csv.writer(f)
            if new:
                w.writerow(["step", "micro", "epoch", "hvp", "samples", *STAT_KEYS])
            for (step, micro, epoch, hvp, samples, _), vals in zip(self._rows, values):
                w.writerow([step, micro, epoch, int(hvp), samples, *(f"{x:.7g}" for x in vals)])
        self._rows = []

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=2)


def drop_rows_from(path: Path, step: int) -> None:
    """Rewrite a ``step``-keyed CSV without its rows of ``step`` and later (atomically)."""
    if not path.is_file():
        return
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    kept = [r for r in rows[1:] if r and int(r[0]) < step]
    if len(kept) == len(rows) - 1:
        return
    text = io.StringIO(newline="")
    csv.writer(text).writerows(rows[:1] + kept)
    atomic_write_text(path, text.getvalue())


def analysis_callbacks(cfg: TrainConfig, run_dir: str | Path | RunDir) -> list[L.Callback]:
    """The callbacks ``training.driver.run`` adds for the config's ``analysis`` section."""
    a = cfg.analysis
    if not a.online and a.log_every_n_steps is None:
        return []
    return [HardViewAnalysis(RunDir.of(run_dir).analysis, a.log_every_n_steps, a.online, a.flush_every_n_logs)]
