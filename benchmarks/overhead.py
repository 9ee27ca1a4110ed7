"""HVP step-time overhead, measured by hand (a benchmark, not a test).

Builds the baseline (HVP off) and the HVP model (``+hvp=on``) of one method from the real
Hydra config, with the same initial weights, and times full training steps
(``training_step`` + backward + optimiser step) alternately in one process -- baseline,
HVP, baseline, HVP, ... -- so that machine noise hits both alike. Each round also times the
no-grad forwards that make up the selection pass, from which the compute bound follows
(docs/DESIGN.md, "Overhead"):

* SimSiam/SimCLR: ``bound = (baseline_step + N * F) / baseline_step`` with ``F`` the no-grad
  forward of one candidate batch of B through backbone + heads; plus per-view (N forwards
  of B, what the selection does) vs stacked (one forward of N*B) selection forwards.
  VICReg/Barlow Twins (batch-statistics losses): also the leave-one-out table alone.
* DINO: the selection forwards G global candidates through teacher and student (in pairs)
  and Lc local candidates through the student (in groups of L); with teacher reuse the
  training step skips its own teacher forward of the 2 chosen globals. iBOT: the same with
  token forwards (masked student globals) and its L ordinary locals (Lc = L).

``--variant NAME:KEY=VALUE[,KEY=VALUE...]`` adds more HVP models to the same rounds, e.g. the
cheaper selections (``scale50:hvp.selection_scale=0.5``, ``min_iou:hvp.mode=min_iou``): each one's
step against the baseline's and against HVP's, paired by round. Every model's FLOPs per image
(``hvp_lightning/training/cost.py``, what a run's summary.json reports) are in the table too, with
its images/s (batch over median step: the step alone, no loader or teardown), the FLOP/s that
makes, on a GPU the model FLOP utilisation against the device's dense peak at ``--precision``
(``hvp_lightning.run.perf.peak_flops``, as a run's ``perf/mfu``), and each HVP model's step-time
ratio over its FLOPs ratio (1: the step's time follows its FLOPs; the GPU target is HVP within 10%).

``--precision`` imitates ``trainer.precision``: the forward (``training_step``, selection
included) under the autocast Lightning uses, backward outside it, and for ``16-mixed`` a
GradScaler (scaled backward, ``unscale_`` before DINO's clipping, ``scaler.step``/``update``),
as Lightning's MixedPrecision plugin does. On CUDA each variant's peak memory is reported
(``torch.cuda.max_memory_allocated``, reset before each of its steps).

Run from the repository root, e.g.::

    uv run python benchmarks/overhead.py --method simsiam --backbone resnet18_cifar \
        --width 64 --batch-size 256 --num-views 4 --iters 10 --warmup 2 --threads 2
    python benchmarks/overhead.py --method simsiam --preset simsiam --backbone resnet50 --crop 224 \
        --batch-size 64 --device cuda --precision bf16-mixed
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import shlex
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvp_lightning.data.augment import PARAM_NAMES  # noqa: E402
from hvp_lightning.methods import SSLMethod, method_class  # noqa: E402
from hvp_lightning.methods.dino import DINO  # noqa: E402
from hvp_lightning.nn.teacher import ema_update  # noqa: E402
from hvp_lightning.run.perf import compute_dtype, peak_flops  # noqa: E402
from hvp_lightning.schema import PRECISIONS, TrainConfig, train_settings  # noqa: E402
from hvp_lightning.selection import STEP_DTYPES, frozen_state, step_autocast_dtype  # noqa: E402
from hvp_lightning.settings import method_names  # noqa: E402
from hvp_lightning.training.build import build_method, run_view_augs  # noqa: E402
from hvp_lightning.training.cost import count_step_flops  # noqa: E402

Batch = dict[str, Any]


# --- configuration and models --------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--method", choices=sorted(method_names()), default="simsiam")
    p.add_argument(
        "--preset", default=None, help="conf/method file (default: <method>_cifar if it exists, else <method>)"
    )
    p.add_argument("--backbone", default="resnet18_cifar", help="conf/backbone preset")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--crop", type=int, default=32, help="data.crop_size (DINO/iBOT: global crops)")
    p.add_argument("--local-crop", type=int, default=None, help="DINO/iBOT: method.local_crop_size")
    p.add_argument("--width", type=int, default=None, help="backbone.width (ResNets only)")
    p.add_argument("--num-views", type=int, default=4, help="hvp.num_views (N)")
    p.add_argument("--iters", type=int, default=10, help="timed rounds (one baseline + one HVP step each)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--precision",
        choices=list(STEP_DTYPES),
        default="32-true",
        help="trainer.precision to imitate: autocast around the forward (16-mixed: + GradScaler)",
    )
    p.add_argument("--selection-precision", choices=PRECISIONS, default="auto", help="hvp.selection_precision")
    p.add_argument("--max-combinations", type=int, default=None, help="DINO: hvp.max_combinations=K (iBOT rejects it)")
    p.add_argument(
        "--no-teacher-reuse", action="store_true", help="DINO/iBOT: method.teacher_reuse=false for the HVP model"
    )
    p.add_argument(
        "--compare-reuse",
        action="store_true",
        help="DINO/iBOT: also time an HVP model without teacher reuse in the same rounds",
    )
    p.add_argument(
        "--variant",
        nargs="*",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE]",
        help="more HVP models, timed in the same rounds: the HVP model with these overrides, e.g. "
        "scale50:hvp.selection_scale=0.5 min_iou:hvp.mode=min_iou",
    )
    p.add_argument("--no-extras", action="store_true", help="skip the per-round no-grad forward timings")
    p.add_argument(
        "--override",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra overrides for both models, e.g. backbone.patch_size=4",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="append a markdown section to this file")
    args = p.parse_args(argv)
    args.variants = {}
    for v in args.variant:
        name, _, keys = v.partition(":")
        if not name.isidentifier() or name in ("baseline", "hvp", "hvp_noreuse") or name in args.variants or not keys:
            p.error(f"--variant {v!r}: NAME:KEY=VALUE[,KEY=VALUE...] with a new name (a Python identifier)")
        args.variants[name] = keys.split(",")
    if not issubclass(method_class(args.method), DINO) and (
        args.max_combinations or args.no_teacher_reuse or args.compare_reuse
    ):
        p.error("--max-combinations / --no-teacher-reuse / --compare-reuse are DINO/iBOT options")
    if args.iters < 1 or args.warmup < 0 or args.num_views < 2:
        p.error("need --iters >= 1, --warmup >= 0, --num-views >= 2")
    if args.precision == "16-mixed" and torch.device(args.device).type == "cpu":
        p.error("--precision 16-mixed needs a GPU (--device cuda): train.py refuses it on CPU too")
    return args


def method_preset(args: argparse.Namespace) -> str:
    if args.preset:
        return args.preset
    cifar = f"{args.method}_cifar"
    return cifar if (REPO / "conf" / "method" / f"{cifar}.yaml").exists() else args.method


def compose_cfg(
    args: argparse.Namespace, hvp: bool, teacher_reuse: bool = True, extra: list[str] | None = None
) -> TrainConfig:
    """The real config (conf/ via Hydra, as tests/conftest.py) with this run's overrides, validated."""
    preset = method_preset(args)
    ov = [
        f"method={preset}",
        f"backbone={args.backbone}",
        "data=synthetic",
        "logger=csv",
        f"method.batch_size={args.batch_size}",
        f"data.crop_size={args.crop}",
        f"seed={args.seed}",
        # the device and precision the steps run on: DINO/iBOT's teacher reuse, and so the counted FLOPs, follow them
        f"trainer.accelerator={'cpu' if torch.device(args.device).type == 'cpu' else 'gpu'}",
        f"trainer.precision={args.precision}",
    ]
    if args.width is not None:
        ov.append(f"backbone.width={args.width}")
    if args.local_crop is not None:
        ov.append(f"method.local_crop_size={args.local_crop}")
    ov += args.override
    if issubclass(method_class(args.method), DINO) and not teacher_reuse:
        ov.append("method.teacher_reuse=false")
    if hvp:
        ov += ["+hvp=on", f"hvp.num_views={args.num_views}", f"hvp.selection_precision={args.selection_precision}"]
        if args.max_combinations is not None:
            ov.append(f"hvp.max_combinations={args.max_combinations}")
        ov += extra or []
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return train_settings(compose("config", overrides=ov))


