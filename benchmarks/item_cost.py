"""Where a training item's CPU time goes in ``loader.py``'s two arms (a benchmark, not a test).

One thread, one process, thread CPU time per item (so other jobs on the machine slow it less than
wall time), in interleaved rounds over the same images: the ``reference`` arm's item
(``loader.ReferenceViews``: PIL decoding, torchvision's kernels per view), the pipeline's crops
(decode, parameters, crop and flip: ``MultiViewDataset``) and its colour part per image (what
``FinishedViews`` runs: ``finish_views``) with this tree's ``batched.py``; with ``--baseline`` also
another version of ``batched.py`` on the same crops (its views must be equal, checked first),
and the colour part with the hue and the blur taken out (what the rest of the colour step costs:
the floor of the pipeline if both were free).

    uv run python benchmarks/item_cost.py --baseline /tmp/old_batched.py -- --method simsiam --crop 224 --views 4

``git show REV:hvp_lightning/data/batched.py > /tmp/old_batched.py`` gives a baseline. Arguments
after ``--`` are ``loader.py``'s (``--override data.aug.blur_kind=torchvision9``, ...).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import loader  # noqa: E402

from hvp_lightning.data import batched  # noqa: E402
from hvp_lightning.data.datamodule import SSLDataModule  # noqa: E402
from hvp_lightning.data.datasets import load_image  # noqa: E402
from hvp_lightning.data.items import MultiViewDataset  # noqa: E402
from hvp_lightning.methods import METHODS  # noqa: E402


def load_batched(path: Path) -> ModuleType:
    """Another version of ``batched.py``, imported inside the package (its relative imports)."""
    spec = importlib.util.spec_from_file_location("hvp_lightning.data.baseline_batched", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def cpu_ms_per_item(items: int, f: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    start = time.thread_time()
    out = f(*args)
    return (time.thread_time() - start) * 1e3 / items, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, default=None, help="another batched.py to time on the same crops")
    p.add_argument("--items", type=int, default=48, help="items per round and arm")
    p.add_argument("--rounds", type=int, default=5)
    args, rest = p.parse_known_args()
    torch.set_num_threads(1)
    largs = loader.parse_args([a for a in rest if a != "--"] + ["--workers", "0"])
    root = largs.root or loader.make_jpeg_folder(loader.REPO / "benchmarks" / ".cache" / "jpeg", largs.images)
    cfg = loader.build_cfg(largs, root)
    augs = METHODS[cfg.method.name].view_augs(cfg)
    dm = SSLDataModule(cfg.data, augs, largs.batch_size, 0, cfg.seed, colour_in_workers=False)
    dm.setup("fit")
    raw = copy.copy(dm.train_raw)
    raw.loader = load_image  # type: ignore[attr-defined]  # PIL decoding, as loader.py's reference arm
    reference = MultiViewDataset(raw, loader.ReferenceViews(dm.views))  # type: ignore[arg-type]
    n = args.items
    if len(dm.train_set) < n * (args.rounds + 1):
        raise SystemExit(f"{len(dm.train_set)} training images, {n * (args.rounds + 1)} needed (--images)")

    def crops(start: int) -> list[dict]:
        return [dm.train_set[(0, i)] for i in range(start, start + n)]

    def references(start: int) -> list[dict]:
        return [reference[(0, i)] for i in range(start, start + n)]

    def colour(module: ModuleType, items: list[dict]) -> list[list[torch.Tensor]]:
        return [
            module.finish_views([v[None] for v in it["views"]], {k: v[None] for k, v in it["params"].items()}, augs)
            for it in items
        ]

    def hue_and_blur_free(items: list[dict]) -> list[list[torch.Tensor]]:
        """The colour part with no view blurred (sigma 0) and the hue an identity."""
        unblurred = [
            dict(it, params=dict(it["params"], blur_sigma=torch.zeros_like(it["params"]["blur_sigma"]))) for it in items
        ]
        ops, native_ops = batched.JITTER_OPS, batched.native_jitter_ops
        batched.JITTER_OPS = (*ops[:3], lambda x, shift: x)
        batched.native_jitter_ops = lambda native, npix: (*native_ops(native, npix)[:3], lambda x, shift: x)
        try:
            return colour(batched, unblurred)
        finally:
            batched.JITTER_OPS, batched.native_jitter_ops = ops, native_ops

    base = load_batched(args.baseline) if args.baseline else None
    first = crops(0)  # also warms every arm up
    references(0)
    if base is not None:
        equal = all(
            torch.equal(a, b) for x, y in zip(colour(batched, first), colour(base, first)) for a, b in zip(x, y)
        )
        print(f"views of this tree and {args.baseline}: {'bit-equal' if equal else 'DIFFERENT'} on {n} items")
    print(f"blur_kind {augs[0].blur_kind}; thread CPU ms per item of {len(augs)} views, one thread")
    rows: list[dict[str, float]] = []
    for r in range(args.rounds):
        start = n * (r + 1)
        row = {"reference": cpu_ms_per_item(n, references, start)[0]}
        row["crops"], items = cpu_ms_per_item(n, crops, start)
        row["colour"] = cpu_ms_per_item(n, colour, batched, items)[0]
        if base is not None:
            row["colour_baseline"] = cpu_ms_per_item(n, colour, base, items)[0]
        row["colour_hue_blur_free"] = cpu_ms_per_item(n, hue_and_blur_free, items)[0]
        rows.append(row)
        ratios = {k: row["reference"] / (row["crops"] + row[k]) for k in row if k.startswith("colour")}
        print(
            f"round {r + 1}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in row.items())
            + " | reference / pipeline: "
            + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()),
            flush=True,
        )
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    print("median: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()))


if __name__ == "__main__":
    main()
