"""WebDataset-format tar shards as an indexed set of images: where each sample's image bytes
lie (shard, offset, size), its label if it has one, and how to read them from a local path or
any fsspec URL (``s3://``, ``gs://``, ``https://`` where the matching fsspec package is installed).

Why an index and random access rather than a stream through a shuffle buffer: with the byte
range of every image known, the shards give exactly what a folder gives -- the epoch's order
is :func:`.sampler.epoch_order` over all samples (a function of (seed, epoch)), each rank
takes its equal share of it whatever the shard sizes, a resumed run skips exactly the batches
it trained, and an image's views are keyed by its position in the index as they are by its
position in a folder (docs/data.md "Shards"). A local shard is opened once per loader worker
and read with ``pread`` (no file is opened per image: the metadata load that shards exist to
avoid); an object-store shard is read with one ranged GET per image.

The index comes from the ``manifest.json`` that ``hvp-make-shards`` writes beside the shards
(sample counts, bytes and member offsets per shard), or, for shards made elsewhere, from reading
every tar header once at start-up. Torch-free: start-up validation builds it before the heavy
imports.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import re
import tarfile
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from ..run.process_rank import env_rank
from .image_files import IMAGE_EXTENSIONS

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "hvp-shards/1"
LABEL_SUFFIXES = ("cls", "cls.txt")  # WebDataset's integer class label entry
IMAGE_SUFFIXES = tuple(e.lstrip(".") for e in IMAGE_EXTENSIONS)
MEMBER_MARK = "#"  # "<shard url>#<sample key>": how a sample is named in skip reports
OPEN_SHARDS = 64  # local shards a process keeps open (below the usual 1024 descriptors)
_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_ALTERNATIVES = re.compile(r"\{([^{}]*,[^{}]*)\}")
_MEMBER = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # WebDataset's split of a member name: key . suffix


class ShardError(Exception):
    """A shard that cannot be opened or read as a tar, naming the shard and its URL."""


def expand_urls(pattern: str | Sequence[str]) -> list[str]:
    """The shard URLs of a brace pattern (``train-{000000..001023}.tar``: zero padding kept;
    ``{a,b}``: alternatives; several braces multiply) or of a list of patterns, in order."""
    if not isinstance(pattern, str):
        return [url for p in pattern for url in expand_urls(str(p))]
    found = [m for m in (_RANGE.search(pattern), _ALTERNATIVES.search(pattern)) if m]
    if not found:
        return [pattern]
    m = min(found, key=lambda m: m.start())  # the leftmost brace varies slowest, as in a shell
    head, tail = pattern[: m.start()], pattern[m.end() :]
    if m.re is _ALTERNATIVES:
        return [u for alt in m.group(1).split(",") for u in expand_urls(head + alt + tail)]
    lo, hi = m.group(1), m.group(2)
    width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
    step = 1 if int(hi) >= int(lo) else -1
    return [u for i in range(int(lo), int(hi) + step, step) for u in expand_urls(f"{head}{i:0{width}d}{tail}")]


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    return url[len("file://") :] if url.startswith("file://") else os.path.expanduser(url)


def parent_url(url: str) -> str:
    return url.rsplit("/", 1)[0] if "/" in url else "."


def base_name(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """(fsspec file system, path in it) of a URL; a missing fsspec backend is one clear line."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as err:
        raise ShardError(f"{url}: {err} (for s3:// install the 's3' extra: uv sync --extra s3)") from None


