"""Checkpoints: atomic writes, resumable runs, safe loading.

* :class:`AtomicCheckpointIO` -- every checkpoint is written to a temporary file in the same
  folder, flushed to disk and then ``os.replace``-d over the target, so a crash (or SIGKILL)
  while writing leaves the previous ``last.ckpt`` intact, never a truncated one. (Lightning's
  own writer stages the bytes in ``/tmp`` and copies them over, which is not atomic across
  file systems.)
* :class:`RunCheckpoint` -- ``checkpoints/last.ckpt`` after every training epoch, every
  ``checkpoint.every_n_steps`` optimiser steps inside an epoch (and at the step where a
  pre-emption signal stops a run: hvp_lightning/training/preemption.py), and a kept copy
  ``checkpoints/epoch=NNN.ckpt`` every ``checkpoint.every_n_epochs`` epochs; its state in the
  checkpoint holds the training process's RNG streams (torch CPU/CUDA, NumPy, Python), which
  Lightning does not save. With the views functions of (seed, epoch, index, slot) and the
  training position in the data module's state (hvp_lightning/data/sampler.py), a run resumed
  from any of these continues exactly as the uninterrupted run went on.
  State that differs between DDP ranks (these RNG streams, HVP's run totals, skipped files)
  is saved with one entry per rank and each rank takes back its own on resume
  (:func:`hvp_lightning.cluster.distributed.gather_per_rank` / ``rank_entries``).
* :class:`RunConfig` -- the run's config in every checkpoint (``checkpoint["hvp_lightning"]["config"]``,
  a plain dict): what a resume, an evaluation and an export rebuild the run from.
* :func:`load_checkpoint` -- ``torch.load(weights_only=True)``: our checkpoints hold only
  tensors and plain containers (the config is stored as a plain dict), so the unpickler
  never has to run arbitrary code. Missing, truncated or foreign files raise
  :class:`CheckpointError` with one readable line.
* :func:`resume_checkpoint` / :func:`resume_config` -- what ``train.py resume=<run_dir>``
  (or a run dir that already holds ``checkpoints/last.ckpt``) continues from.

The run's other records (CSV and W&B logs, the wall time over sessions) continue over a
resume through hvp_lightning/run/records.py.
"""

from __future__ import annotations

import logging
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, Checkpoint
from omegaconf import DictConfig, OmegaConf, open_dict

from ..cluster.distributed import gather_per_rank, rank_and_world
from ..config import stored_config
from ..errors import CheckpointError
from ..run.atomic import atomic_write
from ..run.directory import LAST, RunDir, resolve_checkpoint
from ..run.epoch_metrics import epoch_aggregates
from ..schema import TrainConfig
from ..schema.base import as_dict

log = logging.getLogger(__name__)


# --- atomic writes (hvp_lightning/run/atomic.py) -------------------------------------------------
def atomic_save(obj: Any, path: str | Path) -> None:
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_copy(src: str | Path, dst: str | Path) -> None:
    def write(f: BinaryIO) -> None:
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, 16 << 20)

    atomic_write(dst, write)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning CheckpointIO: atomic local writes and ``weights_only=True`` reads."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO does not take storage_options")
        atomic_save(checkpoint, path)

    def load_checkpoint(
        self, path, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return load_checkpoint(path, map_location=map_location or "cpu")


# --- safe loading ------------------------------------------------------------------------------
def load_checkpoint(
    path: str | Path, map_location: Any = "cpu", mmap: bool = False, key: str = "ckpt"
) -> dict[str, Any]:
    """Load one of our Lightning checkpoints with ``torch.load(weights_only=True)``.

    Raises :class:`CheckpointError` (naming ``key`` and the path) when the file is missing,
    truncated / not a PyTorch file, holds objects ``weights_only`` refuses, or is not an
    hvp-lightning checkpoint (no ``state_dict`` and stored config: :func:`stored_run_config`)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{key}={str(path)!r} is not allowed: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # noqa: BLE001 -- every failure mode gets the same one-line answer
        raise CheckpointError(f"{key}={str(path)!r} is not allowed: {load_failure(path, err)}") from None
    cfg = stored_run_config(ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or not isinstance(cfg, dict) or "method" not in cfg:
        found = sorted(ckpt)[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise CheckpointError(
            f"{key}={str(path)!r} is not allowed: not an hvp-lightning training checkpoint "
            f"(expected 'state_dict' and 'hvp_lightning.config'; found {found})"
        )
    return ckpt


def stored_run_config(ckpt: dict[str, Any]) -> Any:
    """The run config a checkpoint holds as written: ``hvp_lightning.config`` (:class:`RunConfig`),
    or in checkpoints whose method took the whole config, ``hyper_parameters.cfg``; None if neither."""
    stored = (ckpt.get("hvp_lightning") or {}).get("config")
    return stored if stored is not None else (ckpt.get("hyper_parameters") or {}).get("cfg")


class RunConfig(Callback):
    """The run's config in every checkpoint (``checkpoint["hvp_lightning"]["config"]``, resolved,
    plain values): the method keeps its own settings as its hyperparameters, the run the rest."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.config = as_dict(cfg)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        checkpoint.setdefault("hvp_lightning", {})["config"] = self.config


