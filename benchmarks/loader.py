"""View-pipeline throughput, measured by hand (a benchmark, not a test).

Builds the training views of a method preset exactly as ``train.py`` does (Hydra config,
``run_view_augs``, :class:`SSLDataModule`) over an ImageNet-layout JPEG folder and
times, in interleaved rounds so that machine noise hits all alike:

* ``pipeline``: the views as training gets them, end to end: loader workers (decode, crop,
  flip: uint8) + the batched colour/normalise part on ``--device`` after the transfer, or for
  ``--device cpu`` in the workers, per image after its crops (where ``train.py`` puts it on CPU);
* ``workers``: uint8 crops alone (what stays on the CPU when the batched part runs on a GPU);
* ``colour_in_main`` (CPU only): the batched part in the main process after the transfer;
* ``shards`` and ``workers_shards`` (``--shards``): ``pipeline`` and ``workers`` on the same
  images read from WebDataset shards (``data=shards``; the folder's train split converted once by
  ``hvp-make-shards``, 8 MB shards);
* ``reference`` (``--reference``): every view finished per image in the workers with
  torchvision's kernels (``augment``) from PIL-decoded images: the pipeline before the
  batched part and the JPEG fast path existed.

``--data synthetic`` (the built-in textures, ``--image-size`` px, ``--images`` of them) or
``--data cifar10 --root DIR`` (torchvision's files) time an in-memory dataset instead; with
``--on-device`` the ``pipeline`` arm is then ``data.on_device=true`` (images held on
``--device``, views cut and coloured there from index batches, no workers) and a ``loader`` arm
times the loader path on the same data for comparison.

``--step`` instead times whole Lightning training steps fed by that loader (``trainer.fit``
on ``--batches`` batches after ``--warmup``), images/s end to end; with ``--on-device`` the
``step`` arm holds the images on the device and a ``step_loader`` arm, interleaved, feeds the
same steps from loader workers.

Without ``--root`` an ImageNet-like folder is generated once (``--images`` JPEGs of about
450x400, smooth colour fields with shapes, quality 90) under ``benchmarks/.cache/``.
The last line is ``images/s: <number>`` (median over rounds of the main measurement).

    uv run python benchmarks/loader.py --method simsiam --crop 224 --views 4 --workers 2 \\
        --batches 10 --device cpu --reference
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import os
import platform
import shlex
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from hydra import compose, initialize_config_dir
from torch.utils.data import DataLoader

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hvp_lightning.data.augment import ViewAug, augment, to_uint8_tensor  # noqa: E402
from hvp_lightning.data.datamodule import SSLDataModule  # noqa: E402
from hvp_lightning.data.datasets import SafeImageFolder, load_image  # noqa: E402
from hvp_lightning.data.items import MultiViewDataset  # noqa: E402
from hvp_lightning.data.make_shards import main as make_shards  # noqa: E402
from hvp_lightning.data.seeds import view_key  # noqa: E402
from hvp_lightning.schema import TrainConfig, train_settings  # noqa: E402
from hvp_lightning.schema.data import ShardsData  # noqa: E402
from hvp_lightning.training.build import build_method, run_view_augs  # noqa: E402

METHOD_PRESETS = sorted(p.stem for p in (REPO / "conf" / "method").glob("*.yaml"))  # simsiam, simsiam_cifar, ...


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--method", choices=METHOD_PRESETS, default="simsiam", help="a conf/method preset")
    p.add_argument("--data", choices=("imagefolder", "synthetic", "cifar10"), default="imagefolder")
    p.add_argument(
        "--root",
        type=Path,
        default=None,
        help="imagefolder: ImageNet-layout folder (train/<class>/*), default generated JPEGs; "
        "cifar10: torchvision's CIFAR-10 folder",
    )
    p.add_argument("--images", type=int, default=512, help="images in the generated folder (synthetic: textures)")
    p.add_argument("--image-size", type=int, default=32, help="--data synthetic: side of the generated images")
    p.add_argument(
        "--on-device",
        action="store_true",
        help="time data.on_device=true as the pipeline (in-memory data, or a folder of one image size)",
    )
    p.add_argument("--crop", type=int, default=224, help="data.crop_size (DINO/iBOT: the global crop)")
    p.add_argument("--views", type=int, default=4, help="candidate views per image: > 2 turns HVP on (hvp.num_views)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=10, help="timed batches per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches first (worker start-up, allocator)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu", help="where the batched part (and with --step the model) runs")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the main process")
    p.add_argument("--reference", action="store_true", help="also time the per-image torchvision pipeline")
    p.add_argument(
        "--shards",
        action="store_true",
        help="also time the pipeline on the same images read from WebDataset shards (hvp-make-shards, once)",
    )
    p.add_argument("--skip-main-colour", action="store_true", help="CPU: leave out the colour_in_main arm")
    p.add_argument("--step", action="store_true", help="time whole Lightning steps instead of the loader")
    p.add_argument("--backbone", default="resnet18_narrow", help="backbone preset for --step")
    p.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides (key=value)")
    p.add_argument("--out", type=Path, default=None, help="append a markdown section to this file")
    return p.parse_args(argv)


# --- data ---------------------------------------------------------------------------------------


def make_jpeg_folder(root: Path, n: int, classes: int = 8, seed: int = 0) -> Path:
    """ImageNet-like JPEGs (~450x400, varied sizes) in ``root/{train,val}/<class>/``, once."""
    from PIL import Image, ImageDraw

    done = root / f".complete-{n}"
    if done.exists():
        return root
    rng = np.random.default_rng(seed)
    for split, count in (("train", n), ("val", max(classes, n // 8))):
        for i in range(count):
            w, h = int(rng.integers(400, 500)), int(rng.integers(350, 450))
            low = rng.random((6, 6, 3)) * 255
            img = Image.fromarray(low.astype(np.uint8)).resize((w, h), Image.BICUBIC)
            draw = ImageDraw.Draw(img)
            for _ in range(6):
                x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
                box = (x0, y0, x0 + int(rng.integers(20, 200)), y0 + int(rng.integers(20, 200)))
                draw.ellipse(box, fill=tuple(int(c) for c in rng.integers(0, 255, 3)))
            noise = rng.normal(0, 6, (h, w, 3))
            arr = np.clip(np.asarray(img, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
            d = root / split / f"c{i % classes}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(arr).save(d / f"{i:05d}.jpg", quality=90)
    done.touch()
    return root


def shard_pattern(root: Path, shard_size: str = "8MB") -> str:
    """The brace pattern of ``root``'s train split as shards (``hvp-make-shards``, once, beside it)."""
    out = root.parent / f"{root.name}-shards"
    if not (out / "manifest.json").exists():
        if make_shards([str(root), str(out), "--shard-size", shard_size]) != 0:
            raise SystemExit(f"hvp-make-shards {root} {out} failed")
    names = sorted(p.name for p in out.glob("train-*.tar"))
    return f"{out}/train-{{{names[0][6:-4]}..{names[-1][6:-4]}}}.tar"


