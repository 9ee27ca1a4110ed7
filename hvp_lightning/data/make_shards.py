"""``hvp-make-shards SRC OUT``: convert a folder of images into WebDataset tar shards, once, to
train from them (``data=shards``); or ``hvp-make-shards --index 'URLS'``: write the manifest of
shards made elsewhere, so runs need not read every shard at start-up.

SRC is an ImageNet-layout folder (``SRC/train/<class>/*``: the ``train`` split, labelled with
the class index as a ``.cls`` entry, class names in the manifest) or any folder of images
(every image at any depth, unlabelled). Samples are written in the order ``data=imagefolder``
and ``data=images`` read the folder (sorted), and each image's file bytes are copied unchanged,
so an image has the same key -- and the same views -- from its shards as from its folder. The
tar headers carry no time or owner: the same folder gives the same shards byte for byte.
OUT may be a local folder or an fsspec URL (``s3://bucket/prefix``).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
from pathlib import Path
from typing import Any

from .layout import images_under, is_image_file
from .shard_index import (
    MANIFEST,
    ShardError,
    base_name,
    expand_urls,
    manifest_entry,
    parent_url,
    scan_shards,
    suffix_of,
    write_manifest,
)

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


SIZES = "a number of bytes with an optional unit B, KB, MB, GB, KiB, MiB or GiB (e.g. 256MB, 1GiB, 5e8)"


def parse_size(text: str) -> int:
    """``256MB``, ``1GiB``, ``5e8``: bytes."""
    t = text.strip().upper().replace(" ", "")
    unit = next((u for u in sorted(UNITS, key=len, reverse=True) if u and t.endswith(u)), "")
    try:
        return int(float(t[: len(t) - len(unit)]) * UNITS[unit])
    except ValueError:
        raise ValueError(f"--shard-size={text} is not allowed: expected {SIZES}") from None


def earlier_output(out: str) -> list[str]:
    """The shards (``*.tar``) and manifest already in OUT, sorted: new shards beside them would
    leave old ones the new manifest does not list (and the same names overwritten)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(out)
    if not fs.isdir(root):
        return []
    names = sorted(name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(root, detail=False))
    return [name for name in names if name == MANIFEST or name.endswith(".tar")]


def source_samples(src: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """``([(path, label)], class names)`` of a source folder in the order training reads it:
    ImageNet layout (``train/<class>/``) labelled as torchvision's ImageFolder labels it
    (sorted class folders), any other folder unlabelled (sorted paths, any depth)."""
    train = src / "train"
    if train.is_dir() and any(p.is_dir() for p in train.iterdir()):
        from torchvision.datasets.folder import find_classes, make_dataset

        classes, to_index = find_classes(str(train))
        found = make_dataset(str(train), to_index, is_valid_file=is_image_file, allow_empty=True)
        return [(p, int(c)) for p, c in found], classes
    return [(p, -1) for p in images_under(src)], []


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> tuple[int, int]:
    """Append ``name`` with ``data`` (no time, owner or mode of the source: reproducible
    shards); (offset of its data in the tar, size)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o444, 0
    start = tar.offset + len(info.tobuf(tar.format, tar.encoding, tar.errors))
    tar.addfile(info, io.BytesIO(data))
    return start, len(data)


def write_shards(
    samples: list[tuple[str, int]],
    classes: list[str],
    out: str,
    prefix: str = "train",
    shard_bytes: int = 256 * 10**6,
    max_samples: int | None = None,
    source: str = "",
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Write ``samples`` as ``OUT/<prefix>-000000.tar, ...``: a new shard starts when the next
    image would take the current one past ``shard_bytes`` or ``max_samples``. Writes
    ``OUT/manifest.json``; returns its shard records."""
    import fsspec
    from tqdm import tqdm

    width = max(6, len(str(len(samples))))
    records: list[dict[str, Any]] = []
    buf, rows = io.BytesIO(), []
    tar = tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT)

    def flush() -> None:
        nonlocal buf, rows, tar
        tar.close()
        name = f"{prefix}-{len(records):0{width}d}.tar"
        with fsspec.open(f"{out}/{name}", "wb") as f:
            f.write(buf.getvalue())
        records.append(manifest_entry(name, rows, len(buf.getvalue())))
        buf, rows = io.BytesIO(), []
        tar = tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT)

    for i, (path, label) in enumerate(tqdm(samples, desc="writing shards", unit="image", disable=not progress)):
        try:
            data = Path(path).read_bytes()
        except OSError as err:  # kept as an empty member: keys stay the folder's, training skips it
            print(f"hvp-make-shards: cannot read {path} ({err}): written empty, skipped when training", file=sys.stderr)
            data = b""
        full = rows and (
            buf.tell() + len(data) + 3 * tarfile.BLOCKSIZE > shard_bytes or (max_samples and len(rows) >= max_samples)
        )
        if full:
            flush()
        key, suffix = f"{i:0{width}d}", suffix_of(path)
        offset, size = add_member(tar, f"{key}.{suffix}", data)
        if label >= 0:
            add_member(tar, f"{key}.cls", str(label).encode())
        rows.append((key, suffix, offset, size, label))
    if rows:
        flush()
    write_manifest(f"{out}/{MANIFEST}", records, classes, source)
    return records


