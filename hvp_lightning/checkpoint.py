"""Checkpoints: atomic writes, resumable runs, safe loading.

* :class:`AtomicCheckpointIO` -- every checkpoint is written to a temporary file in the same
  folder, flushed to disk and then ``os.replace``-d over the target, so a crash (or SIGKILL)
  while writing leaves the previous ``last.ckpt`` intact, never a truncated one. (Lightning's
  own writer stages the bytes in ``/tmp`` and copies them over, which is not atomic across
  file systems.)
* :class:`RunCheckpoint` -- ``checkpoints/last.ckpt`` after every training epoch and a kept
  copy ``checkpoints/epoch=NNN.ckpt`` every ``checkpoint.every_n_epochs`` epochs; its state
  in the checkpoint holds the RNG streams (torch CPU/CUDA, NumPy, Python), which Lightning
  does not save, so a resumed run draws the same augmentations as an uninterrupted one.
* :func:`load_checkpoint` -- ``torch.load(weights_only=True)``: our checkpoints hold only
  tensors and plain containers (the config is stored as a plain dict), so the unpickler
  never has to run arbitrary code. Missing, truncated or foreign files raise
  :class:`CheckpointError` with one readable line.
* :func:`resume_checkpoint` / :func:`resume_config` -- what ``train.py resume=<run_dir>``
  (or a run dir that already holds ``checkpoints/last.ckpt``) continues from.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint
from omegaconf import DictConfig, OmegaConf

from .config import ConfigError

log = logging.getLogger(__name__)

LAST = "last.ckpt"
WANDB_ID_FILE = "wandb_run_id"
# Config parts that define the model and its training data: a run dir whose last.ckpt
# disagrees on these holds a different run, which is never continued silently.
RUN_IDENTITY = ("method", "backbone", "hvp", "data.name")


class CheckpointError(ConfigError):
    """A checkpoint (or run dir) cannot be used; the message is meant for the user as is."""


# --- atomic writes ---------------------------------------------------------------------------
def atomic_write(path: str | Path, write: Callable[[Any], None]) -> None:
    """Call ``write(file)`` on a temporary file next to ``path``, fsync, then rename it over
    ``path``. Readers see the old file or the complete new one, nothing in between."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:  # some file systems refuse fsync on directories
        pass


