"""Real image folders: empty class folders, every PIL mode (16-bit, float, palette, CMYK, ...),
GIFs, EXIF orientation, and unreadable files named once however many loader workers meet them;
unlabelled folders and lists of images (``data=images``): which files count, in which order."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from hvp_lightning.data.datasets import ImageFiles, SafeImageFolder, load_image, note_skipped
from hvp_lightning.data.layout import images_under, listed_images


def _gradient16() -> np.ndarray:
    return np.linspace(25, 65524, 24 * 20).reshape(24, 20).astype(np.uint16)


@pytest.fixture
def mode_tree(tmp_path) -> Path:
    """train/ with an empty class folder and one image per awkward mode; val/ plain."""
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 255, (24, 20, 3), dtype=np.uint8)
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (tmp_path / split / cls).mkdir(parents=True)
            Image.fromarray(rgb).save(tmp_path / split / cls / "rgb.png")
    (tmp_path / "train" / "empty_class").mkdir()
    d = tmp_path / "train" / "a"
    Image.fromarray(_gradient16()).save(d / "i16.png")  # opens as I;16
    Image.fromarray(_gradient16().astype(np.int32)).save(d / "i32.tif")  # opens as I
    Image.fromarray(_gradient16().astype(np.float32) / 65535).save(d / "f.tif")  # F in [0, 1]
    pal = Image.fromarray(rgb).convert("P")
    pal.info["transparency"] = 0
    pal.save(d / "palette.png")
    Image.fromarray(rgb).convert("LA").save(d / "la.png")
    Image.fromarray(rgb).convert("CMYK").save(d / "cmyk.jpg")
    Image.fromarray(rgb).convert("1").save(d / "bilevel.png")
    frames = [Image.new("RGB", (20, 24), (200, 10, 10)), Image.new("RGB", (20, 24), (10, 10, 200))]
    frames[0].save(d / "anim.gif", save_all=True, append_images=frames[1:])
    return tmp_path


def test_empty_class_folders_gifs_and_every_mode_load(mode_tree, caplog):
    with caplog.at_level(logging.WARNING):
        ds = SafeImageFolder(mode_tree / "train")
    assert ds.classes == ["a", "b", "empty_class"] and "empty_class" in caplog.text
    names = {Path(p).name for p, _ in ds.samples}
    assert {"anim.gif", "i16.png", "i32.tif", "f.tif", "cmyk.jpg", "bilevel.png"} <= names
    for i in range(len(ds)):
        img, _, bad = ds[i]
        assert bad == "" and img.mode == "RGB" and img.size == (20, 24), ds.samples[i][0]


@pytest.mark.parametrize("name", ["i16.png", "i32.tif", "f.tif"])
def test_high_bit_depth_images_are_scaled_not_clipped(mode_tree, name):
    got = np.asarray(load_image(str(mode_tree / "train" / "a" / name)))[..., 0].astype(float)
    want = _gradient16() / 257  # 16 bits -> 8 bits
    assert np.abs(got - want).max() <= 1.0  # PIL's own conversion: mean 254.6, 12 distinct values
    assert len(np.unique(got)) > 200


def test_gif_is_its_first_frame(mode_tree):
    img = load_image(str(mode_tree / "train" / "a" / "anim.gif"))
    assert np.asarray(img)[0, 0].tolist() == pytest.approx([200, 10, 10], abs=8)


def test_exif_orientation_is_applied(tmp_path):
    img = np.zeros((10, 30, 3), dtype=np.uint8)
    img[:, :5] = 255  # white band on the stored image's left
    exif = Image.Exif()
    exif[0x0112] = 6  # display rotated 90 degrees clockwise
    Image.fromarray(img).save(tmp_path / "rot.jpg", exif=exif, quality=95)
    out = np.asarray(load_image(str(tmp_path / "rot.jpg")))
    assert out.shape[:2] == (30, 10)  # upright: portrait
    assert out[:5].mean() > 200 and out[-5:].mean() < 50  # the band is now at the top


@pytest.mark.parametrize("kind", ["imagefolder", "images"])
def test_unreadable_file_is_named_once_across_workers_and_epochs(tmp_path, caplog, kind):
    """For class folders (SafeImageFolder) and unlabelled ones (ImageFiles, the same skipping)."""
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(4):
            Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(tmp_path / cls / f"{i}.png")
    bad = tmp_path / "a" / "0_corrupt.png"
    bad.write_bytes(b"not an image")
    ds = SafeImageFolder(tmp_path) if kind == "imagefolder" else ImageFiles(images_under(tmp_path))
    assert [path for path, _ in ds.samples][:2] == [str(tmp_path / "a" / "0.png"), str(bad)]

    def collate(items):
        return [path for _, _, path in items]

    loader = DataLoader(
        ds,
        batch_size=3,
        num_workers=2,
        persistent_workers=True,
        collate_fn=collate,
        sampler=[0, 1, 0, 1, 0, 1, 0, 1, 0],
    )  # the bad file, by itself and as a retry
    seen: set[str] = set()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # two epochs
            for files in loader:
                note_skipped(seen, files)
    assert seen == {str(bad)}
    named = [r for r in caplog.records if "0_corrupt.png" in r.getMessage()]
    assert len(named) == 1 and "UnidentifiedImageError" in named[0].getMessage()


def test_jpegs_decode_to_load_images_pixels(tmp_path):
    """SafeImageFolder's JPEG path (torchvision's decoder, a uint8 tensor) gives the pixels of
    the PIL path for colour, grey and EXIF-rotated JPEGs; CMYK JPEGs and a PNG named .jpg go
    through PIL; a truncated JPEG still raises (so the folder skips it)."""
    from torchvision.transforms.v2 import functional as TF

    from hvp_lightning.data.augment import to_uint8_tensor
    from hvp_lightning.data.datasets import read_image

    rng = np.random.default_rng(1)
    smooth = np.asarray(
        Image.fromarray(rng.integers(0, 255, (6, 5, 3), dtype=np.uint8)).resize((50, 40), Image.BICUBIC)
    )
    noisy = np.clip(smooth + rng.normal(0, 20, smooth.shape), 0, 255).astype(np.uint8)
    Image.fromarray(noisy).save(tmp_path / "rgb.jpg", quality=90)
    Image.fromarray(noisy).convert("L").save(tmp_path / "grey.JPEG")
    Image.fromarray(noisy).convert("CMYK").save(tmp_path / "cmyk.jpg")
    Image.fromarray(noisy).save(tmp_path / "png_named.jpg", format="PNG")
    for orientation in (3, 6, 8):
        exif = Image.Exif()
        exif[0x0112] = orientation
        Image.fromarray(noisy).save(tmp_path / f"rot{orientation}.jpg", exif=exif, quality=95)
    fast = {"rgb.jpg", "grey.JPEG", "rot3.jpg", "rot6.jpg", "rot8.jpg"}
    for name in sorted(fast | {"cmyk.jpg", "png_named.jpg"}):
        path = str(tmp_path / name)
        got, want = read_image(path), load_image(path)
        assert isinstance(got, torch.Tensor) == (name in fast), name
        assert torch.equal(to_uint8_tensor(got), TF.pil_to_tensor(want)), name
    data = (tmp_path / "rgb.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(OSError):
        read_image(str(tmp_path / "cut.jpg"))


def test_images_under_any_depth_sorted_links_followed_hidden_and_other_files_left_out(tmp_path):
    """Every image file at any depth (a flat folder's own included), sorted by path; links to
    files and folders followed, a link cycle read once; dot files and folders, and files of
    other extensions, are not images."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    for folder in (root / "b" / "deep", root / ".cache", elsewhere):
        folder.mkdir(parents=True)
    for path in (root / "z.JPG", root / "a.png", root / "b" / "deep" / "c.webp", elsewhere / "e.jpg"):
        Image.new("RGB", (8, 8)).save(path, format="PNG" if path.suffix == ".png" else None)
    (root / "notes.txt").write_text("not an image")
    (root / "._z.jpg").write_bytes(b"macOS resource fork")
    Image.new("RGB", (8, 8)).save(root / ".cache" / "thumb.jpg")
    (root / "linked").symlink_to(elsewhere, target_is_directory=True)
    (root / "file_link.jpg").symlink_to(elsewhere / "e.jpg")
    (root / "b" / "deep" / "loop").symlink_to(root / "b", target_is_directory=True)
    found = images_under(root)
    want = ["a.png", "b/deep/c.webp", "file_link.jpg", "linked/e.jpg", "z.JPG"]
    assert found == tuple(str(root / p) for p in want)
    assert ImageFiles(found)[3][1:] == (-1, "")  # unlabelled, read


def test_listed_images_relative_to_the_list_comments_and_blank_lines_skipped(tmp_path):
    (tmp_path / "lists").mkdir()
    other = tmp_path / "other.jpg"
    (tmp_path / "lists" / "files.txt").write_text(f"# my set\n\nb.jpg\n  ../a.png  \n{other}\n")
    assert listed_images(tmp_path / "lists" / "files.txt") == (
        str(tmp_path / "lists" / "b.jpg"),
        str(tmp_path / "lists" / ".." / "a.png"),
        str(other),
    )


def test_a_list_saved_with_a_byte_order_mark_reads_its_first_path(tmp_path):
    """Windows editors write UTF-8 with a BOM: it is no part of the first path (which was then
    reported missing, the BOM invisible in the message)."""
    (tmp_path / "files.txt").write_bytes("\ufeffa.jpg\nb.jpg\n".encode())
    assert listed_images(tmp_path / "files.txt") == (str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg"))
