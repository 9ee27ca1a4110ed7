"""The built-in offline dataset: 10 kinds of texture, each in any colours.

The class is the texture (stripes, waves, checker, dots, grid, rings, blobs, bricks, speckle,
crosshatch), drawn at a fixed orientation per class (give or take 7 degrees). Everything else
varies per image as a nuisance: the two colours (any hue, saturation and brightness), the
period (5-9 px), the phase, the centre of the rings, a brightness gradient across the image and
sensor noise. A texture fills the whole image, so it survives the random crops of SSL views
(crops of 50-100 % of the area, `data/aug/textures.yaml`), and colour jitter with the hue range
widened to the whole circle makes the two colours useless as features. A network at random
init mostly sees colour and brightness, so its k-NN sits well below what SimCLR learns in a
few hundred steps (docs/data.md, "The built-in textures").

The orientation is fixed per class because random rotation is not among the SSL
augmentations: with rotation as a nuisance a network would have to learn rotation invariance
that no view pair teaches, and the CPU demo learned little (benchmarks/RESULTS.md). Every class
is mirror-symmetric up to a shift, so the horizontal flip of the views keeps the class.

Generated in memory with batched tensor ops (a few seconds for thousands of images),
deterministic from a seed; no files, no download.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

TEXTURES = ("stripes", "waves", "checker", "dots", "grid", "rings", "blobs", "bricks", "speckle", "crosshatch")


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """``[..., 3]`` hue/saturation/value in [0, 1] -> ``[..., 3]`` RGB in [0, 1]."""
    h, s, v = hsv.unbind(-1)
    k = (torch.tensor([5.0, 3.0, 1.0], dtype=hsv.dtype) + h[..., None] * 6) % 6
    return v[..., None] * (1 - s[..., None] * torch.minimum(k, 4 - k).clamp(0, 1))


def _bricks(u: torch.Tensor, v: torch.Tensor, period: torch.Tensor) -> torch.Tensor:
    """Rows of bricks (rows 0.75 periods high, bricks a period long, every other row shifted by
    half a brick) separated by mortar lines, as a signed field."""
    row = torch.sin(2 * math.pi * v / (1.5 * period))
    joints = torch.where(row > 0, torch.sin(math.pi * u / period), torch.cos(math.pi * u / period)).sign()
    return joints * ((row.abs() > 0.25).float() * 2 - 1)


def _patterns(
    u: torch.Tensor, v: torch.Tensor, r: torch.Tensor, period: torch.Tensor, blobs: torch.Tensor, speckle: torch.Tensor
) -> dict[str, Callable[[], torch.Tensor]]:
    """Signed fields per class (> 0: foreground colour) over the image coordinates: ``u`` along,
    ``v`` across the class's orientation, ``r`` the distance to a random centre (pixels)."""
    tau = 2 * math.pi
    su, sv = torch.sin(tau * u / period), torch.sin(tau * v / period)
    cu, cv = torch.cos(tau * u / period), torch.cos(tau * v / period)
    diag_a, diag_b = (u + v) / math.sqrt(2), (u - v) / math.sqrt(2)
    return {
        "stripes": lambda: sv,
        "waves": lambda: torch.sin(tau * (v + 0.35 * period * torch.sin(tau * u / (1.6 * period))) / period),
        "checker": lambda: 2 * su * sv,
        "dots": lambda: cu + cv - 1.0,
        "grid": lambda: 0.6 - torch.maximum(cu, cv),
        "rings": lambda: torch.sin(tau * r / period),
        "blobs": lambda: blobs,
        # Rows of bricks: each row's vertical joints shifted by a quarter of a brick from the last.
        "bricks": lambda: _bricks(u, v, period),
        "speckle": lambda: (speckle - 0.5) * 4,
        "crosshatch": lambda: 0.6 - torch.maximum(torch.cos(tau * diag_a / period), torch.cos(tau * diag_b / period)),
    }