def atomic_save(obj: Any, path: str | Path) -> None:
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_copy(src: str | Path, dst: str | Path) -> None:
    def write(f):
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, 16 << 20)

    atomic_write(dst, write)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO: atomic local writes and ``weights_only=True`` reads."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO does not take storage_options")
        atomic_save(checkpoint, path)

    def load_checkpoint(self, path, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        return load_checkpoint(path, map_location=map_location or "cpu")


# --- safe loading ------------------------------------------------------------------------------
def load_checkpoint(path: str | Path, map_location: Any = "cpu", mmap: bool = False, key: str = "ckpt") -> dict[str, Any]:
    """Load one of our Lightning checkpoints with ``torch.load(weights_only=True)``.

    Raises :class:`CheckpointError` (naming ``key`` and the path) when the file is missing,
    truncated / not a PyTorch file, holds objects ``weights_only`` refuses, or is not an
    hvp-lightning checkpoint (no ``state_dict`` and ``hyper_parameters.cfg``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{key}={str(path)!r} is not allowed: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # noqa: BLE001 -- every failure mode gets the same one-line answer
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if zipfile.is_zipfile(path) and "Unsupported global" in str(err):
            why = ("it holds Python objects that torch.load(weights_only=True) refuses to unpickle "
                   "(not written by hvp-lightning, or written by an unsafe tool)")
        else:  # EOFError, zip reader errors, OSError(EINVAL) on a cut-off archive, pickle garbage
            why = "the file is truncated or not a PyTorch checkpoint"
        raise CheckpointError(f"{key}={str(path)!r} is not allowed: {why} ({type(err).__name__}: {msg[:200]})") from None
    cfg = ckpt.get("hyper_parameters", {}).get("cfg") if isinstance(ckpt, dict) else None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or not isinstance(cfg, dict) or "method" not in cfg:
        found = sorted(ckpt)[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(f"{key}={str(path)!r} is not allowed: not an hvp-lightning training checkpoint "
                              f"(expected 'state_dict' and 'hyper_parameters.cfg'; found {found})")
    return ckpt


def checkpoint_config(ckpt: dict[str, Any]) -> DictConfig:
    """The training config stored in a checkpoint (resolved, with ``data.num_classes``)."""
    return OmegaConf.create(ckpt["hyper_parameters"]["cfg"])


def resolve_checkpoint(path: str | Path, key: str = "ckpt") -> tuple[Path, Path]:
    """``(checkpoint file, run dir)`` for a run dir (its ``checkpoints/last.ckpt``) or a
    ``.ckpt`` file (its run dir is the folder above ``checkpoints/``)."""
    p = Path(str(path)).expanduser()
    if p.is_dir():
        last = p / "checkpoints" / LAST
        if last.is_file():
            return last, p
        if (p / LAST).is_file():  # the checkpoints/ folder itself
            return p / LAST, p.parent if p.name == "checkpoints" else p
        raise CheckpointError(f"{key}={str(path)!r} is not allowed: a run dir with checkpoints/{LAST} or a .ckpt file "
                              f"(no checkpoints/{LAST} in that folder)")
    if not p.is_file():
        raise CheckpointError(f"{key}={str(path)!r} is not allowed: a run dir or a .ckpt file (nothing at that path)")
    run_dir = p.parent.parent if p.parent.name == "checkpoints" else p.parent
    return p, run_dir


def build_method(ckpt: dict[str, Any], key: str = "ckpt"):
    """The LightningModule of a loaded checkpoint, weights restored (strict), in eval mode."""
    from .methods import METHODS

    cfg = checkpoint_config(ckpt)
    name = cfg.method.get("name")
    if name not in METHODS:
        raise CheckpointError(f"{key}: method.name={name!r} in the checkpoint is not one of {', '.join(METHODS)}")
    model = METHODS[name](cfg)
    missing, unexpected = model.load_state_dict(ckpt["state_dict"], strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{key}: the checkpoint's weights do not fit its own config ({name}, "
                              f"{cfg.backbone.name}): missing {missing[:4]}, unexpected {unexpected[:4]}")
    model.on_load_checkpoint(ckpt)
    return model.eval()


# --- RNG state (Lightning does not checkpoint it) -----------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every RNG stream the data pipeline and the training step draw from, as tensors and
    plain Python values only (so the checkpoint still loads with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()  # type: ignore[misc]
    version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": version, "state": list(py_state), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


class RunCheckpoint(Checkpoint):
    """``last.ckpt`` after every training epoch (after that epoch's k-NN, if any) and a kept
    ``epoch=NNN.ckpt`` every ``every_n_epochs`` epochs (0/None: last only). Writes go through
    the trainer, so with :class:`AtomicCheckpointIO` as plugin each file appears atomically.

    Its checkpoint state is the RNG streams of every rank, restored on resume."""

    def __init__(self, dirpath: str | Path, every_n_epochs: int | None = None) -> None:
        super().__init__()
        self.dirpath = Path(dirpath)
        self.every_n_epochs = int(every_n_epochs or 0)
        self.last_path = self.dirpath / LAST
        self._trainer = None

    @property
    def state_key(self) -> str:
        return "RunCheckpoint"

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._trainer = trainer
        if trainer.is_global_zero and self.dirpath.is_dir():  # temporaries of a writer that was killed
            for tmp in self.dirpath.glob(".*.tmp-*"):
                tmp.unlink(missing_ok=True)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or trainer.fast_dev_run:
            return
        for logger in trainer.loggers:  # metrics up to this checkpoint reach the disk with it
            logger.save()
        epoch = trainer.current_epoch + 1
        keep = self.every_n_epochs and epoch % self.every_n_epochs == 0
        target = self.dirpath / f"epoch={epoch:03d}.ckpt" if keep else self.last_path
        trainer.save_checkpoint(target, weights_only=False)
        if keep and trainer.is_global_zero:
            atomic_copy(target, self.last_path)  # last.ckpt last: it is what a resume continues from

    def state_dict(self) -> dict[str, Any]:
        own = rng_state()
        trainer = self._trainer
        if trainer is not None and trainer.world_size > 1 and torch.distributed.is_initialized():
            states: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(states, own)  # every rank dumps the checkpoint
            return {"rng": states}
        return {"rng": [own]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get("rng") or []
        trainer = self._trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if len(states) == world:
            set_rng_state(states[rank])
        elif states:
            log.warning("resume: the checkpoint holds RNG states of %d processes, this run has %d; "
                        "random streams continue from a fresh seed", len(states), world)


# --- resuming -----------------------------------------------------------------------------------
def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            out += _differences(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} there, {b!r} here"]


def resume_checkpoint(cfg: DictConfig, run_dir: Path) -> Path | None:
    """The checkpoint this run continues from, or None for a fresh run.

    ``run_dir/checkpoints/last.ckpt`` is resumed automatically when it exists; ``resume=`` set
    without one is an error, and so is a last.ckpt of a different run (method, backbone, HVP
    or dataset differ) -- a new run never overwrites an old one's checkpoints."""
    last = Path(run_dir) / "checkpoints" / LAST
    asked = cfg.get("resume")
    if not last.is_file():
        if asked:
            raise CheckpointError(f"resume={str(asked)!r} is not allowed: a run dir holding checkpoints/{LAST} "
                                  f"(none in {run_dir})")
        return None
    ckpt = load_checkpoint(last, mmap=True, key="resume" if asked else "checkpoint")
    there = checkpoint_config(ckpt)
    diffs: list[str] = []
    for key in RUN_IDENTITY:
        a, b = OmegaConf.select(there, key), OmegaConf.select(cfg, key)
        a = OmegaConf.to_container(a, resolve=True) if isinstance(a, DictConfig) else a
        b = OmegaConf.to_container(b, resolve=True) if isinstance(b, DictConfig) else b
        if key == "hvp":  # absent and disabled are the same run
            a = a if a and a.get("enabled") else None
            b = b if b and b.get("enabled") else None
        diffs += _differences(a, b, f"{key}.")
    diffs.sort(key=lambda d: not d.split(":")[0].endswith(".name"))  # the method/backbone name first
    if diffs:
        raise CheckpointError(f"run dir {str(run_dir)!r} already holds {last.name} of a different run "
                              f"({'; '.join(diffs[:3])}): use a new run dir, or resume={run_dir} to continue that run")
    return last


def resume_config(run_dir: str | Path, overrides: list[str] = ()) -> DictConfig:
    """The config of the run in ``run_dir`` (from its last checkpoint) with command-line
    ``key=value`` overrides of existing keys applied (e.g. ``trainer.max_epochs=200`` to
    extend a run). Group overrides (``method=dino``, ``+hvp=on``) would make it another run:
    they are refused."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    last, run_dir = resolve_checkpoint(run_dir, key="resume")
    cfg = checkpoint_config(load_checkpoint(last, mmap=True, key="resume"))
    groups = ("method", "backbone", "data", "trainer", "logger", "hvp", "data/aug")
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        key = ov.key_or_group
        if key == "resume" or key.startswith("hydra."):
            continue
        if ov.is_add() or ov.is_delete() or key in groups or OmegaConf.select(cfg, key, default="<absent>") == "<absent>":
            raise CheckpointError(f"{ov.input_line} is not allowed with resume: the run continues with its own config; "
                                  f"only key=value overrides of existing keys (e.g. trainer.max_epochs=...) apply")
        OmegaConf.update(cfg, key, ov.value(), merge=False)
    with_resume = OmegaConf.merge(cfg, {"resume": str(run_dir)})
    assert isinstance(with_resume, DictConfig)
    return with_resume


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id of this run dir (created on first use), so a resumed run continues
    the same W&B run."""
    path = Path(run_dir) / WANDB_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    import secrets

    run_id = secrets.token_hex(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id


def continue_csv_log(logger) -> None:
    """Make Lightning's CSV log survive interruptions. Its writer deletes an existing
    metrics.csv when it starts, knows only the columns it has seen itself, and adds a column
    by truncating and rewriting the file (a kill then loses the rows). Put a resumed run's old
    rows back, seed the writer with their header, and make the rewrite atomic."""
    import csv
    import io
    import warnings

    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank != 0:  # only rank 0 writes the log
        return
    path = Path(logger.log_dir) / "metrics.csv"
    old = path.read_bytes() if path.is_file() else None
    with warnings.catch_warnings():  # "Previous log files ... will be deleted": not any more
        warnings.filterwarnings("ignore", message="Experiment logs directory")
        exp = logger.experiment
    if old:
        atomic_write(path, lambda f: f.write(old))
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        exp.metrics_keys = sorted(set(header) | set(exp.metrics_keys))

    def rewrite_with_new_header(fieldnames: list[str]) -> None:
        with open(exp.metrics_file_path, newline="") as f:
            rows = list(csv.DictReader(f))
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(exp.metrics_file_path, lambda f: f.write(text.getvalue().encode()))

    exp._rewrite_with_new_header = rewrite_with_new_header
