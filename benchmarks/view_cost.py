"""What a training view costs, part by part (a benchmark, not a test). Three subcommands:

* ``item``: a training item's CPU time in ``loader.py``'s two arms, one thread, thread CPU time per
  item (other jobs on the machine slow it less than wall time), interleaved rounds over the same
  images: the ``reference`` arm's item (``loader.ReferenceViews``: PIL decoding, torchvision's
  kernels per view), the pipeline's crops (decode, parameters, crop and flip: ``MultiViewDataset``),
  its colour part per image (``finish_views``) with this tree's ``batched.py``, the colour part with
  the hue and the blur taken out (the floor if both were free) and, with ``--baseline FILE``, another
  version of ``batched.py`` on the same crops (its views checked bit-equal first). Other options are
  ``loader.py``'s (``--method``, ``--crop``, ``--views``, ``--override data.aug.blur_kind=...``).
* ``blur``: one view's blur and hue on the CPU, one thread, thread CPU ms per call, per sigma: PIL
  itself with the tensor conversions, PIL's box passes in int32 torch ops (``pil_blur_view``, the
  path without a C compiler), the C kernel (:mod:`hvp_lightning.data.cpu_kernels`, the per-view
  path), the batched ``pil_blur``, SimCLR's trimmed 23 px kernel; the 9 px blur by ``conv2d`` as
  torchvision calls it and by the C kernel; the hue in torch ops and in C.
* ``batch``: the batched colour step as it runs on an accelerator (``colour(..., sync_free=True)``)
  and the blur alone as that step calls it, per blur kind and batch shape (views x side; SimSiam's
  128 images x 4 candidates at 224 px and DINO's 64 x 16 local crops at 96 px by default), device
  times (the clock starts and stops after a ``synchronize``), the kinds alternated within each
  round; with ``--baseline FILE`` also that ``batched.py``'s colour step on the same views (the
  colour step that ran every op on every view: ``git show 0cfef3a^:hvp_lightning/data/batched.py``). The GPU
  session's ``blur`` stage.

    uv run python benchmarks/view_cost.py item --method simsiam --crop 224 --views 4 --baseline /tmp/old_batched.py
    uv run python benchmarks/view_cost.py blur
    python3 benchmarks/view_cost.py batch --device cuda --out results.md

``git show REV:hvp_lightning/data/batched.py > /tmp/old_batched.py`` gives a baseline for ``item`` and ``batch``.
Each prints a markdown section (date, machine, command, table); ``--out FILE`` appends it there.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as dt
import importlib.util
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loader  # noqa: E402  (benchmarks/loader.py; it puts the repository on sys.path)

from hvp_lightning.data import batched, cpu_kernels  # noqa: E402
from hvp_lightning.data.augment import UNIFORMS, ViewAug, draw_params, pil_gaussian_blur  # noqa: E402
from hvp_lightning.data.datamodule import SSLDataModule  # noqa: E402
from hvp_lightning.data.datasets import load_image  # noqa: E402
from hvp_lightning.data.items import MultiViewDataset  # noqa: E402
from hvp_lightning.training.build import run_view_augs  # noqa: E402

BLUR_KINDS = ("pil", "torchvision9", "simclr")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """This script's options; for ``item`` also ``loader.py``'s, as ``args.loader``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="part", required=True)
    item = sub.add_parser("item", help="a training item's CPU time in loader.py's two arms")
    item.add_argument("--baseline", type=Path, default=None, help="another batched.py to time on the same crops")
    item.add_argument("--items", type=int, default=48, help="items per round and arm")
    item.add_argument("--rounds", type=int, default=5)
    blur = sub.add_parser("blur", help="one view's blur and hue on the CPU")
    blur.add_argument("--size", type=int, default=224, help="side of the view")
    blur.add_argument("--sigmas", type=float, nargs="+", default=[0.1, 0.5, 1.0, 1.5, 2.0])
    blur.add_argument("--calls", type=int, default=100, help="timed calls per arm (after one warm-up call)")
    batch = sub.add_parser("batch", help="the batched colour step and its blur per batch on a device")
    batch.add_argument("--device", default="cuda")
    batch.add_argument("--shapes", nargs="+", default=["512x224", "1024x96"], help="views x side, e.g. 512x224")
    batch.add_argument("--rounds", type=int, default=5)
    batch.add_argument("--calls", type=int, default=10, help="timed calls per arm and round")
    batch.add_argument(
        "--baseline", type=Path, default=None, help="another batched.py whose colour step is timed beside this one's"
    )
    for s in (item, blur, batch):
        s.add_argument("--out", type=Path, default=None, help="append the markdown section to this file")
    args, rest = p.parse_known_args(argv)
    if args.part == "item":  # one process, no loader workers
        args.loader = loader.parse_args([*(a for a in rest if a != "--"), "--workers", "0"])
    elif rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


