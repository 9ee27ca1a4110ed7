"""The built-in offline dataset: scattered shapes whose class only a learned feature sees.

Each image is a field of small copies of one of 10 shapes (the class) over a colour
gradient with distractor strokes. Everything else varies per image: background and shape
colours (any hue), the number, size, position and slight rotation of the copies, and the
clutter. A random-init network mostly sees colour and layout, so its k-NN sits near chance;
what survives random crops (there are shapes everywhere) and colour jitter (the shape is the
same in any colour) is the shape, so the SSL invariances are what separate the classes.

Generated in memory with batched tensor ops (a few seconds for thousands of images),
deterministic from a seed; no files, no download.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

SHAPES = ("disc", "ring", "square", "frame", "triangle", "plus", "cross", "diamond", "bars", "checker")
_TEMPLATE_PX = 64  # shape stamps are drawn once at this size, then resampled per copy


def _shape_mask(name: str, dx: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """Boolean mask of a unit shape; ``|dx|, |dy| <= 1`` is its bounding box."""
    ax, ay = dx.abs(), dy.abs()
    rho = (dx**2 + dy**2).sqrt()
    box = (ax < 1) & (ay < 1)
    masks = {
        "disc": lambda: rho < 0.95,
        "ring": lambda: (rho < 0.95) & (rho > 0.55),
        "square": lambda: (ax < 0.8) & (ay < 0.8),
        "frame": lambda: (ax < 0.9) & (ay < 0.9) & ((ax > 0.5) | (ay > 0.5)),
        "triangle": lambda: (dy > -0.8) & (dy < 0.8) & (ax < (dy + 0.8) * 0.62),
        "plus": lambda: ((ax < 0.3) & (ay < 0.95)) | ((ay < 0.3) & (ax < 0.95)),
        "cross": lambda: (((dx - dy).abs() < 0.4) | ((dx + dy).abs() < 0.4)) & (rho < 1.0),
        "diamond": lambda: ax + ay < 1,
        "bars": lambda: box & (torch.floor((dy + 1) * 2.5) % 2 == 0),
        "checker": lambda: box & ((torch.floor((dx + 1) * 2) + torch.floor((dy + 1) * 2)) % 2 == 0),
    }
    return masks[name]()


def shape_templates(px: int = _TEMPLATE_PX) -> torch.Tensor:
    """``[len(SHAPES), 1, px, px]`` float stamps of every class's shape (1 inside, 0 outside)."""
    c = (torch.arange(px, dtype=torch.float32) + 0.5) / px * 2 - 1
    dy, dx = torch.meshgrid(c, c, indexing="ij")
    return torch.stack([_shape_mask(name, dx, dy).float() for name in SHAPES])[:, None]


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """``[..., 3]`` hue/saturation/value in [0, 1] -> ``[..., 3]`` RGB in [0, 1]."""
    h, s, v = hsv.unbind(-1)
    k = (torch.tensor([5.0, 3.0, 1.0], dtype=hsv.dtype) + h[..., None] * 6) % 6
    return v[..., None] * (1 - s[..., None] * torch.minimum(k, 4 - k).clamp(0, 1))


def _paint(img: torch.Tensor, alpha: torch.Tensor, rgb: torch.Tensor) -> torch.Tensor:
    """Composite colour ``rgb`` ``[N, 3]`` over ``img`` ``[N, 3, S, S]`` with ``alpha`` ``[N, 1, S, S]``."""
    return img + alpha * (rgb[:, :, None, None] - img)


