"""Where a view's CPU time goes, stage by stage (a benchmark, not a test).

Times, on one thread (as one loader worker runs), each stage of the training view pipeline
on ImageNet-like JPEGs (``loader.make_jpeg_folder``: ~450x400): decode, parameter sampling,
crop+flip, collate, and the batched colour step (:func:`hvp_lightning.data.batched.colour`)
with one op switched on at a time for every view (its cost where it is drawn), the whole
colour step with parameters drawn as training draws them, and normalisation; next to them
torchvision's per-image kernels on the same crops (the reference path). Stages alternate
within each repeat so machine noise hits all alike; each figure is the median over repeats,
in ms per view (decode: per image).

    uv run python benchmarks/view_stages.py --crop 224 --views 4 --repeats 7

``--baseline FILE`` also times ``colour()`` of another version of ``batched.py`` in the same
rounds, on chunks of 8 views as its ``finish_views`` ran it on CPU until 2026-11-23 (for
example ``git show 6ee184b:hvp_lightning/data/batched.py > /tmp/old_batched.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import default_collate
from torchvision.transforms.v2 import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loader import REPO, make_jpeg_folder  # noqa: E402

from hvp_lightning.data.augment import (  # noqa: E402
    ViewAug,
    crop_flip,
    draw_view_params,
    normalize,
    reference_colour,
    sample_params,
    to_uint8_tensor,
)
from hvp_lightning.data.batched import JITTER_KEYS, colour  # noqa: E402
from hvp_lightning.data.datasets import read_image  # noqa: E402
from hvp_lightning.data.seeds import view_key, view_keys  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--views", type=int, default=4, help="views per image")
    p.add_argument("--images", type=int, default=8, help="images per repeat (batch of images x views)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--baseline", type=Path, default=None, help="another batched.py to time colour() of")
    return p.parse_args(argv)


def load_baseline(path: Path) -> Callable:
    """``colour`` of another version of ``batched.py``, imported inside the package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("hvp_lightning.data.baseline_batched", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.colour


def only(params: dict[str, torch.Tensor], op: str) -> dict[str, torch.Tensor]:
    """Parameters with one op on for every view and all others off (factors as drawn)."""
    n = params["jitter"].shape[0]
    p = dict(
        params,
        jitter=torch.ones(n),
        grayscale=torch.zeros(n),
        solarize=torch.zeros(n),
        blur_sigma=torch.zeros(n),
        jitter_order=torch.full((n, 4), -1),
    )
    jitter = JITTER_KEYS
    if op in jitter:
        p["jitter_order"] = p["jitter_order"].clone()
        p["jitter_order"][:, 0] = jitter.index(op)
        p[op] = torch.empty(n).uniform_(*((-0.1, 0.1) if op == "hue" else (0.6, 1.4)))
    elif op == "blur":
        p["blur_sigma"] = torch.empty(n).uniform_(0.1, 2.0)
    else:
        p[op] = torch.ones(n)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from PIL import Image

    root = make_jpeg_folder(REPO / "benchmarks" / ".cache" / "jpeg", 512)
    files = sorted((root / "train").rglob("*.jpg"))[: args.images]
    aug = ViewAug(size=args.crop, blur_p=0.5)
    k = aug.blur_kernel
    torch.manual_seed(0)
    imgs = [to_uint8_tensor(Image.open(f)) for f in files]
    plist = [sample_params(img, aug, view_key(0, 0, i, v)) for i, img in enumerate(imgs) for v in range(args.views)]
    crops = torch.stack(
        [crop_flip(img, p, aug.size) for img, p in zip([i for i in imgs for _ in range(args.views)], plist)]
    )
    params = {key: torch.stack([p[key] for p in plist]) for key in plist[0]}
    n = crops.shape[0]
    items = [
        {
            "views": list(crops[i * args.views : (i + 1) * args.views]),
            "params": {key: v[i * args.views : (i + 1) * args.views] for key, v in params.items()},
            "label": 0,
        }
        for i in range(args.images)
    ]
    floats = crops.float()

    def per_image(f: Callable[[torch.Tensor, dict, ViewAug], torch.Tensor], ps: dict[str, torch.Tensor]) -> None:
        for i in range(n):
            f(crops[i], {key: v[i] for key, v in ps.items()}, aug)

    ops = ("brightness", "contrast", "saturation", "hue", "grayscale", "blur", "solarize")
    sigma = torch.empty(n).uniform_(0.1, 2.0).tolist()
    reference = {  # torchvision's uint8 kernel of each op, one view at a time
        "brightness": lambda i: F.adjust_brightness(crops[i], 1.3),
        "contrast": lambda i: F.adjust_contrast(crops[i], 1.3),
        "saturation": lambda i: F.adjust_saturation(crops[i], 1.3),
        "hue": lambda i: F.adjust_hue(crops[i], 0.05),
        "grayscale": lambda i: F.rgb_to_grayscale(crops[i], num_output_channels=3),
        "blur": lambda i: F.gaussian_blur(crops[i], [k, k], [sigma[i]] * 2),
        "solarize": lambda i: F.solarize(crops[i], 128),
    }
    stages: dict[str, tuple[Callable[[], object], int]] = {
        "decode (PIL open + RGB tensor), per image": (
            lambda: [to_uint8_tensor(Image.open(f)) for f in files],
            len(files),
        ),
        "decode (read_image: torchvision's JPEG decoder), per image": (
            lambda: [to_uint8_tensor(read_image(str(f))) for f in files],
            len(files),
        ),
        "sample_params (torchvision's samplers' algorithms, counter-based uniforms, per view)": (
            lambda: [
                sample_params(img, aug, view_key(0, 0, i, v)) for i, img in enumerate(imgs) for v in range(args.views)
            ],
            n,
        ),
        "draw_view_params (one vectorised draw per image; data.on_device draws per batch)": (
            lambda: [
                draw_view_params(
                    (aug,) * args.views, img.shape[1], img.shape[2], view_keys(0, 0, torch.tensor([i]), args.views)
                )
                for i, img in enumerate(imgs)
            ],
            n,
        ),
        "crop_flip (resized_crop antialias + flip)": (
            lambda: [
                crop_flip(img, p, aug.size) for img, p in zip([i for i in imgs for _ in range(args.views)], plist)
            ],
            n,
        ),
        "collate (default_collate)": (lambda: default_collate(items), n),
    }
    for op in ops:
        p1 = only(params, op)
        stages[f"{op}: batched, every view"] = (lambda p1=p1: colour(crops, p1, aug), n)
        stages[f"{op}: torchvision per image, every view"] = (lambda op=op: [reference[op](i) for i in range(n)], n)
    stages["colour step, params as drawn: batched"] = (lambda: colour(crops, params, aug), n)
    stages["colour step, params as drawn: torchvision per image"] = (lambda: per_image(reference_colour, params), n)
    if args.baseline:
        old = load_baseline(args.baseline)
        stages[f"colour step, params as drawn: {args.baseline.name} (chunks of 8)"] = (
            lambda: [
                old(crops[j : j + 8], {key: v[j : j + 8] for key, v in params.items()}, k) for j in range(0, n, 8)
            ],
            n,
        )
    stages["normalise: batched"] = (lambda: normalize(floats.clone(), aug.mean, aug.std), n)
    stages["normalise: torchvision per image"] = (
        lambda: [F.normalize(c.float().div_(255), list(aug.mean), list(aug.std)) for c in crops],
        n,
    )
    times: dict[str, list[float]] = {s: [] for s in stages}
    for r in range(args.repeats + 1):
        for name, (fn, count) in stages.items():
            t0 = time.perf_counter()
            fn()
            if r:  # the first repeat warms up
                times[name].append((time.perf_counter() - t0) * 1e3 / count)
    head = (
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, torch {torch.__version__}, "
        f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}; {len(files)} images x "
        f"{args.views} views at {args.crop} px (blur kernel {k})"
    )
    print(head + "\n\n| stage | ms per view (median) | min |\n|---|---|---|")
    for name, v in times.items():
        print(f"| {name} | {statistics.median(v):.2f} | {min(v):.2f} |")


if __name__ == "__main__":
    main()