@dataclass
class ShardIndex:
    """Every sample of a list of shards, in shard order then stored order: sample ``i``'s image
    is ``size[i]`` bytes at ``offset[i]`` of shard ``shard[i]`` (:meth:`member`). ``label`` is
    -1 where the shards carry none; ``classes`` come from the manifest when it names them.

    Built with :meth:`add`, then :meth:`compact`-ed into numpy columns: about 30 bytes an image
    in every process that holds it (each loader worker does), where Python lists take ten times
    that -- gigabytes per node for ImageNet."""

    urls: list[str]
    shard: Any = field(default_factory=list)
    offset: Any = field(default_factory=list)
    size: Any = field(default_factory=list)
    label: Any = field(default_factory=list)
    keys: Any = field(default_factory=list)
    suffix: Any = field(default_factory=list)  # codes into suffixes once compact
    suffixes: tuple[str, ...] = ()
    classes: list[str] = field(default_factory=list)
    shard_bytes: list[int] = field(default_factory=list)  # what the index expects each shard's size to be

    def __len__(self) -> int:
        return len(self.offset)

    def add(self, shard: int, key: str, suffix: str, offset: int, size: int, label: int) -> None:
        self.shard.append(shard)
        self.keys.append(key)
        self.suffix.append(suffix)
        self.offset.append(offset)
        self.size.append(size)
        self.label.append(label)

    def compact(self) -> ShardIndex:
        import numpy as np

        self.suffixes = tuple(sorted(set(self.suffix)))
        code = {s: c for c, s in enumerate(self.suffixes)}
        self.suffix = np.asarray([code[s] for s in self.suffix], dtype=np.int8)
        self.shard = np.asarray(self.shard, dtype=np.int32)
        self.offset = np.asarray(self.offset, dtype=np.int64)
        self.size = np.asarray(self.size, dtype=np.int64)
        self.label = np.asarray(self.label, dtype=np.int64)
        self.keys = np.asarray([k.encode() for k in self.keys], dtype=np.bytes_)
        return self

    def member(self, i: int) -> tuple[str, int, int, str, int]:
        """(shard url, offset, size, image suffix, label) of sample ``i``."""
        return (
            self.urls[int(self.shard[i])],
            int(self.offset[i]),
            int(self.size[i]),
            self.suffixes[int(self.suffix[i])],
            int(self.label[i]),
        )

    def key(self, i: int) -> str:
        return self.keys[i].decode()

    def counts(self) -> list[int]:
        """Samples per shard."""
        import numpy as np

        return np.bincount(self.shard, minlength=len(self.urls)).tolist()

    def name(self, i: int) -> str:
        """``<shard url>#<key>``: sample ``i`` in skip reports."""
        return f"{self.urls[int(self.shard[i])]}{MEMBER_MARK}{self.key(i)}"


# --- reading tar headers (shards made elsewhere, and the converter's own check) ------------------
def scan_tar(fileobj: Any, total: int) -> tuple[list[tuple[str, str, int, int, int]], bool]:
    """``([(key, image suffix, offset, size, label)], complete)`` of a tar file of ``total``
    bytes: one entry per WebDataset sample with an image member (label -1 without a ``cls``
    entry). ``complete`` is False when the file ends inside a header or a member (a truncated
    shard): the samples whose bytes are all there are kept. Raises ``tarfile.TarError`` for a
    file that is no tar at all."""
    samples: dict[str, list] = {}
    order: list[str] = []
    complete = True
    tar = tarfile.open(fileobj=fileobj, mode="r:")
    try:
        for info in tar:
            m = _MEMBER.match(info.name)
            if not info.isfile() or m is None:
                continue
            key, suffix = m.group(1), m.group(2).lower()
            if key not in samples:
                samples[key] = ["", 0, 0, -1]
                order.append(key)
            entry = samples[key]
            if suffix in IMAGE_SUFFIXES and not entry[0]:
                entry[:3] = [suffix, info.offset_data, info.size]
            elif suffix in LABEL_SUFFIXES and info.offset_data + info.size <= total:
                data = tar.extractfile(info)
                entry[3] = int(data.read().decode().strip()) if data is not None else -1
    except (tarfile.ReadError, EOFError):
        complete = False
    finally:
        tar.close()
    rows = [(k, *samples[k]) for k in order if samples[k][0]]
    kept = [r for r in rows if r[2] + r[3] <= total]
    return kept, complete and len(kept) == len(rows)


def open_shard(url: str, storage_options: dict[str, Any] | None, number: int, total: int) -> Any:
    """A binary file object of shard ``number`` of ``total``, or a :class:`ShardError` naming it."""
    try:
        if is_local(url):
            return open(local_path(url), "rb")
        fs, path = filesystem(url, storage_options)
        return fs.open(path, "rb", block_size=8 << 20)
    except ShardError:
        raise
    except Exception as err:  # noqa: BLE001 -- any backend's error: name the shard and why
        why = f"{type(err).__name__}: {err}"
        raise ShardError(f"shard {number + 1} of {total} cannot be opened: {url} ({why})") from None


def shard_size(url: str, storage_options: dict[str, Any] | None) -> int | None:
    """The shard's size in bytes now, or None when it cannot be asked."""
    try:
        if is_local(url):
            return os.path.getsize(local_path(url))
        fs, path = filesystem(url, storage_options)
        return int(fs.size(path))
    except Exception:  # noqa: BLE001 -- a missing shard is reported where it is opened
        return None


