"""Raw image datasets: ``ds[i] -> (image, label)`` with image a PIL image or uint8 tensor.

* :class:`SyntheticShapes` -- the built-in offline default, generated in memory
  (hvp_lightning/data/shapes.py: the class is a shape; colour, position, size and clutter vary).
* :class:`SafeImageFolder` -- ImageNet-layout folders that skip unreadable files with a
  warning instead of killing a multi-day run.
* torchvision CIFAR-10/100 and STL-10 (downloaded only when asked to).
"""

from __future__ import annotations

import logging
from pathlib import Path

from PIL import Image
from torchvision.datasets import ImageFolder

from .shapes import SyntheticShapes  # noqa: F401  the built-in default (datamodule.py builds it from here)

log = logging.getLogger(__name__)


class SafeImageFolder(ImageFolder):
    """ImageFolder that survives unreadable or truncated files.

    A file that fails to decode is reported once (by name) and replaced by the next
    readable sample, so epochs keep their length; the third item of a sample names the
    skipped file ("" if none) so the run can list skips in its summary.
    """

    max_retries = 16

    def __init__(self, root: str | Path) -> None:
        super().__init__(str(root), loader=_load_image)
        self._warned: set[int] = set()

    def __getitem__(self, index: int) -> tuple[Image.Image, int, str]:  # type: ignore[override]
        bad = ""
        for attempt in range(self.max_retries):
            i = (index + attempt) % len(self.samples)
            path, label = self.samples[i]
            try:
                return self.loader(path), label, bad
            except Exception as err:  # noqa: BLE001 -- any decoder failure means "skip this file"
                bad = bad or path
                if i not in self._warned:
                    self._warned.add(i)
                    log.warning("skipping unreadable image %s (%s: %s)", path, type(err).__name__, err)
        raise RuntimeError(f"{self.max_retries} consecutive unreadable images from {self.samples[index][0]}")


def _load_image(path: str) -> Image.Image:
    with open(path, "rb") as f:
        img = Image.open(f)
        img.load()  # decode now, so truncation raises here and not later in a transform
    return img
