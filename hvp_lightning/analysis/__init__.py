"""Hard-view analysis (paper section 6): pair metrics, an online statistics callback with an
optional Parquet view log, and the offline report ``python -m hvp_lightning.analysis``.

Kept import-light: ``train.py`` imports the callback; the report's plotting and model-fitting
libraries load only when the CLI runs. Imports ``selection/`` (the pair order), ``data/`` (the
augmentation parameters), ``run/`` (the run dir, atomic writes), ``schema/`` and ``config`` (a run's
config, typed); ``training/`` imports it.
"""