def generate_textures(num_images: int, image_size: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images uint8 [N, 3, S, S], labels int64 [N])``, a deterministic function of the arguments."""
    g = torch.Generator().manual_seed(seed)
    n, s = num_images, image_size

    def uniform(lo: float, hi: float, *shape: int) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, *shape, generator=g)

    labels = torch.randint(0, len(TEXTURES), (n,), generator=g)
    pix = torch.arange(s, dtype=torch.float32) + 0.5
    yy, xx = pix[None, :, None].expand(n, s, s), pix[None, None, :].expand(n, s, s)

    # Coordinates: the class's orientation +- 7 degrees, a random phase, a period of 5-9 px.
    angle = uniform(-0.12, 0.12)[:, None, None]
    period = uniform(5.0, 9.0)[:, None, None]
    shift_u, shift_v = uniform(0, 100)[:, None, None], uniform(0, 100)[:, None, None]
    u = xx * angle.cos() + yy * angle.sin() + shift_u
    v = -xx * angle.sin() + yy * angle.cos() + shift_v
    cx, cy = uniform(0, s)[:, None, None], uniform(0, s)[:, None, None]
    r = ((xx - cx) ** 2 + (yy - cy) ** 2).sqrt()
    blobs = F.interpolate(
        torch.randn(n, 1, max(1, s // 4), max(1, s // 4), generator=g), size=(s, s), mode="bicubic", align_corners=False
    )[:, 0]
    speckle = torch.rand(n, s, s, generator=g)

    field = torch.zeros(n, s, s)
    patterns = _patterns(u, v, r, period, blobs, speckle)
    for k, name in enumerate(TEXTURES):  # label k is TEXTURES[k], whatever the dict's order
        chosen = labels == k
        if chosen.any():
            field[chosen] = patterns[name]()[chosen]
    alpha = (field * 3).clamp(-1, 1) * 0.5 + 0.5  # soft edges

    # Two colours of any hue and saturation whose brightness differs by at least 0.25.
    value_bg = uniform(0.1, 0.9)
    sign = torch.where(uniform(0, 1) < 0.5, -1.0, 1.0)
    value_fg = (value_bg + sign * uniform(0.3, 0.6)).clamp(0.05, 0.95)
    value_fg = torch.where((value_fg - value_bg).abs() < 0.25, 1 - value_bg, value_fg)
    bg = hsv_to_rgb(torch.stack([uniform(0, 1), uniform(0, 1), value_bg], -1))
    fg = hsv_to_rgb(torch.stack([uniform(0, 1), uniform(0, 1), value_fg], -1))
    img = bg[:, :, None, None] + alpha[:, None] * (fg - bg)[:, :, None, None]

    # Nuisances on top: a brightness gradient at a random angle, and sensor noise.
    tilt = uniform(0, 2 * math.pi)[:, None, None]
    gradient = ((xx / s - 0.5) * tilt.cos() + (yy / s - 0.5) * tilt.sin()) * uniform(0, 0.5)[:, None, None]
    img = img + gradient[:, None] + 0.03 * torch.randn(n, 1, s, s, generator=g)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8), labels


class SyntheticTextures(Dataset):
    """``ds[i] -> (uint8 image [3, S, S], label)`` over :func:`generate_textures`' images."""

    num_classes = len(TEXTURES)

    def __init__(self, num_images: int, image_size: int = 32, seed: int = 0) -> None:
        self.images, self.labels = generate_textures(num_images, image_size, seed)
        self.classes = list(TEXTURES)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.labels[i])


def save_grid(path: str, per_class: int = 10, image_size: int = 32, seed: int = 0, zoom: int = 2) -> None:
    """A PNG with one row per class (in ``TEXTURES`` order) of ``per_class`` generated images."""
    from torchvision.utils import save_image

    images, labels = generate_textures(40 * per_class, image_size, seed)
    rows = [images[labels == k][:per_class] for k in range(len(TEXTURES))]
    grid = torch.cat(rows).float().div(255)
    grid = F.interpolate(grid, scale_factor=zoom, mode="nearest")
    save_image(grid, path, nrow=per_class, padding=2, pad_value=1.0)


if __name__ == "__main__":  # uv run python -m hvp_lightning.data.textures docs/synthetic_textures.png
    import sys

    save_grid(sys.argv[1] if len(sys.argv) > 1 else "docs/synthetic_textures.png")
    print(f"rows, top to bottom: {', '.join(TEXTURES)}")
