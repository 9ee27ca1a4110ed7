"""The live W&B gallery's pieces: what it shows is what the selection did."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hvp_lightning.analysis.live import gallery_rows, iou_histogram, pair_strip, to_display
from hvp_lightning.data.augment import IMAGENET_MEAN, IMAGENET_STD, normalize
from hvp_lightning.selection import pair_index


def test_display_undoes_the_loader_normalisation():
    img = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8)
    shown = to_display(normalize(img.clone(), IMAGENET_MEAN, IMAGENET_STD), IMAGENET_MEAN, IMAGENET_STD)
    assert shown.shape == (5, 7, 3) and np.array_equal(shown, img.permute(1, 2, 0).numpy())


def test_rows_show_the_selected_pair_beside_the_easiest_finite_pair():
    n, k = 4, 3
    pairs = pair_index(n)
    pixels = torch.full((k, n, 3, 6, 6), 0.0)
    pixels += 10.0 * torch.arange(k, dtype=torch.float32).view(k, 1, 1, 1, 1)  # image i: grey level 10 i
    pixels[:, :, 0] += torch.arange(n, dtype=torch.float32).view(1, n, 1, 1)  # plus its view number in red
    views = normalize(pixels, IMAGENET_MEAN, IMAGENET_STD)
    table = torch.tensor(
        [[0.1, 0.9, 0.5, 0.2, 0.3, 0.4], [float("nan"), 0.2, 0.8, 0.6, 0.7, 0.3], [0.5, 0.5, 0.5, 0.5, 0.5, 0.9]]
    )
    choice = table.nan_to_num(-1).argmax(1)
    iou = torch.rand(k, pairs.shape[0])
    snap = {
        "views": views,
        "table": table,
        "choice": choice,
        "iou": iou,
        "pairs": pairs,
        "index": torch.tensor([11, 12, 13]),
    }
    rows = gallery_rows(snap, IMAGENET_MEAN, IMAGENET_STD)
    assert len(rows) == k
    for (img, caption), c, r, idx in zip(rows, choice.tolist(), [0, 1, 0], (11, 12, 13)):
        (a, b), (e, f) = pairs[c].tolist(), pairs[r].tolist()
        assert caption.startswith(f"image {idx} | selected views {a},{b}: loss {float(table[idx - 11, c]):.3f}")
        assert f"easiest views {e},{f}" in caption and f"IoU {float(iou[idx - 11, r]):.2f}" in caption
        assert img.shape == (96, 4 * 96 + 4 * 4, 3)  # four views enlarged 16x, gaps 1 + 2 + 1
        columns = [0, 100, 204, 304]  # left edge of each view in the strip
        red = [int(img[0, x, 0]) - 10 * (idx - 11) for x in columns]
        assert red == [a, b, e, f]  # the right views, in the right order


def test_strip_and_histogram_shapes():
    v = np.zeros((100, 2, 3), np.uint8)
    assert pair_strip([v, v]).shape == (100, 2 + 4 + 2, 3)  # large enough: not enlarged
    assert pair_strip([v[:32], v[:32]]).shape == (96, 6 + 4 + 6, 3)
    fig = iou_histogram(np.array([0.1, 0.2]), np.array([0.1, 0.5, 0.9, 0.2]), step=7)
    assert "step 7" in fig.axes[0].get_title()


def test_gallery_images_must_be_a_count(cfg_factory):
    from hvp_lightning.config import validate
    from hvp_lightning.errors import ConfigError

    with pytest.raises(ConfigError, match=r"logger\.gallery_images"):
        validate(cfg_factory("logger=wandb", "logger.gallery_images=-1"))
