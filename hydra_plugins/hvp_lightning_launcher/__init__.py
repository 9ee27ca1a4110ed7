"""The SLURM launcher of the presets conf/hydra/launcher/slurm*.yaml: hydra-submitit-launcher's, plus a
check of every job's layout before anything is queued (:func:`hvp_lightning.cluster.slurm.check_slurm_job`).
Hydra instantiates launchers from this namespace only, so the class lives here; the logic does not."""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra.errors import CompactHydraException
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import DictConfig

from hvp_lightning.cluster.slurm import check_fits_partition, check_slurm_job, partition_cpus
from hvp_lightning.errors import ConfigError


class SlurmLaunchError(CompactHydraException):
    """Hydra prints it as one line (no traceback) and exits 1; nothing was submitted."""


class CheckedSlurmLauncher(SlurmLauncher):
    """hydra-submitit-launcher's SLURM launcher that checks every job's config against its own
    parameters before it submits any job (:func:`check_slurm_job`). The parameters are resolved
    once from the sweep's base config, so a swept ``trainer.devices=1,2`` is caught here too."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.hydra_context is not None and self.config is not None
        # The parameters come from the sweep's fixed values, once for all jobs: check those first,
        # then every job, whose swept trainer keys cannot change the layout any more.
        jobs: list[tuple[str, DictConfig]] = [("", self.config)]
        loader = self.hydra_context.config_loader
        for num, overrides in enumerate(job_overrides, start=initial_job_idx):
            which = (
                f" (job #{num}: {' '.join(overrides)}; the launcher is sized once per sweep, from the "
                "values not swept: one sweep per layout)"
            )
            jobs.append((which, loader.load_sweep_config(self.config, list(overrides))))
        for which, job in jobs:
            try:
                check_slurm_job(job.trainer, self.params)
            except ConfigError as err:
                raise SlurmLaunchError(f"config error: {err}{which}; nothing was submitted") from err
        try:  # the job's size against the partition's nodes (skipped where sinfo cannot tell)
            check_fits_partition(self.params, partition_cpus(self.params.get("partition")))
        except ConfigError as err:
            raise SlurmLaunchError(f"config error: {err}; nothing was submitted") from err
        return super().launch(job_overrides, initial_job_idx)