def build_cfg(args: argparse.Namespace, root: Path | None) -> TrainConfig:
    """The run's config (conf/ via Hydra, as tests/conftest.py), validated: the typed config the
    package's builders take."""
    data = {
        "imagefolder": ["data=imagefolder", f"data.root={root}"],
        "cifar10": ["data=cifar10", f"data.root={root}"],
        "synthetic": ["data=synthetic", f"data.image_size={args.image_size}", f"data.train_size={args.images}"],
    }
    overrides = [
        f"method={args.method}",
        *data[args.data],
        f"data.on_device={str(args.on_device).lower()}",
        f"data.crop_size={args.crop}",
        f"data.num_workers={args.workers}",
        f"method.batch_size={args.batch_size}",
        f"backbone={args.backbone}",
        "logger=csv",
        "trainer=cpu" if args.device == "cpu" else "trainer=gpu",
    ]
    if args.views > 2:
        overrides += ["+hvp=on", f"hvp.num_views={args.views}"]
    if args.data == "imagefolder":
        overrides.append("data.eval_crop_ratio=0.875")
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return train_settings(compose("config", overrides=[*overrides, *args.override]))


@dataclass(frozen=True)
class ReferenceViews:
    """The pipeline before this benchmark's batched part: whole views per image in the workers."""

    augs: tuple[ViewAug, ...]

    def __call__(self, img, epoch: int, index: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        img = to_uint8_tensor(img)
        views, plist = zip(*(augment(img, a, view_key(0, epoch, index, slot)) for slot, a in enumerate(self.augs)))
        return list(views), {k: torch.stack([p[k] for p in plist]) for k in plist[0]}


# --- timing -------------------------------------------------------------------------------------


def timed_batches(
    loader: DataLoader, finish: Callable[[Any], Any], device: torch.device, warmup: int, count: int
) -> float:
    """Images/s over ``count`` batches after ``warmup``: fetch, move to ``device``, ``finish``.
    ``loader`` must not keep its workers: dropping the iterator at the end stops them, so the
    batches they were prefetching are not made while the next arm is timed."""
    it: Iterator = iter(loader)
    start = images = 0.0
    for i in range(warmup + count):
        if i == warmup:
            _sync(device)
            start, images = time.perf_counter(), 0
        batch = next(it)
        if isinstance(batch, torch.Tensor):  # indices of resident images
            out = finish(batch.to(device, non_blocking=True))
        else:
            views = [v.to(device, non_blocking=True) for v in batch["views"]]
            params = {k: v.to(device, non_blocking=True) for k, v in batch["params"].items()}
            out = finish(dict(batch, views=views, params=params))
        images += out["views"][0].shape[0]
    _sync(device)
    rate = images / (time.perf_counter() - start)
    del it  # shuts the workers down (they skip their queued batches) before the next arm
    return rate


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_images(args: argparse.Namespace, dm: SSLDataModule) -> None:
    """A round's batches must fit in one pass over the training images: a fit runs one epoch
    (``--step``), and a shorter one would time fewer batches than asked, its end-of-epoch work
    and teardown included (512 images are 8 batches of 64: of 2 + 20 asked, 6 would be timed)."""
    need = (args.warmup + args.batches) * args.batch_size
    if len(dm.train_set) < need:
        raise SystemExit(f"--images: {len(dm.train_set)} training images, a round needs {need}")


def loader_rounds(args: argparse.Namespace, cfg: TrainConfig, device: torch.device) -> dict[str, list[float]]:
    def module(colour_in_workers: bool, on_device: bool = False, shards: str | None = None) -> SSLDataModule:
        return datamodule(args, cfg, on_device, colour_in_workers, shards)

    on_cpu = device.type == "cpu"
    dm, uint8 = module(on_cpu, args.on_device), module(False)  # as train.py runs it; crops only
    arms: dict[str, tuple[DataLoader, Callable[[Any], Any]]] = {
        "pipeline": (dm.train_dataloader(), lambda b: dm.on_after_batch_transfer(b, 0)),
        "workers": (uint8.train_dataloader(), lambda b: b),
    }
    if args.on_device:  # the loader path on the same in-memory data
        via_loader = module(on_cpu)
        arms["loader"] = (via_loader.train_dataloader(), lambda b: via_loader.on_after_batch_transfer(b, 0))
    if on_cpu and not args.skip_main_colour:  # the alternative on CPU: colour in the training process
        arms["colour_in_main"] = (uint8.train_dataloader(), lambda b: uint8.on_after_batch_transfer(b, 0))
    if args.shards:
        if args.data != "imagefolder":
            raise SystemExit("--shards needs --data imagefolder (the shards are made of its train split)")
        pattern = shard_pattern(Path(str(cfg.data.root)))
        on_shards, uint8_shards = module(on_cpu, shards=pattern), module(False, shards=pattern)
        arms["shards"] = (on_shards.train_dataloader(), lambda b: on_shards.on_after_batch_transfer(b, 0))
        arms["workers_shards"] = (uint8_shards.train_dataloader(), lambda b: b)
    if args.reference:
        raw = copy.copy(uint8.train_raw)
        if isinstance(raw, SafeImageFolder):
            raw.loader = load_image  # PIL decoding, as before the JPEG fast path
        ref = MultiViewDataset(raw, ReferenceViews(uint8.views))  # type: ignore[arg-type]
        arms["reference"] = (DataLoader(ref), lambda b: b)
    # Fresh workers per timed run (started during the warm-up batches): persistent ones would
    # go on making the previous arm's prefetched batches while the next arm is timed.
    arms = {
        name: (
            DataLoader(
                loader.dataset,
                batch_size=args.batch_size,
                shuffle=True,
                drop_last=True,
                num_workers=args.workers,
                pin_memory=device.type == "cuda",
                collate_fn=loader.collate_fn,
            ),
            finish,
        )
        if loader.num_workers or name != "pipeline" or not args.on_device
        else (loader, finish)
        for name, (loader, finish) in arms.items()
    }
    check_images(args, dm)
    res: dict[str, list[float]] = {k: [] for k in arms}
    for r in range(args.rounds):  # the arms' order reversed every other round: no arm always runs first
        for name, (loader, finish) in list(arms.items())[:: 1 if r % 2 == 0 else -1]:
            res[name].append(timed_batches(loader, finish, device, args.warmup, args.batches))
            print(f"round {r + 1} {name}: {res[name][-1]:.1f} images/s", flush=True)
    return res


class StepClock(L.Callback):
    """Images from batch ``warmup`` on: ``start`` at that batch's start and ``end`` at the last
    batch's end, each after a device sync (the fit's end-of-epoch work and teardown are after it)."""

    def __init__(self, warmup: int, device: torch.device) -> None:
        self.warmup, self.device = warmup, device
        self.start = self.end = 0.0
        self.images = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.warmup:
            _sync(self.device)
            self.start, self.images = time.perf_counter(), 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx >= self.warmup:
            self.images += batch["label"].shape[0]
        if batch_idx + 1 == trainer.num_training_batches:
            _sync(self.device)
            self.end = time.perf_counter()


def datamodule(
    args: argparse.Namespace,
    cfg: TrainConfig,
    on_device: bool = False,
    colour_in_workers: bool | None = None,
    shards: str | None = None,
) -> SSLDataModule:
    """``cfg.data`` (held on the device with ``on_device``; through ``data=shards`` of the same
    images with ``shards``, no held-out monitor sample) as the method's views, set up.
    ``colour_in_workers`` None: where a fit's device puts it (:class:`SSLDataModule`)."""
    data = cfg.data.model_copy(update={"on_device": on_device})
    if shards:
        values = {k: v for k, v in data.model_dump().items() if k in ShardsData.model_fields}
        data = ShardsData.model_validate({**values, "name": "shards", "urls": shards, "monitor_size": 0})
    dm = SSLDataModule(
        data,
        run_view_augs(cfg),
        args.batch_size,
        args.workers,
        cfg.seed,
        colour_in_workers=colour_in_workers,
    )
    dm.setup("fit")
    return dm


def step_datamodule(
    args: argparse.Namespace, cfg: TrainConfig, on_device: bool = False, colour_in_workers: bool | None = None
) -> SSLDataModule:
    """The training data of ``--step`` (:func:`datamodule`). The colour placement is decided from
    the trainer's device when fit builds the loader."""
    return datamodule(args, cfg, on_device, colour_in_workers)


def step_trainer(cfg: TrainConfig, device: torch.device, batches: int, callbacks: list[L.Callback]) -> L.Trainer:
    """The Lightning trainer of ``--step``: one device, ``cfg``'s precision, ``batches`` training
    batches, no validation, logging, checkpoints or progress bar."""
    return L.Trainer(
        accelerator="cpu" if device.type == "cpu" else "gpu",
        devices=1,
        max_epochs=1,
        precision=cfg.trainer.precision,
        limit_train_batches=batches,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        num_sanity_val_steps=0,
    )


def step_rounds(args: argparse.Namespace, cfg: TrainConfig, device: torch.device) -> dict[str, list[float]]:
    """Whole Lightning steps fed by the real loader: images/s between batch ``warmup`` and the
    fit's return (its teardown included)."""
    variants = {"step": bool(args.on_device)}
    if args.on_device:  # the worker path on the same data, interleaved
        variants["step_loader"] = False
    res: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name, on_device in variants.items():
            L.seed_everything(cfg.seed + r, workers=True, verbose=False)
            dm = step_datamodule(args, cfg, on_device)
            check_images(args, dm)
            model = build_method(cfg)
            clock = StepClock(args.warmup, device)
            trainer = step_trainer(cfg, device, args.warmup + args.batches, [clock])
            trainer.fit(model, datamodule=dm)
            _sync(device)
            res[name].append(clock.images / (time.perf_counter() - clock.start))
            print(f"round {r + 1} {name}: {res[name][-1]:.2f} images/s", flush=True)
    return res


# --- report -------------------------------------------------------------------------------------


def report(args: argparse.Namespace, res: dict[str, list[float]], device: torch.device, argv: list[str]) -> str:
    lines = ["| arm | median images/s | min | max | rounds |", "|---|---|---|---|---|"]
    for name, v in res.items():
        lines.append(f"| {name} | {statistics.median(v):.1f} | {min(v):.1f} | {max(v):.1f} | {len(v)} |")
    for base, names in (
        ("reference", ("pipeline", "workers")),
        ("pipeline", ("shards",)),
        ("workers", ("workers_shards",)),
        ("loader", ("pipeline", "workers")),
        ("step_loader", ("step",)),
    ):
        for name in (n for n in names if base in res and n in res):  # the arms this run had
            ratios = [a / b for a, b in zip(res[name], res[base])]
            lines.append(
                f"| {name} / {base} (per round) | {statistics.median(ratios):.2f}x | {min(ratios):.2f}x | "
                f"{max(ratios):.2f}x | {len(ratios)} |"
            )
    head = (
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, "
        f"device {device}, torch {torch.__version__}, main-process threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    cmd = "uv run python benchmarks/loader.py " + " ".join(shlex.quote(a) for a in argv)
    return f"{head}\n\n```bash\n{cmd}\n```\n\n" + "\n".join(lines) + "\n"


def end_on_sigterm() -> None:
    """A SIGTERM (`timeout`, a scheduler) ends the benchmark at once. Without this, Lightning's
    handler stops only the fit in progress and the next round starts: seen on the GPU machine,
    where `timeout 100` left a compiled SimSiam round running for minutes."""
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(128 + signum))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    end_on_sigterm()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.data == "cifar10" and args.root is None:
        raise SystemExit("--data cifar10 needs --root: the folder holding torchvision's cifar-10-batches-py/")
    root = args.root
    if args.data == "imagefolder" and root is None:
        root = make_jpeg_folder(REPO / "benchmarks" / ".cache" / "jpeg", args.images)
    cfg = build_cfg(args, root)
    res = step_rounds(args, cfg, device) if args.step else loader_rounds(args, cfg, device)
    text = report(args, res, device, argv)
    print(text)
    if args.out:
        with args.out.open("a") as f:
            f.write(f"\n### loader.py ({'Lightning step' if args.step else 'view pipeline'})\n\n{text}")
    main_arm = "step" if args.step else "pipeline"
    print(f"images/s: {statistics.median(res[main_arm]):.1f}")


if __name__ == "__main__":
    main()
