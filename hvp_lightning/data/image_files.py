"""Which files are images: a leaf of the data package, torch-free (start-up validation, folders,
shards and their converter all ask it)."""

from __future__ import annotations

# torchvision's ImageFolder extensions (torchvision.datasets.folder.IMG_EXTENSIONS) plus GIF
# (its first frame is the image).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


def is_image_file(path: str) -> bool:
    """Whether ``path``'s extension is an image's (any case)."""
    return path.lower().endswith(IMAGE_EXTENSIONS)
