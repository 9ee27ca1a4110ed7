"""``data=shards``: WebDataset tar shards give what a folder gives (docs/data.md "Shards").

The converter writes what a reader indexes (manifest or header scan, which agree); an image has
the same views from its shards as from its folder; broken shards are named or skipped and
counted. The DDP kill -9 resume from uneven shards is in test_determinism.py, the local S3
server run below (both slow)."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

from hvp_lightning.config import validate_data
from hvp_lightning.data.augment import MultiViewTransform, ViewAug
from hvp_lightning.data.datamodule import SSLDataModule, view_aug
from hvp_lightning.data.datasets import ShardImages, note_skipped, read_image
from hvp_lightning.data.items import MultiViewDataset
from hvp_lightning.data.layout import resolve_auto_crop
from hvp_lightning.data.make_shards import main as make_shards
from hvp_lightning.data.make_shards import parse_size, source_samples
from hvp_lightning.data.sampler import EpochSampler
from hvp_lightning.data.shard_index import expand_urls, scan_shards, shard_index
from hvp_lightning.errors import ConfigError

from .conftest import REPO, SUBPROCESS_TIMEOUT_S, images_run, make_cfg, write_images, write_plain_shards


def imagenet_layout(root: Path, per_class: int = 4) -> None:
    """``root/train/<class>/`` with JPEGs and PNGs (and an empty ``test/``-less tree: only train counts)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    for c in ("cat", "dog", "eel"):
        (root / "train" / c).mkdir(parents=True)
        for i in range(per_class):
            img = Image.fromarray(rng.integers(0, 256, (18 + i, 22, 3), dtype=np.uint8))
            img.save(root / "train" / c / (f"{i}.jpg" if i % 2 else f"{i}.png"))


def shards_of(src: Path, out: Path, *args: str) -> str:
    """hvp-make-shards SRC OUT ARGS; the brace pattern of the shards written."""
    assert make_shards([str(src), str(out), *args]) == 0
    names = sorted(p.name for p in out.glob("*.tar"))
    return f"{out}/train-{{{names[0][6:-4]}..{names[-1][6:-4]}}}.tar"


def pixels(img) -> torch.Tensor:
    import numpy as np

    return img if isinstance(img, torch.Tensor) else torch.from_numpy(np.asarray(img).copy())


def test_brace_patterns_expand_in_order_with_their_padding() -> None:
    assert expand_urls("s3://b/train-{000008..000011}.tar") == [f"s3://b/train-{i:06d}.tar" for i in range(8, 12)]
    assert expand_urls("/d/{a,b}-{1..2}.tar") == ["/d/a-1.tar", "/d/a-2.tar", "/d/b-1.tar", "/d/b-2.tar"]
    assert expand_urls(["x-{0..1}.tar", "y.tar"]) == ["x-0.tar", "x-1.tar", "y.tar"]
    assert expand_urls("plain.tar") == ["plain.tar"]
    assert parse_size("256MB") == 256 * 10**6 and parse_size("1GiB") == 2**30 and parse_size("5e3") == 5000


def test_converter_writes_what_the_reader_indexes(tmp_path, capsys) -> None:
    """An ImageNet-layout folder becomes shards whose manifest (sample counts per shard, classes)
    agrees with a scan of the tar headers, whose images are the folder's files' pixels with
    their class labels, in the folder's order; converting again gives the same bytes."""
    imagenet_layout(tmp_path / "src")
    pattern = shards_of(tmp_path / "src", tmp_path / "out", "--max-samples", "5")
    assert "data=shards" in capsys.readouterr().out
    urls = expand_urls(pattern)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [r["samples"] for r in manifest["records"]] == [5, 5, 2] and manifest["samples"] == 12
    assert manifest["classes"] == ["cat", "dog", "eel"]
    index, truncated = shard_index(urls)
    scanned, _ = scan_shards(urls)
    assert not truncated and index.counts() == [5, 5, 2]
    for column in ("offset", "size", "label", "keys", "suffix"):
        assert getattr(index, column).tolist() == getattr(scanned, column).tolist(), column
    samples, classes = source_samples(tmp_path / "src")
    ds = ShardImages(index)
    for i, (path, label) in enumerate(samples):
        img, lab, bad = ds[i]
        assert torch.equal(pixels(img), pixels(read_image(path))) and lab == label and bad == ""
    text = (tmp_path / "out" / "manifest.json").read_text()
    (tmp_path / "out" / "manifest.json").unlink()  # shards made elsewhere: --index writes their manifest
    assert make_shards(["--index", pattern]) == 0
    indexed, _ = shard_index(urls)
    assert indexed.offset.tolist() == index.offset.tolist() and indexed.counts() == index.counts()
    (tmp_path / "out" / "manifest.json").write_text(text)
    first = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    shards_of(tmp_path / "src", tmp_path / "again", "--max-samples", "5")
    assert first == {p.name: p.read_bytes() for p in (tmp_path / "again").iterdir()}