def generate_shapes(num_images: int, image_size: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images uint8 [N, 3, S, S], labels int64 [N])``, a deterministic function of the arguments."""
    g = torch.Generator().manual_seed(seed)
    n, s = num_images, image_size

    def uniform(lo: float, hi: float, *shape: int) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(n, *shape, generator=g)

    labels = torch.randint(0, len(SHAPES), (n,), generator=g)
    pos = (torch.arange(s, dtype=torch.float32) + 0.5) / s  # pixel centres in [0, 1]
    yy, xx = pos[None, :, None], pos[None, None, :]

    # Background: a linear gradient between two random colours, at a random angle.
    ends = hsv_to_rgb(torch.stack([uniform(0, 1, 2), uniform(0, 0.8, 2), uniform(0.1, 0.9, 2)], -1))  # [N, 2, 3]
    angle = uniform(0, 2 * math.pi)[:, None, None]
    t = ((xx - 0.5) * angle.cos() + (yy - 0.5) * angle.sin() + 0.5).clamp(0, 1)[:, None]
    img = ends[:, 0, :, None, None] + t * (ends[:, 1] - ends[:, 0])[:, :, None, None]

    # Clutter: 0-2 straight strokes of random colour, length and width, shared by all classes.
    for _ in range(2):
        x0, y0, x1, y1 = uniform(0, 1, 4)[:, :, None, None].unbind(1)
        vx, vy = x1 - x0, y1 - y0
        along = (((xx - x0) * vx + (yy - y0) * vy) / (vx**2 + vy**2 + 1e-6)).clamp(0, 1)
        dist = ((xx - x0 - along * vx) ** 2 + (yy - y0 - along * vy) ** 2).sqrt() * s  # pixels
        alpha = (uniform(0.5, 1.5)[:, None, None] - dist + 0.5).clamp(0, 1) * (uniform(0, 1) < 0.5)[:, None, None]
        img = _paint(img, alpha[:, None], hsv_to_rgb(torch.stack([uniform(0, 1), uniform(0, 1), uniform(0, 1)], -1)))

    # The class: 4-8 copies of its shape, one colour per image, each copy its own size,
    # position and a slight rotation (bars stay bars, plus stays plus).
    stamps = shape_templates()[labels]  # [N, 1, P, P]
    colour = hsv_to_rgb(torch.stack([uniform(0, 1), uniform(0.3, 1), uniform(0.2, 1)], -1))
    copies = torch.randint(4, 9, (n,), generator=g)
    for c in range(8):
        radius = uniform(0.16, 0.3)  # half-width in units of half the side: 16-30 % of the side across
        centre = uniform(-1, 1, 2) * (1 - radius[:, None])
        rot = uniform(-0.25, 0.25)
        cos, sin = rot.cos() / radius, rot.sin() / radius
        # Affine map from image coordinates [-1, 1] to the stamp's [-1, 1].
        theta = torch.stack([torch.stack([cos, sin, -(cos * centre[:, 0] + sin * centre[:, 1])], -1),
                             torch.stack([-sin, cos, sin * centre[:, 0] - cos * centre[:, 1]], -1)], 1)
        grid = F.affine_grid(theta, [n, 1, s, s], align_corners=False)
        alpha = F.grid_sample(stamps, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        img = _paint(img, alpha * (copies > c)[:, None, None, None], colour)

    img = img + 0.03 * torch.randn(n, 1, s, s, generator=g)  # sensor noise, same on all channels
    return (img.clamp(0, 1) * 255).round().to(torch.uint8), labels


class SyntheticShapes(Dataset):
    """``ds[i] -> (uint8 image [3, S, S], label)`` over :func:`generate_shapes`' images."""

    num_classes = len(SHAPES)

    def __init__(self, num_images: int, image_size: int = 32, seed: int = 0) -> None:
        self.images, self.labels = generate_shapes(num_images, image_size, seed)
        self.classes = list(SHAPES)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.images[i], int(self.labels[i])


def save_grid(path: str, per_class: int = 10, image_size: int = 32, seed: int = 0, zoom: int = 2) -> None:
    """A PNG with one row per class (in ``SHAPES`` order) of ``per_class`` generated images."""
    from torchvision.utils import save_image

    images, labels = generate_shapes(40 * per_class, image_size, seed)
    rows = [images[labels == k][:per_class] for k in range(len(SHAPES))]
    grid = torch.cat(rows).float().div(255)
    grid = F.interpolate(grid, scale_factor=zoom, mode="nearest")
    save_image(grid, path, nrow=per_class, padding=2, pad_value=1.0)


if __name__ == "__main__":  # uv run python -m hvp_lightning.data.shapes docs/synthetic_shapes.png
    import sys

    save_grid(sys.argv[1] if len(sys.argv) > 1 else "docs/synthetic_shapes.png")
    print(f"rows, top to bottom: {', '.join(SHAPES)}")