@dataclass
class Runner:
    """One model with its optimiser, its batch format and per-phase timings of its steps."""

    name: str
    model: SSLMethod
    cfg: TrainConfig
    device: torch.device
    precision: str = "32-true"
    opt: torch.optim.Optimizer = field(init=False)
    times: dict[str, list[float]] = field(default_factory=dict)
    peak_mem: list[tuple[int, int]] = field(default_factory=list)  # (peak, resident at start) per step, bytes

    def __post_init__(self) -> None:
        self.model.to(self.device).train()
        self.amp_dtype = step_autocast_dtype(self.precision)
        # 16-mixed: loss scaling, as Lightning's MixedPrecision plugin (bf16 needs none)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == "16-mixed" else None
        self.model.log = lambda *a, **k: None  # type: ignore[method-assign]  # no Trainer attached
        # Plain SGD for every method: the optimiser costs the same with and without HVP.
        self.opt = torch.optim.SGD(self.model.param_groups(), lr=1e-3, momentum=0.9, weight_decay=1e-4)
        self.view_sizes = [a.size for a in run_view_augs(self.cfg)]
        self._phase: dict[str, float] = {}
        if self.model.hvp.enabled:  # time the selection (pass, choice, gather) inside the real HVP step
            self.model.selection_phase = self.timed_selection  # type: ignore[method-assign]

    @contextmanager
    def timed_selection(self) -> Iterator[None]:
        """The mixin's selection phase (what a run's ``perf/selection_share`` times), timed."""
        t0 = now(self.device)
        yield
        self._phase["select"] = now(self.device) - t0

    def autocast(self) -> AbstractContextManager:
        """The forward's autocast under ``--precision`` (as Lightning wraps ``training_step``)."""
        return torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)

    def batch(self, gen: torch.Generator) -> Batch:
        """Random batch in the loader's format: ``views`` (one ``[B,3,S,S]`` per view),
        ``params`` (``[B, V]`` per scalar, ``[B, V, 4]`` jitter order), ``label``, ``index``.
        Drawn on the device by ``gen`` (one of its own): on the host, one thread, SimSiam R50's
        rounds at 224 px drew ~0.4 G floats each, about a second a round (not timed, but it halves
        the rounds a GPU stage's time limit allows)."""
        b, v, dev = int(self.cfg.method.batch_size), len(self.view_sizes), self.device
        views = [torch.randn(b, 3, s, s, generator=gen, device=dev) for s in self.view_sizes]
        params = {k: torch.rand(b, v, generator=gen, device=dev) for k in PARAM_NAMES}
        params["jitter_order"] = torch.rand(b, v, 4, generator=gen, device=dev).argsort(-1)  # a permutation each
        return {
            "views": views,
            "params": params,
            "label": torch.randint(10, (b,), generator=gen, device=dev),
            "index": torch.arange(b, device=dev),
        }

    def step(self, batch: Batch) -> None:
        """One full training step, timed by phase: ``training_step`` (HVP: selection pass
        split out), backward, optimiser (DINO: + per-parameter clipping and EMA teacher)."""
        m, dev, scaler = self.model, self.device, self.scaler
        self._phase.clear()
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
            resident = torch.cuda.memory_allocated(dev)
        t0 = now(dev)
        with self.autocast():
            loss = m.training_step(batch, 0)
        t1 = now(dev)
        (scaler.scale(loss) if scaler else loss).backward()
        t2 = now(dev)
        if scaler:
            scaler.unscale_(self.opt)  # clipping sees true gradients, as under Lightning
        if hasattr(m, "clip_and_freeze_gradients"):
            m.clip_and_freeze_gradients()  # type: ignore[operator]
        if scaler:
            scaler.step(self.opt)
            scaler.update()
        else:
            self.opt.step()
        if hasattr(m, "teacher"):
            ema_update(m.teacher.backbone, m.backbone, 0.996)  # type: ignore[union-attr,arg-type]
            ema_update(m.teacher.head, m.head, 0.996)  # type: ignore[union-attr,arg-type]
        t3 = now(dev)
        # Gradients freed here, not at the next step: the other variants' steps then see
        # only this model's weights and optimiser state resident.
        self.opt.zero_grad(set_to_none=True)
        if cuda:
            self.peak_mem.append((torch.cuda.max_memory_allocated(dev), resident))
        sel = self._phase.get("select", 0.0)
        rec = {"step": t3 - t0, "train_fwd": t1 - t0 - sel, "backward": t2 - t1, "optimizer": t3 - t2}
        if m.hvp.enabled:
            rec["select"] = sel
        if not math.isfinite(float(loss.detach())):
            raise FloatingPointError(f"{self.name}: loss {float(loss.detach())}")
        for k, v in rec.items():
            self.times.setdefault(k, []).append(v)