def scan_shards(
    urls: Sequence[str], storage_options: dict[str, Any] | None = None, progress: bool = False
) -> tuple[ShardIndex, list[str]]:
    """The index of shards without a manifest, by reading every tar header (one pass over the
    data); and the names of truncated shards."""
    index, truncated = ShardIndex(list(urls)), []
    bar = _progress(len(urls), "indexing shards", progress)
    for s, url in enumerate(urls):
        total = shard_size(url, storage_options) or 0
        with open_shard(url, storage_options, s, len(urls)) as f:
            try:
                rows, complete = scan_tar(f, total)
            except tarfile.TarError as err:
                raise ShardError(f"shard {s + 1} of {len(urls)} is not a tar file: {url} ({err})") from None
        for key, suffix, offset, size, label in rows:
            index.add(s, key, suffix, offset, size, label)
        index.shard_bytes.append(rows[-1][2] + rows[-1][3] if rows else 0)
        if not complete:
            truncated.append(url)
        bar.update(1)
    bar.close()
    return index.compact(), truncated


# --- the manifest ---------------------------------------------------------------------------------
def manifest_entry(name: str, rows: Sequence[tuple[str, str, int, int, int]], nbytes: int) -> dict[str, Any]:
    """One shard's manifest record: its sample count (what a user reads) and member columns."""
    return {
        "name": name,
        "samples": len(rows),
        "bytes": nbytes,
        "keys": [r[0] for r in rows],
        "suffixes": [r[1] for r in rows],
        "offsets": [r[2] for r in rows],
        "sizes": [r[3] for r in rows],
        "labels": [r[4] for r in rows] if any(r[4] >= 0 for r in rows) else None,
    }


def write_manifest(path: str, shards: list[dict[str, Any]], classes: Sequence[str], source: str) -> None:
    """``manifest.json``: the format tag, totals, class names, then one record per shard."""
    doc = {
        "format": FORMAT,
        "source": source,
        "samples": sum(s["samples"] for s in shards),
        "shards": len(shards),
        "classes": list(classes),
        "records": shards,
    }
    import fsspec

    with fsspec.open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))


