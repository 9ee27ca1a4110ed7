"""How often two DINO/iBOT local crops overlap by more than the IoU policy's threshold.

docs/data.md ("IoU policy") leaves local crops free of the policy; this measures how much a
policy would touch them: pairs of crops drawn with torchvision's own
``RandomResizedCrop.get_params`` (seeded) at the local scales of the DINO (0.05-0.4) and iBOT
(0.05-0.25) presets, and for comparison the global scales, on an image of a typical ImageNet
size (500 x 375 by default). For each it prints the share of crop pairs whose IoU exceeds each
threshold, and the share of images whose L locals hold at least one such pair (the policy
would have to redraw a crop there).

    uv run python benchmarks/local_crop_overlap.py [--pairs 100000] [--width 500 --height 375]
"""

from __future__ import annotations

import argparse
import itertools

import torch
from torchvision.transforms import RandomResizedCrop

from hvp_lightning.data.iou_policy import box_iou_scalar

# name -> (scale, crops per image): the method presets' (conf/method/dino.yaml, ibot.yaml)
CROPS = {
    "DINO local": ((0.05, 0.4), 8),
    "iBOT local": ((0.05, 0.25), 10),
    "DINO global": ((0.4, 1.0), 2),
    "iBOT global (no locals)": ((0.14, 1.0), 2),
}
RATIO = (3 / 4, 4 / 3)


def box(img: torch.Tensor, scale: tuple[float, float]) -> tuple[int, int, int, int]:
    """One crop ``(left, top, w, h)`` as torchvision's sampler draws it."""
    top, left, h, w = RandomResizedCrop.get_params(img, list(scale), list(RATIO))
    return left, top, w, h


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=100_000, help="crop pairs per scale")
    p.add_argument("--images", type=int, default=20_000, help="images of L crops per scale")
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.30, 0.35])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    img = torch.empty(3, args.height, args.width, dtype=torch.uint8)  # get_params reads only its size
    heads = " | ".join(f"pairs IoU > {t:.2f} | images with one, L crops" for t in args.thresholds)
    print(f"image {args.width} x {args.height}, {args.pairs} pairs and {args.images} images per row, seed {args.seed}")
    print(f"| crops | scale | L | {heads} |")
    print("|---|---|---|" + "---|---|" * len(args.thresholds))
    for name, (scale, crops) in CROPS.items():
        torch.manual_seed(args.seed)
        ious = torch.tensor([box_iou_scalar(box(img, scale), box(img, scale)) for _ in range(args.pairs)])
        worst = torch.tensor(
            [
                max(box_iou_scalar(a, b) for a, b in itertools.combinations([box(img, scale) for _ in range(crops)], 2))
                for _ in range(args.images)
            ]
        )
        cells = " | ".join(
            f"{(ious > t).double().mean().item():.1%} | {(worst > t).double().mean().item():.1%}"
            for t in args.thresholds
        )
        print(f"| {name} | {scale[0]}-{scale[1]} | {crops} | {cells} |")


if __name__ == "__main__":
    main()