def pattern_of(out: str, prefix: str, records: list[dict[str, Any]]) -> str:
    """The brace pattern of the shards written (what ``data.urls`` takes)."""
    first, last = records[0]["name"], records[-1]["name"]
    a, b = first[len(prefix) + 1 : -4], last[len(prefix) + 1 : -4]
    return f"{out}/{prefix}-{{{a}..{b}}}.tar" if a != b else f"{out}/{first}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hvp-make-shards", description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?", help="ImageNet-layout folder (train/<class>/*) or any folder of images")
    ap.add_argument("out", nargs="?", help="output folder or fsspec URL (s3://bucket/prefix)")
    ap.add_argument("--shard-size", default="256MB", help="target bytes per shard (default 256MB; e.g. 1GB, 512MiB)")
    ap.add_argument("--max-samples", type=int, default=None, help="at most this many images per shard")
    ap.add_argument("--prefix", default="train", help="shard file names: PREFIX-000000.tar (default train)")
    ap.add_argument("--index", metavar="URLS", help="instead: write the manifest of existing shards (brace pattern)")
    ap.add_argument("--manifest", help="with --index: where to write it (default: manifest.json beside the shards)")
    args = ap.parse_args(argv)
    try:
        if args.index:
            return index_only(args.index, args.manifest)
        if not args.src or not args.out:
            ap.error("SRC and OUT are needed (or --index URLS)")
        return convert(args)
    except (ShardError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"hvp-make-shards: {err}", file=sys.stderr)
        return 2


def convert(args: argparse.Namespace) -> int:
    src = Path(args.src).expanduser()
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a folder")
    shard_bytes = parse_size(args.shard_size)
    if shard_bytes < 10 * tarfile.BLOCKSIZE:
        raise ValueError(f"--shard-size={args.shard_size} is not allowed: expected at least 5KiB")
    if args.max_samples is not None and args.max_samples < 1:
        raise ValueError(f"--max-samples={args.max_samples} is not allowed: expected at least 1")
    samples, classes = source_samples(src)
    if not samples:
        raise FileNotFoundError(f"no image files under {src}")
    out = args.out.rstrip("/")
    if "://" not in out:
        out = os.path.abspath(os.path.expanduser(out))
    if found := earlier_output(out):
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise FileExistsError(
            f"OUT={out} already holds shards or a manifest ({shown}): pick an empty folder or remove them"
        )
    if "://" not in out:
        os.makedirs(out, exist_ok=True)
    records = write_shards(samples, classes, out, args.prefix, shard_bytes, args.max_samples, source=str(src))
    labelled = f"labelled, {len(classes)} classes" if classes else "unlabelled"
    print(f"wrote {len(samples)} images ({labelled}) into {len(records)} shards and {out}/{MANIFEST}")
    print(f"train on them with: data=shards 'data.urls=\"{pattern_of(out, args.prefix, records)}\"'")
    return 0


def index_only(pattern: str, manifest: str | None) -> int:
    urls = expand_urls(pattern)
    index, truncated = scan_shards(urls, progress=True)
    rows: list[list[tuple[str, str, int, int, int]]] = [[] for _ in urls]
    for i in range(len(index)):
        _, offset, size, suffix, label = index.member(i)
        rows[int(index.shard[i])].append((index.key(i), suffix, offset, size, label))
    records = [manifest_entry(base_name(url), rows[s], index.shard_bytes[s]) for s, url in enumerate(urls)]
    where = manifest or f"{parent_url(urls[0])}/{MANIFEST}"
    write_manifest(where, records, [], source=pattern)
    print(f"indexed {len(index)} samples in {len(urls)} shards: {where}")
    for url in truncated:
        print(f"warning: {url} is truncated: its samples after the damage are left out", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
