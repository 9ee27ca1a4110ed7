"""Where a training step's time goes (a benchmark, not a test): the step of ``loader.py --step``,
built by loader.py's own builders (``build_cfg``, ``step_datamodule``, ``step_trainer``), timed
and profiled on ``--device``.

Each part is its own ``trainer.fit`` of ``--warmup`` + ``--batches`` batches on a fresh model:

1. **images/s**, four arms: ``hvp`` (the step as ``loader.py --step`` runs it: loader workers,
   colour on the device, HVP on when ``--views`` > 2), ``hvp_fixed_batch`` (the same step on one
   pre-made coloured batch kept on the device: the model alone, no loader, no colour),
   ``no_hvp`` and ``no_hvp_fixed_batch`` (the baseline, ``--views 2``). ``steps`` times batch
   ``warmup`` to the last batch's end; ``fit`` times to the fit's return, as ``loader.py --step``
   does (end-of-epoch work and teardown included).
2. **time split** of the ``hvp`` arm per step: host (perf_counter) and device (CUDA events) time
   between Lightning's hooks: forward (``training_step``, selection included), backward,
   clipping + optimiser, and "between steps" (the module's ``on_train_batch_end``: EMA teacher and
   centre; the next batch's fetch, transfer and colour); and the package's profiler ranges
   ``hvp/colour``, ``hvp/selection`` (selection pass, choice, gather), ``hvp/train_forward``
   (the training forward and loss), ``hvp/ema`` from the profile.
3. **profile** of the ``hvp`` arm's timed batches (``torch.profiler``, CPU and CUDA): the top ops
   by device time and by host time (``key_averages``).
4. **host syncs** (CUDA only) of the ``hvp`` arm's timed batches under
   ``torch.cuda.set_sync_debug_mode("warn")``: each warning's source line, counted.

Any ``loader.py`` option is taken (``--method``, ``--backbone``, ``--batch-size``, ``--views``,
``--override`` ...); ``--out FILE`` appends the report. The GPU stage (benchmarks/gpu_session.sh
``profile``), DINO ViT-S/16 HVP 4+16 crops bf16 as the GPU target's:

    python3 benchmarks/step_profile.py --method dino --backbone vit_small --batch-size 64 --crop 224 \\
        --views 4 --workers 14 --warmup 5 --batches 10 --device cuda --override trainer.precision=bf16-mixed

On the CPU, tiny (seconds; tests/test_benchmarks.py, slow):

    uv run python benchmarks/step_profile.py --method dino_cifar --data synthetic --images 64 --crop 16 \\
        --batch-size 8 --workers 0 --warmup 1 --batches 2 --backbone vit_tiny --override backbone.patch_size=8 \\
        backbone.img_size=16 backbone.depth=1 method.local_crop_size=8 method.out_dim=32
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import platform
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

import loader  # noqa: E402
from loader import (  # noqa: E402  (benchmarks/loader.py; it puts the repository on sys.path)
    REPO,
    StepClock,
    build_cfg,
    check_images,
    end_on_sigterm,
    make_jpeg_folder,
    step_datamodule,
    step_trainer,
)

from hvp_lightning.training.build import build_method  # noqa: E402

RANGES = ("hvp/colour", "hvp/selection", "hvp/train_forward", "hvp/ema")
# Hook boundaries of one step, in Lightning's order; a segment runs from its mark to the next.
SEGMENTS = {
    "batch_start": "forward (training_step, selection included)",
    "before_backward": "backward",
    "after_backward": "after backward, before the optimiser hook",
    "before_optimizer_step": "clipping + optimiser step",
    "batch_end": "between steps (EMA, centre, counters; next batch: fetch, transfer, colour)",
}


class StepSplit(L.Callback):
    """Host and device time between the step's hooks over the timed batches (``SEGMENTS``).
    Device marks are CUDA events recorded on the stream (no sync); on the CPU, host time only."""

    def __init__(self, warmup: int, device: torch.device) -> None:
        self.warmup, self.cuda = warmup, device.type == "cuda"
        self.marks: list[tuple[str, float, Any]] = []
        self.timing = False

    def mark(self, name: str) -> None:
        if self.timing:
            event = torch.cuda.Event(enable_timing=True) if self.cuda else None
            if event is not None:
                event.record()
            self.marks.append((name, time.perf_counter(), event))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.timing = batch_idx >= self.warmup
        self.mark("batch_start")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.mark("before_backward")

    def on_after_backward(self, trainer, pl_module) -> None:
        self.mark("after_backward")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.mark("before_optimizer_step")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.mark("batch_end")

    def split(self) -> dict[str, tuple[float, float | None]]:
        """Per segment: host ms and device ms per step (device None on the CPU)."""
        if self.cuda:
            torch.cuda.synchronize()
        host: dict[str, float] = collections.defaultdict(float)
        dev: dict[str, float] = collections.defaultdict(float)
        count: dict[str, int] = collections.Counter()
        for (name, t0, e0), (_, t1, e1) in zip(self.marks, self.marks[1:]):  # the last step's end: no next mark
            host[name] += (t1 - t0) * 1e3
            count[name] += 1
            if e0 is not None:
                dev[name] += e0.elapsed_time(e1)
        marks = [name for name in SEGMENTS if name in host]
        return {n: (host[n] / count[n], dev[n] / count[n] if self.cuda else None) for n in marks}


class Profiled(L.Callback):
    """``torch.profiler`` over the timed batches (CPU, and CUDA where there is one)."""

    def __init__(self, warmup: int, device: torch.device) -> None:
        self.warmup = warmup
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self.prof = profile(activities=acts)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            self.prof.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx + 1 == trainer.num_training_batches:
            self.prof.__exit__(None, None, None)


class SyncWarnings(L.Callback):
    """``torch.cuda.set_sync_debug_mode("warn")`` during the timed batches; the warnings are
    collected by the caller's ``warnings.catch_warnings(record=True)``."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            torch.cuda.set_sync_debug_mode("warn")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx + 1 == trainer.num_training_batches:
            torch.cuda.set_sync_debug_mode(0)