def load_failure(path: Path, err: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed on ``path``, in one line. A file whose pickle
    names Python objects a weights-only load refuses (torch's own list of them,
    ``torch.serialization.get_unsafe_globals_in_checkpoint``) is said to hold them, with torch's
    warning: the workaround, ``weights_only=False``, can run arbitrary code. Anything else is a
    file cut off or not a checkpoint."""
    unsafe = unsafe_globals(path)
    if unsafe:
        return (
            "it holds Python objects that torch.load(weights_only=True) refuses to unpickle "
            f"({', '.join(unsafe[:3])}); "
            "hvp-lightning checkpoints never need them. Loading it with weights_only=False can result in "
            "arbitrary code execution: do that only if you got the file from a trusted source"
        )
    return f"the file is truncated or not a PyTorch checkpoint ({type(err).__name__})"


def unsafe_globals(path: Path) -> list[str] | None:
    """The Python objects a ``torch.save`` file's pickle names that a weights-only load refuses
    (torch's public check, which reads the pickle without running it); None for a file that is
    not a whole ``torch.save`` archive."""
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))
    except Exception:  # noqa: BLE001 -- not an archive torch can read: the caller says so
        return None


def checkpoint_config(ckpt: dict[str, Any]) -> TrainConfig:
    """The training config stored in a checkpoint (resolved, with ``data.num_classes``), as this
    version reads it (:func:`~hvp_lightning.config.stored_config`)."""
    return stored_config(stored_run_config(ckpt))


def pretrained_for(ckpt: dict[str, Any]) -> dict[str, int | None]:
    """How long a checkpoint's weights were trained: whole ``epochs``, ``batches`` into the next and
    optimizer ``steps``. Lightning's ``epoch`` is the index of the epoch under way: finished for a
    checkpoint saved at its last batch, not for one saved inside it (``checkpoint.every_n_steps``,
    a pre-emption), so ``epoch + 1`` would count an epoch that was not trained."""
    epoch = int(ckpt.get("epoch", -1))
    progress = ckpt.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
    unfinished = progress is not None and not progress.get("is_last_batch")
    return {
        "epochs": epoch if unfinished else epoch + 1,
        "batches": int(progress["current"]["completed"]) if unfinished else 0,
        "steps": ckpt.get("global_step"),
    }


def build_method(ckpt: dict[str, Any], key: str = "ckpt"):
    """The LightningModule of a loaded checkpoint, weights restored (strict), in eval mode."""
    from .build import build_method as build

    cfg = checkpoint_config(ckpt)
    model = build(cfg)
    missing, unexpected = model.load_state_dict(ckpt["state_dict"], strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{key}: the checkpoint's weights do not fit its own config ({cfg.method.name}, "
            f"{cfg.backbone.name}): missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
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
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
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
    """``last.ckpt`` after every training epoch (after that epoch's k-NN, if any), after every
    ``every_n_steps``-th optimiser step inside an epoch (0/None: never; through
    :meth:`save_step`) and a kept ``epoch=NNN.ckpt`` every ``every_n_epochs`` epochs (0/None:
    last only). Writes go through the trainer, so with :class:`AtomicCheckpointIO` as plugin
    each file appears atomically.

    Its checkpoint state is the RNG streams of every rank, restored on resume; in a checkpoint
    inside an epoch, every rank's running aggregates of that epoch's ``on_epoch`` metrics (the
    trainer's :class:`~hvp_lightning.run.epoch_metrics.EpochAggregates`), handed back before the
    resumed session's first step, so the epoch's ``*_epoch`` values cover the whole epoch; and the
    last epoch's training loss (mean over ranks), which the run's summary reports -- a resumed run
    that trains nothing more included. (The wall
    time over all sessions is :class:`hvp_lightning.run.records.RunRecord`'s: a session killed
    after its last checkpoint has spent time no checkpoint knows of.)"""

    def __init__(
        self,
        run_dir: str | Path | RunDir,
        every_n_epochs: int | None = None,
        every_n_steps: int | None = None,
        on_step_save: Callable[[Any], None] | None = None,
    ) -> None:
        super().__init__()
        self.on_step_save = on_step_save  # after an every_n_steps save: e.g. note the W&B rewind point
        self.run_dir = RunDir.of(run_dir)
        self.every_n_epochs = int(every_n_epochs or 0)
        self.every_n_steps = int(every_n_steps or 0)
        self.last_path = self.run_dir.last_checkpoint
        self.train_loss: float | None = None  # mean over ranks of the last epoch's train/loss_epoch
        self._rng: dict[str, Any] | None = None  # the RNG state save_step writes instead of the current one
        self._due_rng: dict[str, Any] | None = None  # an every_n_steps save due at the next batch's start
        self._epoch_sums: dict[str, Any] | None = None  # in save_step's save: this rank's partial epoch sums
        self._resumed_sums: dict[str, Any] | None = None  # the checkpoint's (this rank's), until restored

    @property
    def state_key(self) -> str:
        return "RunCheckpoint"

    def setup(self, trainer, pl_module, stage: str) -> None:
        folder = self.run_dir.checkpoints
        if trainer.is_global_zero and folder.is_dir():  # temporaries of a writer that was killed
            for tmp in folder.glob(".*.tmp-*"):
                tmp.unlink(missing_ok=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        """``every_n_steps``: due at a batch end that completed an optimiser step (no gradients
        are accumulating, which no checkpoint holds) and is not the epoch's last (whose end
        writes its own checkpoint, after the k-NN). Written at the next batch's start, as a
        pre-emption's (:meth:`save_step`): callbacks run before the module's own batch-end hook
        (EMA teacher, centres, counters) and the step's log rows."""
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        if (
            self.every_n_steps
            and not trainer.fast_dev_run
            and trainer.global_step % self.every_n_steps == 0
            and done % trainer.accumulate_grad_batches == 0
            and done < trainer.num_training_batches
        ):
            self._due_rng = rng_state()  # the streams at the step's end

    def on_train_start(self, trainer, pl_module) -> None:
        sums, self._resumed_sums = self._resumed_sums, None
        aggregates = epoch_aggregates(trainer)
        if sums is not None and aggregates is not None:  # before the resumed session's first step
            aggregates.restore(sums)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if self._due_rng is not None:
            rng, self._due_rng = self._due_rng, None
            self.save_step(trainer, rng)
            if self.on_step_save is not None:
                self.on_step_save(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        loss = trainer.callback_metrics.get("train/loss_epoch")
        if loss is not None:  # each rank's own epoch mean; every rank takes part in the reduce
            loss = trainer.strategy.reduce(loss.detach().float().to(pl_module.device), reduce_op="mean")
            self.train_loss = float(loss)
        if trainer.fast_dev_run:  # a smoke test: its loss for the summary, no checkpoint
            return
        for logger in trainer.loggers:  # metrics up to this checkpoint reach the disk with it
            logger.save()
        epoch = trainer.current_epoch + 1
        keep = self.every_n_epochs and epoch % self.every_n_epochs == 0
        target = self.run_dir.epoch_checkpoint(epoch) if keep else self.last_path
        trainer.save_checkpoint(target, weights_only=False)
        if keep and trainer.is_global_zero:
            atomic_copy(target, self.last_path)  # last.ckpt last: it is what a resume continues from

    def save_step(self, trainer, rng: dict[str, Any] | None = None) -> None:
        """``last.ckpt`` in the middle of an epoch, between two steps (``every_n_steps``, or a
        pre-emption: hvp_lightning/training/preemption.py), with ``rng`` -- this rank's streams at the end
        of the step just trained; None: the current ones -- as its RNG state. A collective, like
        every checkpoint."""
        for logger in trainer.loggers:  # the step's rows reach the disk with the checkpoint
            logger.save()
        aggregates = epoch_aggregates(trainer)
        self._rng, self._epoch_sums = rng, aggregates.partial() if aggregates is not None else None
        try:
            trainer.save_checkpoint(self.last_path, weights_only=False)
        finally:
            self._rng, self._epoch_sums = None, None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        """A save between two batches (:meth:`save_step`, from the next batch's start: that batch
        is fetched, not begun) is marked as taken before the fetch. Lightning then resumes it as
        a checkpoint between batches. Counted as fetched, it would take it for one made at a
        batch end, before the logger's step counter moved, and move that counter once more (one
        step missing from the log)."""
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
        if progress and progress["current"]["ready"] > progress["current"]["started"]:
            for counts in (progress["total"], progress["current"]):
                counts["ready"] = counts["started"]

    def state_dict(self) -> dict[str, Any]:
        state = {"rng": gather_per_rank(self._rng or rng_state()), "train_loss": self.train_loss}
        if self._epoch_sums is not None:  # a save inside an epoch (every rank's, a collective)
            state["epoch_sums"] = gather_per_rank(self._epoch_sums)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train_loss = state_dict.get("train_loss")
        sums, states = state_dict.get("epoch_sums") or [], state_dict.get("rng") or []
        rank, world = rank_and_world()
        if len(sums) == world:
            self._resumed_sums = sums[rank]
        elif sums:
            log.warning(
                "resume: the checkpoint holds the epoch's partial sums of %d processes, this run has %d; "
                "the resumed epoch's *_epoch values cover its resumed steps only",
                len(sums),
                world,
            )
        if len(states) == world:
            set_rng_state(states[rank])
        elif states:
            log.warning(
                "resume: the checkpoint holds RNG states of %d processes, this run has %d; "
                "random streams continue from a fresh seed",
                len(states),
                world,
            )


# --- resuming -----------------------------------------------------------------------------------
# Keys a continued run may change: how long it trains, how often it evaluates, checkpoints and
# logs, where it logs and reads its data from. Any other difference would make the resumed
# weights a different run's than the config (and summary.json) says.
RESUMABLE_KEYS = (
    "resume",
    "trainer.max_epochs",
    "budget",  # sets trainer.max_epochs (training/budget.py)
    "eval.every_n_epochs",
    "eval.at_start",
    "checkpoint",
    "logger",
    "analysis",
    "data.num_workers",
    "limits",
    "data.root",
    "data.urls",  # the same shards moved (a local copy of a bucket): the index, and so the run, is the same
    "data.manifest",
    "data.storage_options",
    "data.download",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.log_every_n_steps",
    # a resumed run starts from its checkpoint, never from backbone.init (resume wins, and the
    # run says so: training/backbone_init.py); the weights file may have moved meanwhile
    "backbone.init",
    "backbone.init_student",
)
DERIVED_KEYS = ("data.num_classes",)  # set by the run itself (training.driver.run)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": leaf}`` of a plain container (lists are leaves)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): node}


def _plain(cfg: TrainConfig) -> dict[str, Any]:
    out = as_dict(cfg)
    if not cfg.hvp_on:  # absent and disabled are the same run
        out.pop("hvp", None)
    if not cfg.data.on_device:  # false, and false for a run dir from before the key, are the same run
        del out["data"]["on_device"]
    return out


def config_differences(there: TrainConfig, here: TrainConfig) -> list[str]:
    """Dotted keys whose values differ between two training configs, except
    :data:`RESUMABLE_KEYS` and :data:`DERIVED_KEYS` (sub-keys included)."""
    a, b = _flat(_plain(there)), _flat(_plain(here))
    skip = RESUMABLE_KEYS + DERIVED_KEYS
    keys = [k for k in set(a) | set(b) if not any(k == s or k.startswith(s + ".") for s in skip)]
    return sorted(k for k in keys if (k in a, a.get(k)) != (k in b, b.get(k)))


def _describe(key: str, there: TrainConfig, here: TrainConfig) -> str:
    def show(cfg: TrainConfig) -> str:
        values = _flat(as_dict(cfg))
        return repr(values[key]) if key in values else "'<absent>'"

    return f"{key} ({show(there)} there, {show(here)} here)"


def check_same_run(there: TrainConfig, here: TrainConfig, run_dir: RunDir) -> None:
    """Raise :class:`CheckpointError` (one line naming the differing keys) unless ``here``
    continues the run whose config is ``there``."""
    diffs = config_differences(there, here)
    if diffs:
        shown = "; ".join(_describe(k, there, here) for k in diffs[:4]) + (
            f"; +{len(diffs) - 4} more" if len(diffs) > 4 else ""
        )
        raise CheckpointError(
            f"run dir {str(run_dir)!r} holds {LAST} of a run whose config differs in {', '.join(diffs)}: {shown}. "
            f"A resumed run may change only {', '.join(k for k in RESUMABLE_KEYS if k != 'resume')}; "
            f"use a new run dir (hydra.run.dir=...) for another run"
        )


def resume_checkpoint(cfg: TrainConfig, run_dir: str | Path | RunDir) -> tuple[Path | None, int]:
    """The checkpoint this run continues from and the optimiser steps it has trained
    (``global_step``, where a resumed logger continues), or ``(None, 0)`` for a fresh run.
    The step is read here, from the one load that checks the config.

    ``run_dir/checkpoints/last.ckpt`` is resumed automatically when it exists; ``resume=`` set
    without one is an error, and so is a last.ckpt whose config differs from ``cfg`` in more
    than :data:`RESUMABLE_KEYS` -- a new run never overwrites an old one's checkpoints, and
    an old run is never continued under another run's config."""
    run_dir = RunDir.of(run_dir)
    last = run_dir.last_checkpoint
    asked = cfg.resume
    if not last.is_file():
        if asked:
            raise CheckpointError(
                f"resume={str(asked)!r} is not allowed: a run dir holding checkpoints/{LAST} (none in {run_dir})"
            )
        return None, 0
    ckpt = load_checkpoint(last, mmap=True, key="resume" if asked else "checkpoint")
    check_same_run(checkpoint_config(ckpt), cfg, run_dir)
    return last, int(ckpt.get("global_step", 0))


def resume_config(run_dir: str | Path | RunDir, requested: DictConfig, overrides: list[str] = ()) -> DictConfig:
    """The config of the run in ``run_dir`` (from its last checkpoint), with the keys and
    groups that ``overrides`` (the command line) name taken from ``requested`` (the config
    that command composes), e.g. ``trainer.max_epochs=200`` to extend a run. Whether the
    result may continue that run is :func:`check_same_run`'s call (``training.driver.run``): repeating
    the run's own command with ``resume=`` appended changes nothing and is fine. A composed config
    (the command's overrides are Hydra's), which :func:`~hvp_lightning.config.check_options` then
    validates."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    last, run_dir = resolve_checkpoint(run_dir, key="resume")
    cfg = OmegaConf.create(as_dict(checkpoint_config(load_checkpoint(last, mmap=True, key="resume"))))
    for ov in OverridesParser.create().parse_overrides(list(overrides)):
        key = ov.key_or_group.replace("/", ".")
        if key == "resume" or key.startswith("hydra."):
            continue
        if ov.is_delete():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if isinstance(node, DictConfig) and leaf in node:
                with open_dict(node):
                    node.pop(leaf)
            continue
        OmegaConf.update(cfg, key, OmegaConf.select(requested, key), merge=False, force_add=True)
    with_resume = OmegaConf.merge(cfg, {"resume": str(run_dir)})
    assert isinstance(with_resume, DictConfig)
    return with_resume
