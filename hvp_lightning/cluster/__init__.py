"""Many processes and many jobs: SLURM presets and the checks of a job against its partition,
Hydra sweeps and their summary table, the distributed helpers (ranks, gathers, SyncBatchNorm),
and the wait limits that make every wait on another process end (``limits.wait_s``, the stop
watch, ending what a process started).

Imports ``run/``, ``nn/``, ``schema/`` (a config's sections, typed) and the package's leaves;
``selection/``, ``methods/`` and everything above import from here.
``hydra_plugins/hvp_lightning_launcher`` (the SLURM launcher) uses ``cluster.slurm``.
"""