class FixedBatches:
    """One training batch, coloured on ``device`` as the step gets it, ``count`` times over: an
    iterable Lightning takes as its training loader (a list would be read as several loaders)."""

    def __init__(self, args: argparse.Namespace, cfg, device: torch.device, count: int) -> None:
        one = argparse.Namespace(**{**vars(args), "workers": 0})
        dm = step_datamodule(one, cfg, colour_in_workers=device.type == "cpu")  # colour as the step's
        batch = move_data_to_device(next(iter(dm.train_dataloader())), device)
        self.batch, self.count = dm.on_after_batch_transfer(batch, 0), count

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter([self.batch] * self.count)


def fit(
    args: argparse.Namespace, cfg, device: torch.device, fixed: bool, callbacks: list[L.Callback]
) -> dict[str, float]:
    """One fit of ``warmup + batches`` batches; images/s over the steps and to the fit's return."""
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    clock = StepClock(args.warmup, device)
    total = args.warmup + args.batches
    trainer = step_trainer(cfg, device, total, [clock, *callbacks])
    if fixed:
        data = FixedBatches(args, cfg, device, total)
        model = build_method(cfg)
        trainer.fit(model, train_dataloaders=data)
    else:
        dm = step_datamodule(args, cfg)
        check_images(args, dm)
        model = build_method(cfg)
        trainer.fit(model, datamodule=dm)
    if device.type == "cuda":
        torch.cuda.synchronize()
    done = time.perf_counter()
    return {"steps": clock.images / (clock.end - clock.start), "fit": clock.images / (done - clock.start)}


def top_ops(prof: profile, cuda: bool, rows: int) -> str:
    averages = prof.key_averages()
    parts = []
    keys = (["device_time_total"] if cuda else []) + ["cpu_time_total", "self_cpu_time_total"]
    for key in keys:
        try:
            table = averages.table(sort_by=key, row_limit=rows, max_name_column_width=60)
        except Exception as err:  # noqa: BLE001 -- a torch without this sort key: say so, keep the rest
            table = f"({key}: {type(err).__name__}: {err})"
        parts.append(f"By {key}:\n\n```\n{table}\n```")
    return "\n\n".join(parts)


def range_rows(prof: profile, steps: int) -> list[str]:
    """The package's profiler ranges: host and device ms per step. With CUDA activities a range is
    two entries of one name: the host's (its ops' kernel time as device time) and its mirror on the
    GPU timeline (no host time); the host's is read."""
    rows = []
    by_name = {e.key: e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU}
    for name in RANGES:
        e = by_name.get(name)
        if e is None:
            rows.append(f"| {name} | - | - | - |")
            continue
        device_ms = getattr(e, "device_time_total", 0.0) / 1e3 / steps
        rows.append(f"| {name} | {e.cpu_time_total / 1e3 / steps:.2f} | {device_ms:.2f} | {e.count} |")
    return rows


