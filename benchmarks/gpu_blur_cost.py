"""The blur's share of the batched colour step on a device, per blur kind (issue 40 item 9: "on a
GPU the blur's cost per batch is measured when one is lent").

On an accelerator :func:`hvp_lightning.data.batched.colour` runs every op on the whole batch
and keeps the blurred views with ``torch.where``, so the blur costs the same whatever share of
views draws it. This times, per blur kind and batch shape, the whole colour step (jitter,
grayscale, blur, solarize) and the blur call alone on the same uint8 views and parameters
(drawn as the loader draws them), the kinds alternated within each round; the times are
device times (the clock starts and stops after a ``synchronize``). Batch shapes: SimSiam's
loader batch (128 images x 4 candidate views at 224 px) and DINO's local crops (64 x 16 at 96
px); ``--shapes`` picks others.

    python3 benchmarks/gpu_blur_cost.py --device cuda --out benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvp_lightning.data.augment import UNIFORMS, ViewAug, draw_params  # noqa: E402
from hvp_lightning.data.batched import colour, gaussian_blur, pil_blur, pil_max_radius  # noqa: E402

KINDS = ("pil", "torchvision9", "simclr")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--shapes", nargs="+", default=["512x224", "1024x96"], help="views x side, e.g. 512x224")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=10, help="timed calls per arm and round")
    p.add_argument("--out", type=Path, default=None, help="append a markdown section to this file")
    return p.parse_args(argv)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def arms(x: torch.Tensor, params: dict[str, torch.Tensor], aug: ViewAug) -> dict[str, Callable[[], torch.Tensor]]:
    """The colour step as it runs on a device (``sync_free``, also where ``--device cpu`` checks the
    script) and its blur alone as that step calls it (every view, a sigma of 1 where the view draws
    no blur)."""
    sigma = params["blur_sigma"]
    sigma = torch.where(sigma > 0, sigma, 1.0)
    xf = x.float()
    if aug.blur_kind == "pil":
        blur = lambda: pil_blur(xf, sigma, pil_max_radius(aug.blur_sigma[1]))  # noqa: E731
    else:
        blur = lambda: gaussian_blur(xf, sigma, aug.blur_kernel)  # noqa: E731
    return {"colour step": lambda: colour(x, params, aug, sync_free=True), "blur alone": blur}


def measure(args: argparse.Namespace, device: torch.device) -> list[tuple[str, str, str, float]]:
    rows: list[tuple[str, str, str, float]] = []
    for shape in args.shapes:
        n, side = (int(v) for v in shape.split("x"))
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (n, 3, side, side), generator=g, dtype=torch.uint8).to(device)
        uniforms = torch.rand(n, UNIFORMS, generator=g, dtype=torch.float64).to(device)
        fns: dict[tuple[str, str], Callable[[], torch.Tensor]] = {}
        for kind in KINDS:
            aug = dataclasses.replace(ViewAug(size=side), blur_kind=kind)
            params = draw_params(uniforms, side, side, aug)
            for name, fn in arms(x, params, aug).items():
                fns[(kind, name)] = fn
        for fn in fns.values():  # warm-up: kernels loaded, allocator grown
            fn()
        times: dict[tuple[str, str], list[float]] = {k: [] for k in fns}
        for r in range(args.rounds):
            for key, fn in list(fns.items())[:: 1 if r % 2 == 0 else -1]:
                sync(device)
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                sync(device)
                times[key].append((time.perf_counter() - start) / args.calls * 1e3)
        rows += [(shape, kind, name, statistics.median(ms)) for (kind, name), ms in times.items()]
    return rows


def report(rows: list[tuple[str, str, str, float]], device: torch.device, argv: list[str]) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    head = f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {name}, torch {torch.__version__}"
    cmd = "python3 benchmarks/gpu_blur_cost.py " + " ".join(shlex.quote(a) for a in argv)
    lines = ["| views x side | blur kind | colour step ms | blur alone ms | blur share |", "|---|---|---|---|---|"]
    table = {(shape, kind, arm): ms for shape, kind, arm, ms in rows}
    for shape, kind in dict.fromkeys((shape, kind) for shape, kind, _, _ in rows):
        step, blur = table[(shape, kind, "colour step")], table[(shape, kind, "blur alone")]
        lines.append(f"| {shape} | {kind} | {step:.2f} | {blur:.2f} | {blur / step:.0%} |")
    return f"{head}\n\n```bash\n{cmd}\n```\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device = torch.device(args.device)
    text = report(measure(args, device), device, argv)
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(f"\n### gpu_blur_cost.py\n\n{text}")


if __name__ == "__main__":
    main()
