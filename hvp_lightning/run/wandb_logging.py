"""W&B run identity and charts: the group and name a run gets (jobs of one Hydra sweep share a
group), and the chart axes and summaries of its k-NN curves."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L


def current_sweep_dir() -> str | None:
    """The sweep dir of this process's Hydra multirun job; None in a single run or without Hydra."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return str(HydraConfig.get().sweep.dir)


def sweep_group(sweep_dir: str) -> str:
    """``multirun/2026-11-21/10-00-00`` -> ``sweep_2026-11-21_10-00-00``: the sweep dir's last two
    parts (date and time with the default hydra.sweep.dir), one per sweep and readable."""
    return "sweep_" + "_".join(Path(sweep_dir).parts[-2:])


def run_names(group: str | None, name: str | None, run_dir: Path, sweep_dir: str | None) -> tuple[str | None, str]:
    """(group, name) of the W&B run; set values win. By default the runs of one sweep share its
    group, and a run is named after its dir (in a sweep ``<job num>_<overrides>``: what differs)."""
    return group or (sweep_group(sweep_dir) if sweep_dir else None), name or run_dir.name


def define_charts(experiment: Any) -> None:
    """k-NN curves over ``knn/epoch`` (training epochs done at the pass: 0 at init, as in
    summary.json's knn_history), with best and last value in the run summary, and the label-free
    monitors' over ``monitor/epoch`` (the same passes, also those without k-NN). Lightning puts
    every other key on ``trainer/global_step``; its own ``epoch`` is no axis for k-NN (0 both at
    init and after the first epoch), nor is ``trainer/global_step`` (one step behind for passes
    inside the training loop, exact for those after it)."""
    for key in ("knn/top1", "knn/top5"):
        experiment.define_metric(key, step_metric="knn/epoch", summary="max,last")
    for key in ("monitor/rankme", "monitor/feature_std"):
        experiment.define_metric(key, step_metric="monitor/epoch", summary="min,last")


class WandbCharts(L.Callback):
    """Calls :func:`define_charts` once on the global-zero W&B run (after the DDP launch, before
    the first k-NN pass); a no-op with other loggers."""

    def __init__(self) -> None:
        self._done = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from lightning.pytorch.loggers import WandbLogger

        if not self._done and trainer.is_global_zero and isinstance(trainer.logger, WandbLogger):
            define_charts(trainer.logger.experiment)
            self._done = True


def wandb_logged_in() -> bool:
    """True when this machine can log to W&B online (an API key in the environment or ~/.netrc):
    ``logger.mode=auto`` then logs online, else offline."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")