def sync_rows(records: list[warnings.WarningMessage], steps: int) -> list[str]:
    """Sync warnings by source line, most frequent first."""

    def where(w: warnings.WarningMessage) -> str:
        path = Path(w.filename).resolve()
        return f"{path.relative_to(REPO) if path.is_relative_to(REPO) else w.filename}:{w.lineno}"

    sites = collections.Counter(where(w) for w in records if "synchroniz" in str(w.message))
    rows = [f"| {site} | {n} | {n / steps:.2f} |" for site, n in sites.most_common()]
    return rows or ["| (none) | 0 | 0 |"]


class Report:
    """The report, printed and (``--out``) appended part by part: a later failure or the
    stage's time limit keeps what was measured before it."""

    def __init__(self, out: Path | None) -> None:
        self.out, self.parts = out, []
        if out:
            with out.open("a") as f:
                f.write("\n### step_profile.py\n\n")

    def add(self, *lines: str) -> None:
        text = "\n".join(lines) + "\n"
        self.parts.append(text)
        print(text, flush=True)
        if self.out:
            with self.out.open("a") as f:
                f.write(text)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This script's own options and ``loader.py``'s."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--top", type=int, default=25, help="rows of each op table")
    mine, rest = own.parse_known_args(argv)
    return mine, loader.parse_args(rest)


def main(argv: list[str] | None = None) -> str:
    argv = sys.argv[1:] if argv is None else argv
    mine, args = parse_args(argv)
    end_on_sigterm()  # the stage's `timeout` ends it, not only the fit in progress
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    root = args.root
    if args.data == "imagefolder" and root is None:
        root = make_jpeg_folder(REPO / "benchmarks" / ".cache" / "jpeg", args.images)
    cfg = build_cfg(args, root)
    base_args = argparse.Namespace(**{**vars(args), "views": 2})
    base_cfg = build_cfg(base_args, root)
    report = Report(args.out)
    report.add(
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, device {device}"
        f"{f' ({torch.cuda.get_device_name(device)})' if cuda else ''}, torch {torch.__version__}, "
        f"{args.batches} timed batches after {args.warmup}",
        "",
        "```bash\npython benchmarks/step_profile.py " + " ".join(shlex.quote(a) for a in argv) + "\n```",
    )
    split = StepSplit(args.warmup, device)  # in the hvp arm's own fit: events cost next to nothing
    rates: dict[str, dict[str, float]] = {}
    for name, (a, c, fixed, callbacks) in {
        "hvp": (args, cfg, False, [split]),
        "hvp_fixed_batch": (args, cfg, True, []),
        "no_hvp": (base_args, base_cfg, False, []),
        "no_hvp_fixed_batch": (base_args, base_cfg, True, []),
    }.items():
        rates[name] = fit(a, c, device, fixed, callbacks)
    report.add(
        "| arm | images/s (steps) | images/s (to fit's return) |",
        "|---|---|---|",
        *(f"| {k} | {v['steps']:.1f} | {v['fit']:.1f} |" for k, v in rates.items()),
    )
    profiled = Profiled(args.warmup, device)
    fit(args, cfg, device, False, [profiled])
    report.add(
        "Split of the hvp arm, per step (between Lightning's hooks):",
        "",
        "| segment | host ms | device ms |",
        "|---|---|---|",
        *(
            f"| {SEGMENTS[k]} | {host:.2f} | {'n/a' if dev is None else f'{dev:.2f}'} |"
            for k, (host, dev) in split.split().items()
        ),
        "",
        "Profiler ranges of the hvp arm, per step (a fit of its own, profiled):",
        "",
        "| range | host ms | device ms | calls |",
        "|---|---|---|---|",
        *range_rows(profiled.prof, args.batches),
    )
    report.add("Top ops of the hvp arm's timed batches:", "", top_ops(profiled.prof, cuda, mine.top))
    if cuda:
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            fit(args, cfg, device, False, [SyncWarnings(args.warmup)])
        report.add(
            "Host syncs of the hvp arm (set_sync_debug_mode warnings by source line):",
            "",
            "| source line | warnings | per step |",
            "|---|---|---|",
            *sync_rows(records, args.batches),
        )
    else:
        report.add("Host syncs: n/a on the CPU (tests/test_host_syncs.py counts them on a stand-in device)")
    print(f"images/s: {rates['hvp']['steps']:.1f}")
    return "".join(report.parts)


if __name__ == "__main__":
    main()