def test_converter_refuses_an_out_with_earlier_shards_and_names_a_bad_shard_size(tmp_path, capsys) -> None:
    """Converting into a folder of earlier shards used to leave the old ones beside a manifest
    that does not list them; nothing of the user's is deleted."""
    write_images(tmp_path / "six", 6)
    shards_of(tmp_path / "six", tmp_path / "out", "--max-samples", "1")
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    write_images(tmp_path / "three", 3)
    capsys.readouterr()
    assert make_shards([str(tmp_path / "three"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"OUT={tmp_path / 'out'} already holds shards or a manifest (manifest.json, train-000000.tar" in err
    assert "train-000001.tar and 4 more): pick an empty folder or remove them" in err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("kept")  # other files are no earlier output
    assert make_shards([str(tmp_path / "three"), str(tmp_path / "other")]) == 0
    assert make_shards([str(tmp_path / "three"), str(tmp_path / "new"), "--shard-size", "1XB"]) == 2
    err = capsys.readouterr().err
    assert "--shard-size=1XB is not allowed: expected a number of bytes with an optional unit" in err
    assert not (tmp_path / "new").exists()


def test_an_image_has_the_same_views_from_its_folder_and_its_shards(tmp_path) -> None:
    """data=images on a folder and data=shards on the shards made of it: the same training
    items (views and crop parameters, bit for bit) under the same (epoch, index) keys, the same
    held-out monitor sample."""
    write_images(tmp_path / "images", 23)
    pattern = shards_of(tmp_path / "images", tmp_path / "shards", "--shard-size", "6KB")
    assert len(expand_urls(pattern)) > 2
    folder = images_run(["data.crop_size=16"], tmp_path / "images", 3)
    on_shards = [*folder[:-3], "data=shards", f'data.urls="{pattern}"', "data.monitor_size=3"]
    modules = []
    for overrides in (folder, on_shards):
        data = resolve_auto_crop(validate_data(make_cfg(*overrides)))
        dm = SSLDataModule(data, (view_aug(data),) * 3, batch_size=4, num_workers=0, seed=5)
        dm.setup()
        modules.append(dm)
    a, b = modules
    assert len(a.train_set) == len(b.train_set) == 20
    for key in ((0, 0), (0, 7), (1, 7), (3, 19)):
        x, y = a.train_set[key], b.train_set[key]
        assert all(torch.equal(u, v) for u, v in zip(x["views"], y["views"], strict=True))
        assert all(torch.equal(x["params"][k], y["params"][k]) for k in x["params"])
    for i in range(3):
        assert torch.equal(a.eval_sets["monitor"][i]["image"], b.eval_sets["monitor"][i]["image"])


def test_every_rank_gets_the_same_batches_from_uneven_shards(tmp_path) -> None:
    """Shards of 50, 7 and 100 images over 2 ranks: the order is over samples, not shards, so
    both ranks get 78 samples (4 batches of 16, drop_last), disjoint, every epoch."""
    write_images(tmp_path / "images", 157, side=8)
    paths = sorted(p for p in (tmp_path / "images").rglob("*.jpg"))
    urls = write_plain_shards(tmp_path / "shards", paths, (50, 7, 100))
    index, _ = shard_index(urls)
    assert index.counts() == [50, 7, 100]
    ds = ShardImages(index)
    for epoch in (0, 1):
        shares = []
        for rank in (0, 1):
            sampler = EpochSampler(ds, 16, seed=3, rank=rank, world=2)
            sampler.set_epoch(epoch)
            shares.append([i for _, i in sampler])
        assert len(shares[0]) == len(shares[1]) == 78
        assert not set(shares[0]) & set(shares[1])


def test_a_missing_shard_is_named_with_its_url_at_start_up(tmp_path) -> None:
    write_images(tmp_path / "images", 12)
    pattern = shards_of(tmp_path / "images", tmp_path / "shards", "--max-samples", "4")
    (tmp_path / "shards" / "train-000001.tar").unlink()
    cfg = make_cfg("data=shards", f'data.urls="{pattern}"', "data.monitor_size=2")
    with pytest.raises(ConfigError, match=r"data.urls=.*shard 2 of 3 cannot be opened: .*train-000001.tar"):
        validate_data(cfg)
    not_tar = tmp_path / "junk-0.tar"
    not_tar.write_bytes(b"no tar at all" * 100)
    cfg = make_cfg("data=shards", f"data.urls={not_tar}", "data.monitor_size=2")
    with pytest.raises(ConfigError, match=r"shard 1 of 1 is not a tar file: .*junk-0.tar"):
        validate_data(cfg)


def test_truncated_shards_and_undecodable_samples_are_skipped_and_counted(tmp_path, caplog) -> None:
    """A shard cut short (the manifest says more bytes) loses the samples past the cut: each is
    replaced by the next readable image and named ``<url>#<key>`` once; a member whose bytes are
    no image likewise. Without a manifest the header scan keeps the complete samples."""
    write_images(tmp_path / "images", 8)
    urls = expand_urls(shards_of(tmp_path / "images", tmp_path / "shards", "--max-samples", "4"))
    cut = Path(urls[0])
    cut.write_bytes(cut.read_bytes()[: shard_index(urls)[0].offset[1] + 100])  # inside the second image
    with caplog.at_level(logging.WARNING):
        index, truncated = shard_index(urls)
    assert truncated == [str(cut)]
    ds, seen = ShardImages(index), set()
    items = [ds[i] for i in range(len(ds))]
    assert [bad for _, _, bad in items][1:4] == [f"{cut}#{k:06d}" for k in (1, 2, 3)]
    assert torch.equal(pixels(items[1][0]), pixels(items[4][0]))  # replaced by the next readable
    with caplog.at_level(logging.WARNING):
        note_skipped(seen, [bad for _, _, bad in items] * 2)
    assert len(seen) == 3 and caplog.text.count("skipping unreadable image") == 3
    assert "do not decode" in caplog.text
    os.remove(tmp_path / "shards" / "manifest.json")
    scanned, truncated = shard_index(urls)
    assert truncated == [str(cut)] and scanned.counts() == [1, 4]

    junk = tmp_path / "junk"
    junk.mkdir()
    with tarfile.open(junk / "j-0.tar", "w") as tar:
        for name, data in (("a.jpg", b"\xff\xd8 not a jpeg"), ("b.png", b"")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add(sorted((tmp_path / "images").rglob("*.jpg"))[0], arcname="c.jpg")
    ds = ShardImages(shard_index([str(junk / "j-0.tar")])[0])
    assert [bad.rsplit("#", 1)[-1] for _, _, bad in (ds[0], ds[1], ds[2])] == ["a", "b", ""]


def test_fsspec_urls_read_a_batch_together_as_local_shards_read_it(tmp_path) -> None:
    """Shards written to an fsspec URL (memory://, in this process) are indexed from the manifest
    there and read a batch at a time (``__getitems__`` -> one ``cat_ranges`` call): the same
    items as from the local copy."""
    import fsspec

    write_images(tmp_path / "images", 10)
    assert make_shards([str(tmp_path / "images"), "memory://hvp/shards", "--max-samples", "4"]) == 0
    local = expand_urls(shards_of(tmp_path / "images", tmp_path / "local", "--max-samples", "4"))
    remote = expand_urls("memory://hvp/shards/train-{000000..000002}.tar")
    calls = []
    fs = fsspec.filesystem("memory")
    real = fs.cat_ranges
    fs.cat_ranges = lambda *a, **k: calls.append(len(a[0])) or real(*a, **k)
    try:
        views = (ViewAug(size=8),)
        got = [
            MultiViewDataset(ShardImages(shard_index(urls)[0]), MultiViewTransform(views, 0)).__getitems__(
                [(1, i) for i in (9, 0, 4, 5)]
            )
            for urls in (remote, local)
        ]
    finally:
        fs.cat_ranges = real
        fs.rm("/hvp", recursive=True)
    assert calls == [4]
    for a, b in zip(*got, strict=True):
        assert a["index"] == b["index"] and torch.equal(a["views"][0], b["views"][0])


# --- object storage for real: a local S3 server (moto) on 127.0.0.1 ------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_server():
    """A moto S3 server on a free loopback port for the test's length: its endpoint URL."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed: no local S3 server (uv sync)")
    pytest.importorskip("s3fs", reason="s3fs is not installed: no s3:// (uv sync --extra s3)")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"the moto S3 server did not listen on {endpoint} within 60 s")
    yield endpoint
    proc.terminate()
    proc.wait(timeout=30)


S3_RUN = [  # 32 training images, batch 8: 4 steps
    "logger=csv",
    "trainer=cpu",
    "method=simsiam_cifar",
    "method.batch_size=8",
    "method.proj_hidden_dim=64",
    "method.proj_dim=32",
    "backbone.width=8",
    "data.crop_size=16",
    "trainer.max_epochs=1",
    "eval.at_start=false",
    "+trainer.enable_progress_bar=false",
]
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.mark.slow
def test_one_epoch_from_a_local_s3_server(tmp_path, s3_server, monkeypatch) -> None:
    """hvp-make-shards writes straight to s3:// on the local server; train.py trains one epoch
    from there (manifest read from the bucket, images by ranged GETs, 2 loader workers) and
    ends like the same run on the local copy of the shards."""
    import s3fs

    for key, value in S3_ENV.items():  # moto's dummy credentials, for this test only
        monkeypatch.setenv(key, value)
    options = {"client_kwargs": {"endpoint_url": s3_server}}
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("hvp-test")
    write_images(tmp_path / "images", 40)
    cli = [sys.executable, "-m", "hvp_lightning.data.make_shards", str(tmp_path / "images")]
    env = dict(os.environ, FSSPEC_S3_ENDPOINT_URL=s3_server)
    made = subprocess.run(
        [*cli, "s3://hvp-test/shards", "--max-samples", "16"], env=env, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr[-2000:]
    assert sorted(fs.ls("hvp-test/shards")) == [f"hvp-test/shards/{n}" for n in ("manifest.json", *TRAIN3)]
    local = shards_of(tmp_path / "images", tmp_path / "local", "--max-samples", "16")
    base = [*S3_RUN, "data=shards", "data.monitor_size=8", "data.num_workers=2"]
    summaries = []
    for name, urls, extra in (
        (
            "s3",
            "s3://hvp-test/shards/train-{000000..000002}.tar",
            [f"+data.storage_options.client_kwargs.endpoint_url={s3_server}"],
        ),
        ("local", local, []),
    ):
        proc = subprocess.run(
            [sys.executable, "train.py", *base, f'data.urls="{urls}"', *extra, f"hydra.run.dir={tmp_path / name}"],
            cwd=REPO,
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_TIMEOUT_S,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        summaries.append(json.loads((tmp_path / name / "summary.json").read_text()))
    keys = ("train_loss", "steps", "monitor_rankme", "monitor_feature_std")
    assert summaries[0]["steps"] == 4
    assert {k: summaries[0][k] for k in keys} == {k: summaries[1][k] for k in keys}


TRAIN3 = ("train-000000.tar", "train-000001.tar", "train-000002.tar")
