"""The built-in data: deterministic, and its class is not in colour or raw pixels."""

from __future__ import annotations

import torch

from hvp_lightning.data.textures import TEXTURES, generate_textures, save_grid
from hvp_lightning.monitors.knn import knn_accuracy


def test_generation_is_deterministic_per_seed_and_balanced():
    a, la = generate_textures(300, 32, seed=3)
    b, lb = generate_textures(300, 32, seed=3)
    assert a.dtype == torch.uint8 and a.shape == (300, 3, 32, 32)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert not torch.equal(a, generate_textures(300, 32, seed=4)[0])
    assert torch.bincount(la, minlength=len(TEXTURES)).min() >= 15
    assert generate_textures(4, 48, seed=0)[0].shape == (4, 3, 48, 48)  # any size


def test_colour_and_raw_pixels_do_not_give_the_class_away():
    """Colour, phase and position are nuisances: neither the mean colour of an image nor its raw
    pixels find images of the same class (chance is 10%), so a network has to learn the texture
    -- which is what keeps the demo's "at init" k-NN low."""
    x, y = generate_textures(1500, 32, seed=0)
    train, test = slice(0, 1000), slice(1000, None)
    mean_rgb = x.float().mean((2, 3))
    by_colour = knn_accuracy(mean_rgb[train], y[train], mean_rgb[test], y[test], len(TEXTURES))["top1"]
    pixels = x.flatten(1).float()
    by_pixels = knn_accuracy(pixels[train], y[train], pixels[test], y[test], len(TEXTURES))["top1"]
    assert by_colour < 0.2 and by_pixels < 0.25, (by_colour, by_pixels)


def test_a_mirrored_image_keeps_its_class():
    """The views flip images horizontally, so every class must be mirror-symmetric (up to a
    shift): a grey image's power spectrum (a texture's signature, blind to colour and phase)
    finds the class as well for mirrored queries as for the images themselves."""
    x, y = generate_textures(1500, 32, seed=0)
    grey = x.float().mean(1)
    grey = grey - grey.mean((1, 2), keepdim=True)

    def spectrum(img: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft2(img).abs().flatten(1).log1p()

    bank, labels, queries = spectrum(grey[:1000]), y[:1000], grey[1000:]
    plain = knn_accuracy(bank, labels, spectrum(queries), y[1000:], len(TEXTURES))["top1"]
    mirrored = knn_accuracy(bank, labels, spectrum(queries.flip(-1)), y[1000:], len(TEXTURES))["top1"]
    assert plain > 0.5 and mirrored > plain - 0.05, (plain, mirrored)


def test_grid_png_has_one_row_per_class(tmp_path):
    from PIL import Image

    save_grid(str(tmp_path / "grid.png"), per_class=4, zoom=1)
    w, h = Image.open(tmp_path / "grid.png").size
    assert (w, h) == (2 + 4 * 34, 2 + len(TEXTURES) * 34)  # 32 px tiles, 2 px padding