def now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def timed(device: torch.device, fn: Callable[[], Any]) -> float:
    t0 = now(device)
    fn()
    return now(device) - t0


# --- per-round no-grad forwards ------------------------------------------------------------


def pair_extras(r: Runner, hvp_batch: Batch, n: int) -> dict[str, float]:
    """SimSiam/SimCLR: F (one view batch of B), N per-view forwards, one stacked N*B forward."""
    m, dev, views = r.model, r.device, hvp_batch["views"]
    fwd = m.forward_view  # type: ignore[attr-defined]
    with frozen_state(m, dev), r.autocast():
        f = timed(dev, lambda: fwd(views[0]))
        per_view = timed(dev, lambda: [fwd(v) for v in views])
        stacked = timed(dev, lambda: fwd(torch.cat(views)))
        out = {
            "F (1 view, no grad)": f,
            f"select fwd: {n} x B per view": per_view,
            f"select fwd: 1 x {n}B stacked": stacked,
        }
        if hasattr(m, "pair_table"):  # VICReg/Barlow Twins: the leave-one-out table alone, after the forwards
            z = torch.stack([fwd(v) for v in views])
            out["select table: leave-one-out [B, C]"] = timed(dev, lambda: m.pair_table(z, (z[0], z[1]), 0))
    return out