def cpu_ms(f: Callable[[], object], calls: int) -> float:
    """Thread CPU ms per call, after one untimed call."""
    f()
    start = time.thread_time()
    for _ in range(calls):
        f()
    return (time.thread_time() - start) / calls * 1e3


# --- item ----------------------------------------------------------------------------------------


def load_batched(path: Path) -> ModuleType:
    """Another version of ``batched.py``, imported inside the package (its relative imports)."""
    spec = importlib.util.spec_from_file_location("hvp_lightning.data.baseline_batched", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # its dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def item_cost(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Notes and table rows: per round, thread CPU ms per item of each arm."""
    largs = args.loader
    root = largs.root or loader.make_jpeg_folder(loader.REPO / "benchmarks" / ".cache" / "jpeg", largs.images)
    cfg = loader.build_cfg(largs, root)
    augs = run_view_augs(cfg)
    dm = SSLDataModule(cfg.data, augs, largs.batch_size, 0, cfg.seed, colour_in_workers=False)
    dm.setup("fit")
    raw = copy.copy(dm.train_raw)
    raw.loader = load_image  # type: ignore[attr-defined]  # PIL decoding, as loader.py's reference arm
    reference = MultiViewDataset(raw, loader.ReferenceViews(dm.views))  # type: ignore[arg-type]
    n = args.items
    if len(dm.train_set) < n * (args.rounds + 1):
        raise SystemExit(f"{len(dm.train_set)} training images, {n * (args.rounds + 1)} needed (--images)")

    def timed(f: Callable[..., Any], *a: Any) -> tuple[float, Any]:
        start = time.thread_time()
        out = f(*a)
        return (time.thread_time() - start) * 1e3 / n, out

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
    notes = [f"blur_kind {augs[0].blur_kind}; thread CPU ms per item of {len(augs)} views, one thread, {n} items"]
    if base is not None:
        equal = all(
            torch.equal(a, b) for x, y in zip(colour(batched, first), colour(base, first)) for a, b in zip(x, y)
        )
        notes.append(f"views of this tree and {args.baseline}: {'bit-equal' if equal else 'DIFFERENT'} on {n} items")
    rows: list[dict[str, float]] = []
    for r in range(args.rounds):
        start = n * (r + 1)
        row = {"reference": timed(references, start)[0]}
        row["crops"], items = timed(crops, start)
        row["colour"] = timed(colour, batched, items)[0]
        if base is not None:
            row["colour_baseline"] = timed(colour, base, items)[0]
        row["colour_hue_blur_free"] = timed(hue_and_blur_free, items)[0]
        rows.append(row)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    arms = list(rows[0])
    table = ["| arm | " + " | ".join(f"round {r + 1}" for r in range(len(rows))) + " | median |"]
    table.append("|---|" + "---|" * (len(rows) + 1))
    for arm in arms:
        values = [row[arm] for row in rows]
        table.append(f"| {arm} | " + " | ".join(f"{v:.1f}" for v in values) + f" | {statistics.median(values):.1f} |")
    for arm in (a for a in arms if a.startswith("colour")):  # reference / (crops + that colour part)
        ratios = [row["reference"] / (row["crops"] + row[arm]) for row in rows]
        table.append(
            f"| reference / (crops + {arm}) | "
            + " | ".join(f"{v:.2f}x" for v in ratios)
            + f" | {statistics.median(ratios):.2f}x |"
        )
    return notes, table


# --- blur ----------------------------------------------------------------------------------------


def blur_cost(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Notes and table rows: per sigma, thread CPU ms per call of each path (C: n/a without kernels)."""
    torch.set_num_threads(1)
    native = cpu_kernels.kernels()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (1, 3, args.size, args.size), generator=g, dtype=torch.uint8).float()

    def box(s: torch.Tensor) -> tuple[int, int, int]:
        r, ww, fw = batched.pil_box(s)
        return int(r[0]), int(ww[0]), int(fw[0])

    arms: dict[str, Callable[[float, torch.Tensor], Callable[[], object]] | None] = {
        "PIL itself + conversions": lambda sigma, s: (
            lambda: pil_gaussian_blur(x[0].to(torch.uint8), sigma)[None].float()
        ),
        "pil_blur_view (int32 torch ops)": lambda sigma, s: lambda: batched.pil_blur_view(x, *box(s)),
        "pil: C kernel": (lambda sigma, s: lambda: native.pil_blur(x, *box(s))) if native else None,
        "pil_blur (batched)": lambda sigma, s: lambda: batched.pil_blur(x, s, batched.pil_max_radius(2.0)),
        "SimCLR 23 px, trimmed": lambda sigma, s: lambda: batched.gaussian_blur(x, s, 23, trim=True),
        "9 px: conv2d (torchvision_blur)": lambda sigma, s: lambda: batched.torchvision_blur(x, s, 9),
        "9 px: C kernel": (
            lambda sigma, s: lambda: native.conv_reflect(x, batched.torchvision_weights(s, 9)[0]).round_()
        )
        if native
        else None,
    }
    table = ["| sigma | box r | " + " | ".join(arms) + " |", "|---|---|" + "---|" * len(arms)]
    for sigma in args.sigmas:
        s = torch.tensor([sigma])
        ms = [f"{cpu_ms(make(sigma, s), args.calls):.2f}" if make else "n/a" for make in arms.values()]
        table.append(f"| {sigma} | {box(s)[0]} | " + " | ".join(ms) + " |")
    shift = torch.tensor([0.1])
    hue_c = f"{cpu_ms(lambda: native.hue_(x.clone(), shift), args.calls):.2f} ms" if native else "n/a (no C kernels)"
    notes = [
        f"one {args.size} px view, one thread, thread CPU ms per call, mean of {args.calls} calls",
        f"hue: batched.hue (torch ops) {cpu_ms(lambda: batched.hue(x, shift), args.calls):.2f} ms, C kernel {hue_c}",
    ]
    return notes, table


# --- batch ---------------------------------------------------------------------------------------


def batch_arms(
    x: torch.Tensor, params: dict[str, torch.Tensor], aug: ViewAug, other: ModuleType | None
) -> dict[str, Callable[[], object]]:
    """The colour step as it runs on a device, ``other``'s colour step (another ``batched.py``) on
    the same views, and the blur as this tree's step calls it (every view, a sigma of 1 where the
    view draws no blur)."""
    sigma = torch.where(params["blur_sigma"] > 0, params["blur_sigma"], 1.0)
    xf = x.float()
    if aug.blur_kind == "pil":
        blur = lambda: batched.pil_blur(xf, sigma, batched.pil_max_radius(aug.blur_sigma[1]))  # noqa: E731
    else:
        blur = lambda: batched.gaussian_blur(xf, sigma, aug.blur_kernel)  # noqa: E731
    arms = {"colour step": lambda: batched.colour(x, params, aug, sync_free=True), "blur alone": blur}
    if other is not None:
        arms["baseline colour step"] = lambda: other.colour(x, params, aug, sync_free=True)
    return arms


def batch_cost(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Notes and table rows: per shape and blur kind, device ms of the colour step and of the blur."""
    device = torch.device(args.device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    other = load_batched(args.baseline) if args.baseline else None
    table = ["| views x side | blur kind | colour step ms | blur alone ms | blur share |", "|---|---|---|---|---|"]
    if other is not None:
        table = [
            "| views x side | blur kind | colour step ms | blur alone ms | blur share | baseline colour step ms "
            "| this / baseline |",
            "|---|---|---|---|---|---|---|",
        ]
    for shape in args.shapes:
        n, side = (int(v) for v in shape.split("x"))
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (n, 3, side, side), generator=g, dtype=torch.uint8).to(device)
        uniforms = torch.rand(n, UNIFORMS, generator=g, dtype=torch.float64).to(device)
        fns: dict[tuple[str, str], Callable[[], object]] = {}
        for kind in BLUR_KINDS:
            aug = dataclasses.replace(ViewAug(size=side), blur_kind=kind)
            for name, fn in batch_arms(x, draw_params(uniforms, side, side, aug), aug, other).items():
                fns[(kind, name)] = fn
        for fn in fns.values():  # warm-up: kernels loaded, allocator grown
            fn()
        times: dict[tuple[str, str], list[float]] = {k: [] for k in fns}
        for r in range(args.rounds):
            for key, fn in list(fns.items())[:: 1 if r % 2 == 0 else -1]:
                sync()
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                sync()
                times[key].append((time.perf_counter() - start) / args.calls * 1e3)
        for kind in BLUR_KINDS:
            step, blur = (statistics.median(times[(kind, arm)]) for arm in ("colour step", "blur alone"))
            row = f"| {shape} | {kind} | {step:.2f} | {blur:.2f} | {blur / step:.0%} |"
            if other is not None:
                base = statistics.median(times[(kind, "baseline colour step")])
                row += f" {base:.2f} | {step / base:.2f}x |"
            table.append(row)
            print(row, flush=True)  # a stage cut by its time limit keeps the rows measured before
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    notes = [f"device {device} ({name}), median of {args.rounds} rounds of {args.calls} calls"]
    if other is not None:
        notes.append(f"baseline: {args.baseline} (its `colour(..., sync_free=True)` on the same views)")
    return notes, table


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> str:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.part == "item":
        torch.set_num_threads(1)
        notes, table = item_cost(args)
    elif args.part == "blur":
        notes, table = blur_cost(args)
    else:
        notes, table = batch_cost(args)
    head = (
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, load average {os.getloadavg()[0]:.1f}"
    )
    cmd = "python benchmarks/view_cost.py " + " ".join(shlex.quote(a) for a in argv)
    text = f"{head}\n\n```bash\n{cmd}\n```\n\n" + "\n".join(notes) + "\n\n" + "\n".join(table) + "\n"
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(f"\n### view_cost.py {args.part}\n\n{text}")
    return text


if __name__ == "__main__":
    main()
