"""The training driver behind ``python train.py``: validate, build, fit, evaluate, summarise."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf

from ..analysis.callback import analysis_callbacks
from ..analysis.live import live_gallery_callbacks
from ..cluster.distributed import sync_batchnorm_plugins
from ..cluster.slurm import use_slurm_threads
from ..cluster.waits import (
    StopWatch,
    WaitedTooLong,
    ddp_strategy,
    describe_wait_error,
    end_descendants,
)
from ..config import check_options, processes, validate
from ..data.datamodule import SSLDataModule, eval_roles
from ..data.iou_policy import iou_policy
from ..device import check_accelerator, device_line, local_processes, set_matmul_precision
from ..errors import ConfigError
from ..methods import SSLMethod
from ..monitors.health import collapse_reason
from ..monitors.online import OnlineMonitors
from ..run.atomic import atomic_write_text
from ..run.directory import RunDir
from ..run.epoch_metrics import EpochAggregates
from ..run.perf import PerfMonitor
from ..run.process_rank import env_rank
from ..run.records import RunRecord, continue_csv_log, wandb_resume
from ..run.wandb_logging import WandbCharts, current_sweep_dir, run_names, wandb_logged_in
from ..schema import TrainConfig
from ..schema.base import as_dict
from ..selection import hvp_summary
from ..warning_filters import quiet_console
from .backbone_init import init_backbone
from .budget import apply_budget
from .build import build_method, hvp_of, run_view_augs
from .checkpoint import (
    AtomicCheckpointIO,
    RunCheckpoint,
    RunConfig,
    checkpoint_config,
    load_checkpoint,
    resume_checkpoint,
)
from .cost import run_step_flops
from .counters import RunCounters
from .preemption import StopOnSignal, cluster_plugins

log = logging.getLogger(__name__)


def build_logger(cfg: TrainConfig, run_dir: str | Path | RunDir, resume_step: int = 0):
    """The run's CSV or W&B logger, continuing the run's log over a resume (from ``resume_step``)."""
    from lightning.pytorch.loggers import CSVLogger, WandbLogger

    run_dir = RunDir.of(run_dir)
    if cfg.logger.name == "csv":
        logger = CSVLogger(save_dir=str(run_dir), name=run_dir.csv_name, version="")
        continue_csv_log(logger, run_dir.csv_metrics, resume_step)  # a resumed run appends to metrics.csv
        return logger
    lc = cfg.logger
    mode = os.environ.get("WANDB_MODE") or (
        lc.mode if lc.mode != "auto" else ("online" if wandb_logged_in() else "offline")
    )
    group, name = run_names(lc.group, lc.run_name, run_dir.path, current_sweep_dir())  # a sweep shares a group
    return WandbLogger(
        project=lc.project,
        entity=lc.entity,
        group=group,
        tags=list(lc.tags),
        name=name,
        save_dir=str(run_dir),
        mode=mode,
        **wandb_resume(run_dir, resume_step, mode),  # a resumed run continues its W&B run
        config=as_dict(cfg),
    )


def run(cfg: TrainConfig | DictConfig, run_dir: str | Path | RunDir) -> dict[str, Any]:
    """Pretrain as configured and return the summary (also written to run_dir/summary.json).
    ``cfg``: a validated config (:func:`hvp_lightning.config.check_options`'s, as the CLI passes it),
    or a composed one, validated here first.

    Nothing waits forever (:mod:`hvp_lightning.cluster.waits`): a wait on another rank or on loader
    workers longer than ``limits.wait_s`` fails the run with :class:`~hvp_lightning.cluster.waits.WaitedTooLong`,
    a failure ends the processes this one started, and a SIGTERM or Ctrl-C that the run cannot
    act on within ``limits.stop_grace_s`` (it waits in native code) ends it anyway."""
    if not isinstance(cfg, TrainConfig):
        cfg = check_options(cfg)
    with StopWatch(cfg.limits.stop_grace_s):
        try:
            return _pretrain(cfg, RunDir.of(run_dir), cfg.limits.wait_s)
        except Exception as err:
            described = describe_wait_error(err, cfg.limits.wait_s)
            if described is None:
                raise
            end_descendants()  # other ranks Lightning launched, loader workers: none left waiting or stopped
            raise WaitedTooLong(described) from err


def _pretrain(cfg: TrainConfig, run_dir: RunDir, wait_s: float) -> dict[str, Any]:
    """:func:`run`'s work, on a config :func:`~hvp_lightning.config.check_options` has validated."""
    quiet_console()
    cfg = validate(cfg)
    check_accelerator("trainer.accelerator", cfg.trainer.accelerator)
    run_dir.path.mkdir(parents=True, exist_ok=True)
    ckpt_path, resume_step = resume_checkpoint(cfg, run_dir)  # (None, 0): a fresh run
    record = RunRecord(run_dir)  # this session's clock starts
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    set_matmul_precision()
    use_slurm_threads()  # the same arithmetic whatever the SLURM layout (hvp_lightning/cluster/slurm.py)
    dm = data_module(cfg, wait_s)
    n_proc = processes(cfg.trainer) or 1
    if len(dm.train_set) // n_proc < cfg.method.batch_size:  # data sets start-up could not count
        over = f" over {n_proc} processes: {len(dm.train_set) // n_proc} per process" if n_proc > 1 else ""
        raise ConfigError(
            f"method.batch_size={cfg.method.batch_size} is not allowed: the training set has only "
            f"{len(dm.train_set)} images{over} (batches are full, drop_last)"
        )
    cfg = cfg.with_values({"data.num_classes": dm.num_classes})
    step_flops = run_step_flops(cfg)  # model FLOPs counted on the meta device, before training
    budgeted = ckpt_path is not None and cfg.budget.sets_epochs
    stored = checkpoint_config(load_checkpoint(ckpt_path, mmap=True)) if budgeted else None
    budget = apply_budget(cfg, step_flops, len(dm.train_set), stored)  # trainer.max_epochs from the FLOPs
    if budget is not None:
        cfg = cfg.with_values({"trainer.max_epochs": budget.epochs})
    if budget is not None and iou_policy(cfg) != dm.iou_policy:  # its schedule spans the budget's epochs
        dm = data_module(cfg, wait_s)
    model = build_method(cfg)
    if (init_line := init_backbone(model, cfg.backbone, resuming=ckpt_path is not None)) and env_rank() == 0:
        (log.warning if ckpt_path is not None else log.info)(init_line)
    trainer_kwargs = cfg.trainer.model_dump()
    sync_bn = sync_batchnorm_plugins(trainer_kwargs.pop("sync_batchnorm"), model)  # DDP only
    trainer_kwargs["strategy"] = ddp_strategy(cfg.trainer, wait_s)  # collectives wait at most wait_s
    checkpointer = RunCheckpoint(
        run_dir,
        cfg.checkpoint.every_n_epochs,
        cfg.checkpoint.every_n_steps,
        record.note_checkpoint_step,
    )
    perf = PerfMonitor(step_flops)
    counters = RunCounters(dm.iou_policy)
    roles = eval_roles(cfg.data)
    monitors = OnlineMonitors(
        roles, dm.num_classes, cfg.eval.knn_k, cfg.eval.knn_temperature, run_dir, lambda: counters.images_seen
    )
    trainer = L.Trainer(
        **trainer_kwargs,
        default_root_dir=str(run_dir),
        logger=build_logger(cfg, run_dir, resume_step),
        plugins=[AtomicCheckpointIO(), *sync_bn, *cluster_plugins()],
        callbacks=[
            perf,  # first: its batch-start mark precedes the other callbacks' work (run/perf.py)
            EpochAggregates(),  # *_epoch values that survive a mid-epoch resume (run/epoch_metrics.py)
            checkpointer,
            record,
            counters,
            monitors,
            RunConfig(cfg),
            StopOnSignal(checkpointer, record),
            *analysis_callbacks(cfg, run_dir),
            *live_gallery_callbacks(cfg),
            WandbCharts(),
        ],
        # without a labelled set the pass is the small held-out sample's alone: at every epoch's end
        check_val_every_n_epoch=cfg.eval.every_n_epochs if "test" in roles else 1,
        num_sanity_val_steps=0,
    )
    if trainer.is_global_zero:
        print(device_line(trainer.strategy.root_device, str(trainer.precision), trainer.world_size), flush=True)
    if cfg.eval.at_start and ckpt_path is None:  # the random-init reference: how far did pretraining move the features?
        trainer.validate(model, datamodule=dm, verbose=False)
        monitors.note_init()
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    if monitors.evaluated_step != trainer.global_step:  # the monitors always run on the final weights
        trainer.validate(model, datamodule=dm, verbose=False)
    # The last epoch's loss, mean over ranks: this session's, or the checkpoint's when a finished
    # run is resumed and trains nothing more.
    train_loss = checkpointer.train_loss
    record.beat(trainer, force=True)
    summary = _summary(cfg, model, monitors, counters, trainer, run_dir, record.total_seconds(), train_loss)
    summary["cost"] = perf.summary(summary["images_seen"], (summary.get("hvp") or {}).get("selected_samples", 0))
    summary["budget"] = budget.summary() if budget is not None else None
    summary["knn_top1_init"] = monitors.knn_init
    summary["sync_batchnorm_layers"] = sync_bn[0].converted if sync_bn else 0
    if trainer.is_global_zero:
        atomic_write_text(run_dir.summary, json.dumps(summary, indent=2) + "\n")  # sweeps read it live
        OmegaConf.save(as_dict(cfg), run_dir.config)
    _close_logger(trainer, summary)
    return summary


def data_module(cfg: TrainConfig, wait_s: float) -> SSLDataModule:
    """The run's data, set up for training."""
    hvp = hvp_of(cfg)
    dm = SSLDataModule(
        cfg.data,
        run_view_augs(cfg),
        cfg.method.batch_size,
        cfg.data.num_workers,
        cfg.seed,
        iou_policy=iou_policy(cfg),
        defer_colour=hvp is not None and hvp.enabled and hvp.colour == "static",  # the step colours the chosen pair
        wait_s=wait_s,
        processes=local_processes(cfg.trainer),  # data.num_workers: auto shares the machine's cores among them
    )
    dm.setup("fit")
    return dm


MONITORS = ("rankme", "feature_std")  # the label-free monitors (hvp_lightning/monitors/health.py)


def final_line(summary: dict[str, Any]) -> str:
    """The run's last line: k-NN top-1 against its random-init value and chance -- without a
    labelled set the label-free monitors against theirs instead --, the epoch the monitors first
    signalled collapse if they did, the run dir and, with HVP, how much harder the selected views
    were than the candidates' average and what the selection cost in model FLOPs (its share of
    the run's, and an HVP step's FLOPs against the baseline step's), and the run's model FLOPs."""
    if summary.get("knn_top1") is not None:
        init = summary.get("knn_top1_init")
        ref = f"at init {100 * init:.2f}%, " if init is not None else ""
        line = f"k-NN top-1: {100 * summary['knn_top1']:.2f}% ({ref}chance {100 * summary['knn_chance']:.1f}%)"
    else:
        line = monitor_text(summary)
    if summary.get("monitor_collapse_epoch") is not None:
        line += f" | collapse signalled at epoch {summary['monitor_collapse_epoch']:g}"
    hvp = summary.get("hvp") or {}
    if hvp.get("selection_selected_loss_mean") is not None:
        gap = hvp["selection_selected_loss_mean"] - hvp["selection_candidate_loss_mean"]
        line += f" | HVP selected - candidate loss: {gap:+.4f}"
    if summary.get("hvp_enabled") and (cost := hvp_cost_text(summary.get("cost") or {})):
        line += f" | {cost}"
    if total := (summary.get("cost") or {}).get("total_flops"):  # what budget.flops takes: runs compare at a glance
        line += f" | model FLOPs: {total:.3g}"
    return f"{line} | run dir: {shown_path(summary['run_dir'])}"


def hvp_cost_text(cost: dict[str, Any]) -> str | None:
    """``HVP cost: selection 40% of model FLOPs, step 1.67x the baseline's``: the selection's share
    of the run's model FLOPs, and an HVP step's model FLOPs per image against the baseline step's
    (None without a FLOP count)."""
    share, baseline = cost.get("selection_flops_share"), cost.get("baseline_flops_per_image")
    if share is None or not baseline:
        return None
    step = (cost["train_flops_per_image"] + cost["selection_flops_per_image"]) / baseline
    return f"HVP cost: selection {100 * share:.0f}% of model FLOPs, step {step:.2f}x the baseline's"


def monitor_text(summary: dict[str, Any]) -> str:
    """``RankMe 45.2 of 128 (at init 13.8), feature std 0.412/sqrt(d) (at init 0.096/sqrt(d)) on 512
    held-out images``: RankMe out of its maximum min(n, d), the std in units of a healthy
    embedding's 1/sqrt(d)."""
    n, d = summary["monitor_images"], summary["monitor_dim"]
    rank, std = summary["monitor_rankme"], summary["monitor_feature_std"] * math.sqrt(d)
    rank_init, std_init = summary.get("monitor_rankme_init"), summary.get("monitor_feature_std_init")
    rank_ref = f" (at init {rank_init:.1f})" if rank_init is not None else ""
    std_ref = f" (at init {std_init * math.sqrt(d):.3f}/sqrt(d))" if std_init is not None else ""
    source = "held-out" if summary["monitor_source"] == "monitor" else "test"
    return f"RankMe {rank:.1f} of {min(n, d)}{rank_ref}, feature std {std:.3f}/sqrt(d){std_ref} on {n} {source} images"


def shown_path(path: str) -> str:
    """``path`` relative to the working directory where it lies under it (as the user typed it
    and the README shows it: ``runs/<date>/...``; Hydra hands a fresh run's dir over absolute,
    a resumed one as given), else absolute."""
    p = Path(path).resolve()
    return os.path.relpath(p) if p.is_relative_to(Path.cwd().resolve()) else str(p)


def _close_logger(trainer: L.Trainer, summary: dict[str, Any]) -> None:
    """Put the run summary on the W&B run and finish it now (it would otherwise print its
    sync hints at interpreter exit, after the run's final line)."""
    from lightning.pytorch.loggers import WandbLogger

    if isinstance(trainer.logger, WandbLogger) and trainer.is_global_zero:
        run = trainer.logger.experiment
        run.summary.update({f"summary/{k}": v for k, v in summary.items() if isinstance(v, (int, float, str, bool))})
        for group in ("hvp", "cost", "budget"):  # nested: one W&B summary key per value
            values = summary.get(group) or {}
            run.summary.update({f"summary/{group}_{k}": v for k, v in values.items() if not isinstance(v, dict)})
        run.finish()


def monitor_summary(last: dict[str, Any], init: dict[str, float], history: list[dict[str, Any]]) -> dict[str, Any]:
    """summary.json's ``monitor_*`` keys: the last pass's RankMe and feature std, their values at
    random init, the sample they are computed on (``monitor_source``: ``monitor`` = data=images's
    held-out images, ``test`` = the labelled test set), every pass's values, and the epoch at
    which they first signalled collapse (None if never). The pass at random init (step 0) does not
    count: an untrained network's features can span few directions (a timm ResNet-10 measures
    RankMe 1.4 on a few images), and collapse is what training does to them."""
    dim = last.get("dim")
    collapsed = [
        h["epoch"]
        for h in history
        if dim and h.get("step", 1) > 0 and collapse_reason(h["rankme"], h["feature_std"], dim)
    ]
    return {
        **{f"monitor_{k}": last.get(k) for k in MONITORS},
        **{f"monitor_{k}_init": init.get(k) for k in MONITORS},
        "monitor_images": last.get("images"),
        "monitor_dim": dim,
        "monitor_source": last.get("source"),
        "monitor_history": history,
        "monitor_collapse_epoch": collapsed[0] if collapsed else None,
    }


def _summary(
    cfg: TrainConfig,
    model: SSLMethod,
    monitors: OnlineMonitors,
    counters: RunCounters,
    trainer: L.Trainer,
    run_dir: RunDir,
    seconds: float,
    train_loss: float | None,
) -> dict[str, Any]:
    skipped = counters.skipped()  # every rank's
    num_classes = cfg.data.num_classes
    out: dict[str, Any] = {
        "method": cfg.method.name,
        "backbone": cfg.backbone.name,
        "dataset": cfg.data.name,
        "hvp_enabled": model.hvp.enabled,
        "num_classes": num_classes,
        "knn_top1": monitors.knn_result.get("top1"),
        "knn_top5": monitors.knn_result.get("top5"),
        "knn_queries": monitors.knn_result.get("queries"),  # distinct test images scored (all ranks')
        "knn_chance": 1 / num_classes if num_classes else None,
        "knn_history": monitors.knn_history,
        **monitor_summary(monitors.monitor_result, monitors.monitor_init, monitors.monitor_history),
        "train_loss": train_loss,
        "epochs": trainer.current_epoch,
        "steps": trainer.global_step,
        "images_seen": counters.images_seen,
        "skipped_images": len(skipped),
        "skipped_files": skipped[:100],
        "seed": cfg.seed,
        "wall_time_s": round(seconds, 1),
        "run_dir": str(run_dir),
    }
    if counters.iou_policy is not None:  # fallback pairs of all ranks, over the whole run
        last = counters.iou_policy.threshold(max(0, trainer.current_epoch - 1))
        out["iou_policy"] = {"fallback_pairs": counters.fallback_pairs(trainer), "last_threshold": last}
    totals = getattr(model, "hvp_totals", None)
    if model.hvp.enabled:
        if totals is not None:
            totals = trainer.strategy.reduce(totals.to(trainer.strategy.root_device).clone(), reduce_op="sum")
        out["hvp"] = hvp_summary(model.hvp, totals)
    return out
