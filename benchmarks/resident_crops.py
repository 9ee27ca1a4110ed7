"""``data.on_device``'s batched crops against torchvision, and the start-up cost of holding a
folder (a benchmark, not a test; ``tests/data/test_resident.py`` asserts the bounds).

For a few source sizes, 64 random views (half smooth, half noise images) are cut by
:func:`hvp_lightning.data.resident.crop_flip_batch` and by torchvision's ``resized_crop`` +
flip of the same boxes, on its float path (what it runs on a GPU) and its uint8 CPU kernel;
the table gives the largest difference in levels and the share of pixels off by one.
``--folder DIR`` also times :func:`~hvp_lightning.data.resident.stack_images` on an image
folder's ``train/`` split with 0 and ``--workers`` loader workers.

    uv run python benchmarks/resident_crops.py --folder ../shared/datasets/cifar10 --workers 2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as tF
from torchvision.transforms.v2 import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hvp_lightning.data.augment import UNIFORMS, ViewAug, crop_flip, draw_params  # noqa: E402
from hvp_lightning.data.datasets import SafeImageFolder  # noqa: E402
from hvp_lightning.data.layout import split_dir  # noqa: E402
from hvp_lightning.data.resident import crop_flip_batch, stack_images  # noqa: E402

CASES = [  # source h, w, view size, crop scale
    (32, 32, 32, (0.08, 1.0)),
    (96, 96, 64, (0.2, 1.0)),
    (120, 100, 32, (0.05, 1.0)),
    (400, 450, 224, (0.2, 1.0)),
    (400, 450, 96, (0.05, 0.4)),
]


def photos(n: int, h: int, w: int) -> torch.Tensor:
    smooth = tF.interpolate(torch.rand(n // 2, 3, h // 4, w // 4), size=(h, w), mode="bilinear")
    return (torch.cat([smooth, torch.rand(n - n // 2, 3, h, w)]) * 255).round().to(torch.uint8)


def pixel_table(n: int) -> None:
    print("| source -> view | vs float path: max, share off by one | vs uint8 CPU kernel: max, share off by one |")
    print("|---|---|---|")
    for h, w, size, scale in CASES:
        torch.manual_seed(0)
        imgs = photos(n, h, w)
        p = draw_params(torch.rand(n, UNIFORMS, dtype=torch.float64), h, w, ViewAug(size=size, scale=scale))
        out = crop_flip_batch(imgs, p, size).int()
        rows = [{k: v[i] for k, v in p.items()} for i in range(n)]
        uint8 = torch.stack([crop_flip(img, r, size) for img, r in zip(imgs, rows)]).int()
        floats = torch.stack(
            [
                F.resized_crop(
                    img.float(),
                    int(r["crop_y"]),
                    int(r["crop_x"]),
                    int(r["crop_h"]),
                    int(r["crop_w"]),
                    [size, size],
                    antialias=True,
                )
                for img, r in zip(imgs, rows)
            ]
        )
        floats = torch.where(p["flip"].view(-1, 1, 1, 1) > 0, floats.flip(-1), floats).round().clamp(0, 255)
        d_f, d_u = (out - floats).abs(), (out - uint8).abs()
        print(
            f"| {h}x{w} -> {size} (scale {scale[0]}-{scale[1]}) | {d_f.max():.0f}, {(d_f > 0).float().mean():.1e} | "
            f"{d_u.max():.0f}, {(d_u > 0).float().mean():.1%} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--views", type=int, default=64)
    p.add_argument("--folder", type=Path, default=None, help="an image folder with train/<class>/*")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    pixel_table(args.views)
    if args.folder:
        ds = SafeImageFolder(split_dir(args.folder, "train"))
        for workers in (0, args.workers):
            start = time.perf_counter()
            images, _ = stack_images(ds, workers)
            print(
                f"stack_images: {len(ds)} images {tuple(images.shape[1:])}, {workers} workers: "
                f"{time.perf_counter() - start:.1f} s"
            )


if __name__ == "__main__":
    main()