def multicrop_extras(r: Runner, hvp_batch: Batch, g: int) -> dict[str, float]:
    """DINO/iBOT: the selection's forward groups, each once: teacher / student on 2 globals,
    student on L locals (DINO: one chunk of its Lc local candidates; iBOT: its L locals).
    iBOT's globals go through the token forward (CLS + patch logits), the student's masked."""
    m, dev, views = r.model, r.device, hvp_batch["views"]
    n_loc = m.num_local  # type: ignore[attr-defined]
    glob, loc = list(views[:2]), list(views[g : g + n_loc])
    t_mod, s_mod = (m.teacher.backbone, m.teacher.head), (m.backbone, m.head)  # type: ignore[union-attr]
    if hasattr(m, "make_masks"):  # iBOT
        masks = m.make_masks(hvp_batch)[:2]  # type: ignore[operator]
        teacher_fwd = lambda: m._token_forward(*t_mod, glob)  # type: ignore[operator]  # noqa: E731
        student_fwd = lambda: m._token_forward(*s_mod, glob, masks)  # type: ignore[operator]  # noqa: E731
    else:
        teacher_fwd = lambda: m._forward(*t_mod, glob, 2)  # type: ignore[operator]  # noqa: E731
        student_fwd = lambda: m._forward(*s_mod, glob, 2)  # type: ignore[operator]  # noqa: E731
    out: dict[str, float] = {}
    with frozen_state(m, dev), r.autocast():
        out["T2g: teacher fwd, 2 globals"] = timed(dev, teacher_fwd)
        out["S2g: student fwd, 2 globals"] = timed(dev, student_fwd)
        if n_loc:
            out["SL: student fwd, L locals"] = timed(dev, lambda: m._forward(*s_mod, loc, n_loc))  # type: ignore[operator]
    return out


# --- statistics and reporting --------------------------------------------------------------


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float]) -> str:
    """Min and interquartile range (min is the least contention-sensitive statistic)."""
    if len(xs) < 4:
        return f"{min(xs):.3f} / {min(xs):.3f}-{max(xs):.3f}"
    q = statistics.quantiles(xs, n=4)
    return f"{min(xs):.3f} / {q[0]:.3f}-{q[2]:.3f}"


def machine_info(device: torch.device) -> list[tuple[str, str]]:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "?"
    info = [
        ("nproc", f"{len(os.sched_getaffinity(0))} (os.cpu_count {os.cpu_count()})"),
        ("CPU", cpu),
        ("torch", torch.__version__),
        ("torch threads", str(torch.get_num_threads())),
        ("python", platform.python_version()),
    ]
    if device.type == "cuda":
        info.append(("GPU", torch.cuda.get_device_name(device)))
    try:
        info.append(("load avg (1/5/15 min)", " ".join(f"{x:.2f}" for x in os.getloadavg())))
    except OSError:
        pass
    return info


def render(rows: list[tuple[str, str, str, str]], markdown: bool) -> str:
    head = ("quantity", "median", "min / IQR", "note")
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    w = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    fmt = lambda r: f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]}"  # noqa: E731
    return "\n".join([fmt(head), "-" * (sum(w) + 6 + 30), *map(fmt, rows)])