def read_manifest(url: str, storage_options: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The manifest at ``url``, or None where there is none."""
    try:
        if is_local(url):
            if not os.path.isfile(local_path(url)):
                return None
            with open(local_path(url)) as f:
                doc = json.load(f)
        else:
            fs, path = filesystem(url, storage_options)
            if not fs.exists(path):
                return None
            doc = json.loads(fs.cat_file(path))
    except json.JSONDecodeError as err:
        raise ShardError(f"{url} is not a shard manifest ({err})") from None
    if doc.get("format") != FORMAT:
        raise ShardError(f"{url} is not a manifest of this version ({doc.get('format')!r}, expected {FORMAT!r})")
    return doc


def index_from_manifest(urls: Sequence[str], doc: dict[str, Any], where: str) -> ShardIndex:
    """The index of ``urls`` from a manifest whose records name them (by file name)."""
    records = {r["name"]: r for r in doc["records"]}
    index = ShardIndex(list(urls), classes=list(doc.get("classes") or []))
    for s, url in enumerate(urls):
        r = records.get(base_name(url))
        if r is None:
            raise ShardError(f"shard {s + 1} of {len(urls)} ({url}) is not in the manifest {where}")
        labels = r["labels"] or [-1] * r["samples"]
        for row in zip(r["keys"], r["suffixes"], r["offsets"], r["sizes"], labels, strict=True):
            index.add(s, *row)
        index.shard_bytes.append(int(r["bytes"]))
    return index.compact()


def shard_index(
    urls: Sequence[str], manifest: str | None = None, storage_options: dict[str, Any] | None = None
) -> tuple[ShardIndex, list[str]]:
    """(index, truncated shards) of ``urls``: from ``manifest`` (default: ``manifest.json``
    beside the first shard) where there is one, else by reading the shards. With a manifest,
    every shard's size is checked against it (one stat or HEAD a shard); a shard shorter than
    the manifest says is reported as truncated (its samples past the end are skipped when read)."""
    where = manifest or f"{parent_url(urls[0])}/{MANIFEST}"
    doc = read_manifest(where, storage_options)
    if doc is None:
        if manifest:
            raise ShardError(f"no manifest at {manifest}")
        return scan_shards(urls, storage_options, progress=env_rank() == 0)  # one bar, not one per rank
    index = index_from_manifest(urls, doc, where)
    truncated = []
    for s, url in enumerate(urls):
        size = shard_size(url, storage_options)
        if size is None:
            open_shard(url, storage_options, s, len(urls)).close()  # raises, naming the shard
        if size is not None and size < index.shard_bytes[s]:
            truncated.append(url)
    return index, truncated


# --- reading image bytes --------------------------------------------------------------------------
class ShardReader:
    """Reads byte ranges of shards in one process: local shards through descriptors kept open
    (at most :data:`OPEN_SHARDS`, least recently used closed first) and ``os.pread``; other URLs
    through fsspec (one ranged request per read). Holds no descriptor when pickled, so each
    loader worker opens its own."""

    def __init__(self, storage_options: dict[str, Any] | None = None) -> None:
        self.storage_options = dict(storage_options or {})
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._fs: dict[str, tuple[Any, str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["storage_options"])  # type: ignore[misc]

    def read(self, url: str, offset: int, size: int) -> bytes | bytearray:
        """``size`` bytes at ``offset`` (fewer where the shard ends early: a truncated shard).
        A local read lands in a fresh ``bytearray``, which the JPEG decoder takes without a copy."""
        if is_local(url):
            buf = bytearray(size)
            got = os.preadv(self._fd(url), [buf], offset)
            return buf if got == size else buf[:got]
        fs, path = self._remote(url)
        return fs.cat_file(path, start=offset, end=offset + size)

    def read_many(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes | bytearray | None]:
        """:meth:`read` of many ``(url, offset, size)`` at once: object-store ranges are fetched
        concurrently (fsspec's ``cat_ranges``: one batch of requests, not one round trip per
        image), local ones read in turn; None where a request failed."""
        out: list[bytes | bytearray | None] = [None] * len(requests)
        groups: dict[int, list[int]] = {}  # file system -> the requests it serves
        for r, (url, offset, size) in enumerate(requests):
            if is_local(url):
                try:
                    out[r] = self.read(url, offset, size)
                except OSError:
                    pass
                continue
            groups.setdefault(id(self._remote(url)[0]), []).append(r)
        for rs in groups.values():
            fs = self._remote(requests[rs[0]][0])[0]
            paths = [self._remote(requests[r][0])[1] for r in rs]
            starts = [requests[r][1] for r in rs]
            ends = [requests[r][1] + requests[r][2] for r in rs]
            for r, data in zip(rs, fs.cat_ranges(paths, starts, ends, on_error="return"), strict=True):
                out[r] = data if isinstance(data, bytes) else None
        return out

    def _remote(self, url: str) -> tuple[Any, str]:
        if url not in self._fs:
            self._fs[url] = filesystem(url, self.storage_options)
        return self._fs[url]

    def _fd(self, url: str) -> int:
        fd = self._fds.pop(url, None)
        if fd is None:
            fd = os.open(local_path(url), os.O_RDONLY)
            if len(self._fds) >= OPEN_SHARDS:
                os.close(self._fds.popitem(last=False)[1])
        self._fds[url] = fd
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="shard", disable=not enabled or total < 2, leave=False)


def suffix_of(name: str) -> str:
    """The image suffix of a file name, for a shard member (``.JPEG`` -> ``jpeg``)."""
    return PurePosixPath(name).suffix.lstrip(".").lower()


def is_shard_member(name: str) -> bool:
    """True for a ``<shard url>#<key>`` sample name (skip reports), not a file path."""
    return MEMBER_MARK in name and name.split(MEMBER_MARK, 1)[0].endswith(".tar")


# --- the shards of a run's ``data`` config ------------------------------------------------------
def storage_options(d: Any) -> dict[str, Any]:
    """``data.storage_options`` as a plain dict (fsspec's keyword arguments)."""
    return dict(d.storage_options)


def run_index(d: Any) -> ShardIndex:
    """The index of ``data=shards``'s ``data.urls`` (``data.manifest`` or the one beside the
    shards, else read from the shards), built once per process: start-up validation, the
    crop size and the datasets ask for the same one. Truncated shards are named once."""
    urls = d.urls if isinstance(d.urls, str) else tuple(str(u) for u in d.urls)
    options = storage_options(d)
    return _cached_index(urls, d.manifest, json.dumps(options, sort_keys=True))


@functools.lru_cache(maxsize=4)
def _cached_index(urls: str | tuple[str, ...], manifest: str | None, options: str) -> ShardIndex:
    index, truncated = shard_index(expand_urls(urls), manifest, json.loads(options))
    for url in truncated:
        log.warning("shard %s is truncated: its samples past the end are skipped and counted", url)
    return index


def sample_side(d: Any, sample: int = 32) -> int:
    """Median shorter side of ``sample`` images spread over the shards (headers only; 224 if
    none of them opens): ``crop_size: auto`` for shards."""
    from PIL import Image

    index = run_index(d)
    reader, sides = ShardReader(storage_options(d)), []
    for i in range(0, len(index), max(1, len(index) // sample)):
        try:
            url, offset, size, _, _ = index.member(i)
            data = reader.read(url, offset, size)
            with Image.open(io.BytesIO(data)) as img:
                sides.append(min(img.size))
        except Exception:  # noqa: BLE001 -- unreadable samples are skipped at load time too
            continue
    reader.close()
    return int(sorted(sides)[len(sides) // 2]) if sides else 224
