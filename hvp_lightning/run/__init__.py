"""A run's life on disk and in its process: the run directory and its layout (:class:`RunDir`),
atomic writes, the CSV / W&B records and session clock continued over resumes, the epoch
aggregates a mid-epoch checkpoint carries, what training costs (``perf``: time split, images/s,
model FLOPs of the images trained), the rank of this process, the job signals a loader worker
leaves to its trainer, and the figure types the commands can draw to.

Imports only the package's leaves (``errors``, ``schema``), never a folder: ``data/`` and every
folder above it import from here. Kept free of re-exports so that a loader worker importing
``run.job_signals`` does not pull in Lightning.
"""