# --- main --------------------------------------------------------------------------------


SIGTERM_STOP = "stopped by SIGTERM"  # the one early end of the rounds that is no failure


def rounds(
    args: argparse.Namespace, runners: list[Runner], is_dino: bool
) -> tuple[dict[str, list[float]], int, str | None]:
    """The warm-up and timed rounds, every model's step in each: the selection's no-grad forwards
    per timed round (``extras``), how many rounds were timed, and what ended them early, if anything:
    a SIGTERM (``timeout``, a scheduler) ends them after the current round; a non-finite loss ends
    them at once, the unfinished round dropped. Either way the finished rounds are reported (a GPU
    stage's minutes are scarce)."""
    base, hvps, n = runners[0], runners[1:], args.num_views
    stop: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    gen = torch.Generator(base.device).manual_seed(args.seed)
    extras: dict[str, list[float]] = {}
    n_timed, failure = 0, None
    try:
        for it in range(args.warmup + args.iters):
            if stop:
                print(f"SIGTERM: the rounds end after {n_timed} of {args.iters} timed", flush=True)
                break
            hvp_batch = None
            try:
                for r in runners:  # A, B(, C) -- interleaved every round
                    batch = r.batch(gen)
                    hvp_batch = batch if r is hvps[0] else hvp_batch
                    r.step(batch)
            except FloatingPointError as err:
                where = f"warm-up round {it + 1}" if it < args.warmup else f"timed round {it - args.warmup + 1}"
                failure = f"{err} in {where}"
                print(f"{failure}: the rounds end after {n_timed} of {args.iters} timed", flush=True)
                for r in runners:  # the models stepped in the unfinished round keep only whole rounds
                    for xs in r.times.values():
                        del xs[n_timed:]
                break
            ex: dict[str, float] = {}
            if not args.no_extras:  # the selection's no-grad forwards, timed on the baseline model
                ex = (
                    multicrop_extras(base, hvp_batch, hvps[0].model.num_globals)  # type: ignore[arg-type,attr-defined]
                    if is_dino
                    else pair_extras(base, hvp_batch, n)  # type: ignore[arg-type]
                )
            if it < args.warmup:
                for r in runners:
                    r.times.clear()
                continue
            for k, v in ex.items():
                extras.setdefault(k, []).append(v)
            n_timed += 1
            print(
                f"round {n_timed}/{args.iters}: " + "  ".join(f"{r.name} {r.times['step'][-1]:.3f}s" for r in runners),
                flush=True,
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
    return extras, n_timed, failure or (SIGTERM_STOP if stop else None)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    n, b = args.num_views, args.batch_size

    torch.manual_seed(args.seed)
    base_cfg = compose_cfg(args, hvp=False)
    variants: list[tuple[str, TrainConfig]] = [
        ("baseline", base_cfg),
        ("hvp", compose_cfg(args, True, not args.no_teacher_reuse)),
    ]
    if args.compare_reuse:
        variants.append(("hvp_noreuse", compose_cfg(args, True, teacher_reuse=False)))
    for name, keys in args.variants.items():
        variants.append((name, compose_cfg(args, True, not args.no_teacher_reuse, keys)))
    runners: list[Runner] = []
    for name, cfg in variants:
        model = build_method(cfg)
        if runners:  # same initial weights for every variant
            model.load_state_dict(runners[0].model.state_dict())
        runners.append(Runner(name, model, cfg, device, args.precision))
    base, hvps = runners[0], runners[1:]
    is_dino = isinstance(base.model, DINO)  # DINO or iBOT (multi-crop, EMA teacher)

    notes = [
        f"method={args.method} preset={method_preset(args)} backbone={args.backbone} "
        f"B={b} crop={args.crop} N={n} device={device} precision={args.precision} "
        f"selection_precision={args.selection_precision}"
    ]
    if is_dino:
        g, lc = hvps[0].model.num_globals, hvps[0].model.num_locals_cand  # type: ignore[attr-defined]
        n_loc = base.model.num_local  # type: ignore[attr-defined]
        notes.append(
            f"{args.method} views: baseline 2 globals + {n_loc} locals ({base.view_sizes}); HVP {g} globals + "
            f"{lc} locals ({hvps[0].view_sizes}); max_combinations={args.max_combinations} "
            f"global_pairs={hvps[0].model.hvp.global_pairs}"
        )
        for r in hvps:
            h = r.model.hvp
            other_views = h.mode == "min_iou" or h.selection_scale != 1 or h.selection_fraction != 1
            notes.append(
                f"{r.name}: teacher_reuse={r.model.teacher_reuse}"  # type: ignore[attr-defined]
                + (" (not applied: no selection pass over the step's views)" if other_views else "")
            )
    print("\n".join(notes), flush=True)

    # Counted before the rounds, so that a stage cut by its time limit (SIGTERM) reports at once.
    flops = {r.name: count_step_flops(r.cfg) for r in runners}
    extras, n_timed, stopped = rounds(args, runners, is_dino)
    if not n_timed:
        raise SystemExit(f"no timed round finished: nothing to report{f' ({stopped})' if stopped else ''}")
    rows: list[tuple[str, str, str, str]] = []
    add = lambda q, xs, note="", fmt="{:.3f} s": rows.append((q, fmt.format(med(xs)), spread(xs), note))  # noqa: E731
    for r in runners:
        for k, xs in r.times.items():
            add(f"{r.name}: {k}", xs, "full step" if k == "step" else "")
    a_step = base.times["step"]
    for r in hvps:
        ratios = [h / a for h, a in zip(r.times["step"], a_step)]
        add(f"{r.name}/baseline step (paired)", ratios, "median of per-round ratios", "{:.3f}x")
        rows.append((f"{r.name}/baseline (ratio of medians)", f"{med(r.times['step']) / med(a_step):.3f}x", "", ""))
        if "select" in r.times:  # the selection pass against the ordinary training step, per round
            add(
                f"{r.name} select / baseline step (paired)",
                [s / a for s, a in zip(r.times["select"], a_step)],
                "median of per-round ratios",
                "{:.3f}x",
            )
        if r.name in args.variants:  # a cheaper selection against the full one, in the same rounds
            add(
                f"{r.name}/hvp step (paired)",
                [v / h for v, h in zip(r.times["step"], hvps[0].times["step"])],
                "median of per-round ratios",
                "{:.3f}x",
            )
    base_flops = flops[base.name].train
    peak = peak_flops(device, compute_dtype(args.precision))
    for r in runners:  # what a run of this config reports in summary.json cost (counted on the meta device)
        f = flops[r.name]
        per_image = f.train + f.selection
        rows.append(
            (
                f"{r.name}: model FLOPs/image",
                f"{per_image / 1e6:.1f} M",
                "",
                f"train {f.train / 1e6:.1f} M + selection {f.selection / 1e6:.1f} M; "
                f"{per_image / base_flops:.3f}x the baseline's",
            )
        )
        rate = b / med(r.times["step"])  # images/s of the step alone: no loader, no colour, no teardown
        achieved = per_image * rate
        mfu = f"; MFU {achieved / peak:.1%} of {peak / 1e12:.0f} TFLOP/s" if peak else ""
        rows.append((f"{r.name}: images/s", f"{rate:.1f}", "", f"B / median step; {achieved / 1e12:.3g} TFLOP/s{mfu}"))
        if r is not base:  # the step's time against its FLOPs (the target: within 10%)
            time_ratio = med([h / a for h, a in zip(r.times["step"], a_step)])
            rows.append(
                (
                    f"{r.name}: step-time ratio / FLOPs ratio",
                    f"{time_ratio / (per_image / base_flops):.3f}",
                    "",
                    "paired step ratio over the model FLOPs ratio: 1 = time follows FLOPs",
                )
            )
    for r in runners:
        if r.peak_mem:
            most, resident = max(r.peak_mem)
            rows.append(
                (
                    f"{r.name}: peak GPU memory",
                    f"{most / 2**20:.0f} MiB",
                    "",
                    f"max over steps; {resident / 2**20:.0f} MiB resident at step start (all variants' "
                    f"weights and optimiser states)",
                )
            )
        else:
            rows.append((f"{r.name}: peak GPU memory", "n/a", "", f"device={device}"))
    fb = [f + bw for f, bw in zip(base.times["train_fwd"], base.times["backward"])]
    add("baseline fwd+bwd (2 views / crops)", fb, "step without optimiser")
    explain: list[str] = []
    if not args.no_extras:
        for k, xs in extras.items():
            add(k, xs)
        A = med(a_step)
        if is_dino:
            g, lc = hvps[0].model.num_globals, hvps[0].model.num_locals_cand  # type: ignore[attr-defined]
            n_loc = base.model.num_local  # type: ignore[attr-defined]
            t2 = med(extras["T2g: teacher fwd, 2 globals"])
            s2 = med(extras["S2g: student fwd, 2 globals"])
            sl = med(extras["SL: student fwd, L locals"]) if n_loc else 0.0
            f_sel = g / 2 * (t2 + s2) + (lc / n_loc * sl if n_loc else 0.0)
            rows.append(("bound, no teacher reuse", f"{(A + f_sel) / A:.3f}x", "", "(A + F_sel) / A"))
            reusable = bool(hvps[0].model.teacher_reuse) or args.no_teacher_reuse  # type: ignore[attr-defined]
            rows.append(
                (
                    "bound, teacher reuse",
                    f"{(A + f_sel - t2) / A:.3f}x",
                    "",
                    "(A + F_sel - T2g) / A" + ("" if reusable else "; n/a here: BatchNorm teacher"),
                )
            )
            explain += [
                f"{args.method}: F_sel = G/2*(T2g + S2g) + Lc/L*SL = {g}/2*({t2:.3f}+{s2:.3f}) + "
                f"{lc}/{n_loc}*{sl:.3f} = {f_sel:.3f} s (no-grad forwards of the selection pass, grouped "
                f"as it groups them); A = baseline step {A:.3f} s. With teacher reuse the training step "
                f"skips its teacher forward of the 2 chosen globals (T2g). Lc/L scales the local groups "
                f"linearly; the selection's CE table and top-k are not in F_sel."
            ]
        else:
            f = med(extras["F (1 view, no grad)"])
            rows.append((f"bound (A + {n}F) / A", f"{(A + n * f) / A:.3f}x", "", f"medians: F={f:.3f}s, A={A:.3f}s"))
            fm, am = min(extras["F (1 view, no grad)"]), min(a_step)
            rows.append(
                (
                    f"bound (A + {n}F) / A, from minima",
                    f"{(am + n * fm) / am:.3f}x",
                    "",
                    f"minima: F={fm:.3f}s, A={am:.3f}s",
                )
            )
            pv = med(extras[f"select fwd: {n} x B per view"])
            st = med(extras[f"select fwd: 1 x {n}B stacked"])
            rows.append(("stacked / per-view select fwd", f"{st / pv:.3f}x", "", "<1: stacked is faster"))
            bwd = med(base.times["backward"]) / med(base.times["train_fwd"])
            explain.append(
                f"Pair method: F = no-grad forward of one candidate batch of B through backbone + "
                f"heads, A = baseline full step; backward/forward(with grad) = {bwd:.2f}."
            )
        sel, extra = med(hvps[0].times["select"]), med(hvps[0].times["step"]) - A
        share = f"{sel / extra:.2f}" if extra > 0 else "n/a (HVP median step <= baseline: too noisy)"
        explain.append(
            f"Measured selection pass inside the HVP step ({hvps[0].name}): {sel:.3f} s; "
            f"its share of the extra step time (median HVP - median baseline) = {share}."
        )

    info = machine_info(device)
    print()
    print("\n".join(f"{k}: {v}" for k, v in info))
    print(render(rows, markdown=False))
    print("\n".join(explain))
    if args.out:
        cmd = "uv run python benchmarks/overhead.py " + shlex.join(argv)
        section = [
            f"\n## HVP overhead: {args.method}, {args.backbone}, B={b}, N={n} "
            f"({dt.datetime.now().astimezone().isoformat(timespec='seconds')})",
            "",
            *[f"- {k}: {v}" for k, v in info],
            "",
            "```",
            cmd,
            "```",
            "",
            *[f"- {x}" for x in notes],
            f"- rounds: {n_timed} timed"
            + (f" (of {args.iters}: {stopped})" if stopped else "")
            + f" after {args.warmup} warm-up, variants interleaved "
            f"({', '.join(r.name for r in runners)}) each round",
            "",
            render(rows, markdown=True),
            "",
            *[f"- {x}" for x in explain],
            "",
        ]
        with args.out.open("a") as fh:
            fh.write("\n".join(section))
        print(f"appended to {args.out}")
    if stopped not in (None, SIGTERM_STOP):
        raise SystemExit(f"overhead.py: {stopped}")  # reported above; a diverged model is still a failure


if __name__ == "__main__":
    main()
