"""Pretraining as a whole: the driver behind ``python train.py`` (:func:`driver.run`: validate,
build, fit, evaluate, summarise), checkpoints and resume (they build methods), stop requests
at a step (SLURM's signal, SIGTERM) and the export of a trained backbone.

The highest layer below ``evaluation/`` and the console commands: it imports methods, data,
analysis, ``cluster/``, ``run/``, ``config`` and ``schema/`` (the run's validated config, typed);
nothing below imports it.
"""
