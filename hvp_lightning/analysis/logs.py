"""What :class:`~hvp_lightning.analysis.callback.HardViewAnalysis` wrote under
``<run_dir>/analysis/``, read back as numpy columns: ``steps-r*.csv`` (every step) and the
``views-*``/``pairs-*.parquet`` view log (every K-th step)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from ..run.directory import RunDir
from .callback import STAT_KEYS


def load_steps(run_dir: Path) -> dict[str, np.ndarray] | None:
    """Per-step statistics of all ranks and accumulation micro-batches, merged: a resumed run's
    repeated steps keep their last row; rows of one step are averaged weighted by their sample
    counts. None if never written."""
    files = sorted(RunDir.of(run_dir).analysis.glob("steps-r*.csv"))
    if not files:
        return None
    rows: dict[tuple[int, int, int], list[float]] = {}
    for rank, f in enumerate(files):
        with f.open() as fh:
            for r in csv.DictReader(fh):
                rows[(rank, int(r["step"]), int(r.get("micro") or 0))] = [
                    float(r["epoch"]),
                    float(r["hvp"]),
                    float(r["samples"]),
                    *(float(r[k]) for k in STAT_KEYS),
                ]
    if not rows:
        return None
    keys = np.array([k[1] for k in rows])
    vals = np.array(list(rows.values()), dtype=np.float64)
    steps, inv = np.unique(keys, return_inverse=True)
    w = vals[:, 2]
    out: dict[str, np.ndarray] = {"step": steps}
    out["epoch"] = np.bincount(inv, vals[:, 0] * w) / np.bincount(inv, w)
    out["hvp"] = np.bincount(inv, vals[:, 1]) > 0
    out["samples"] = np.bincount(inv, w)
    for i, k in enumerate(STAT_KEYS):
        out[k] = np.bincount(inv, vals[:, 3 + i] * w) / out["samples"]
    return out


def load_table(run_dir: Path, kind: str) -> dict[str, np.ndarray] | None:
    """All ``<kind>-*.parquet`` part files as numpy columns (None if there are none).
    Rows a resumed run wrote twice (same rank, step, micro-batch, sample, view/pair) keep the newest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(RunDir.of(run_dir).analysis.glob(f"{kind}-*.parquet"), key=lambda p: p.stat().st_mtime)
    if not files:
        return None
    table = pa.concat_tables([pq.read_table(f) for f in files])
    cols: dict[str, np.ndarray] = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type):
            cols[name] = col.values.to_numpy(zero_copy_only=False).reshape(len(col), col.type.list_size)
        else:
            cols[name] = col.to_numpy(zero_copy_only=False)
    sub = "view" if kind == "views" else "pair"
    micro = cols["micro"].astype(np.int64) if "micro" in cols else np.zeros(len(cols["step"]), np.int64)
    key = np.stack(
        [
            cols["rank"].astype(np.int64),
            cols["step"],
            micro,
            cols["sample"].astype(np.int64),
            cols[sub].astype(np.int64),
        ],
        1,
    )
    _, last = np.unique(key[::-1], axis=0, return_index=True)
    keep = np.sort(len(key) - 1 - last)
    return {k: v[keep] for k, v in cols.items()}
