"""SLURM sends its pre-emption / time-limit warning to every process of a job step, loader workers
included, and a stopped VM its SIGTERM. Only the training process may act on them
(hvp_lightning/run/job_signals.py): a worker running submitit's handler would checkpoint and requeue the
job from the middle of a step, once per worker (seen on the SLURM test cluster: "A temporary saved
file already exists"), and a worker ended by SIGTERM would starve the step's checkpoint of its batch."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from hvp_lightning.data.augment import ViewAug
from hvp_lightning.data.datamodule import SSLDataModule
from hvp_lightning.data.workers import worker_options
from hvp_lightning.evaluation.data import eval_loader
from hvp_lightning.run import job_signals
from hvp_lightning.run.job_signals import preempt_signal

pytestmark = (
    pytest.mark.serial
)  # its slow tests start processes of their own and time them: run one at a time (.ci/run)


def signal_the_workers(loader: torch.utils.data.DataLoader) -> int:
    """Start ``loader``'s workers, send each the pre-emption signal mid-iteration (after each has
    served a batch: its ``worker_init_fn`` has run), then read the rest (the workers must go on
    serving). Returns the batches read."""
    it = iter(loader)
    batches = [next(it) for _ in range(loader.num_workers)]  # batches go round the workers
    workers = [w.pid for w in it._workers]  # noqa: SLF001 -- torch's multiprocessing iterator
    assert len(workers) == loader.num_workers
    for pid in workers:
        os.kill(pid, preempt_signal())
    time.sleep(0.5)  # delivered and handled (or ignored) before the iterator shuts them down
    batches += list(it)
    return len(batches)


@pytest.mark.slow  # 8 loader workers signalled, 0.5 s for each loader
def test_loader_workers_leave_the_preemption_signal_to_the_training_process(cfg_factory, tmp_path: Path):
    marks = tmp_path / "acted"
    marks.mkdir()

    def act(signum: int, frame: object) -> None:  # stands for submitit's handler: acts where it runs
        (marks / str(os.getpid())).touch()

    previous = signal.signal(preempt_signal(), act)  # in place before the workers fork, as submitit's is
    try:
        cfg = cfg_factory("data.train_size=32", "data.test_size=16")
        dm = SSLDataModule(cfg.data, (ViewAug(size=16),) * 2, batch_size=4, num_workers=2)
        dm.setup()
        loaders = [dm.train_dataloader(), *dm.val_dataloader(), eval_loader(dm.eval_sets["test"], 4, 2, train=False)]
        read = [signal_the_workers(loader) for loader in loaders]
        os.kill(os.getpid(), preempt_signal())  # the training process still acts on it
        time.sleep(0.1)
    finally:
        signal.signal(preempt_signal(), previous)
    assert read == [8, 8, 4, 4]
    assert sorted(p.name for p in marks.iterdir()) == [str(os.getpid())]


def _grace_of_one_second(worker_id: int, trainer_pid: int) -> None:
    """The package's worker rule with a 1 s grace (a test cannot wait the real one)."""
    job_signals.WORKER_GRACE_S = 1
    job_signals.leave_job_signals_to_trainer(worker_id, trainer_pid)


@pytest.mark.slow  # loader workers signalled, a whole epoch read
def test_a_worker_serves_on_after_sigterm_until_its_loader_ends_it(cfg_factory):
    """A VM's shutdown or SLURM's requeue SIGTERMs every process while the training process
    finishes its step and checkpoints it, for which it needs the batches already asked for: the
    workers go on serving them (from another process, as slurmstepd sends it), and the loader
    then ends them as usual; nothing raises in the training process."""
    cfg = cfg_factory("data.train_size=64", "data.test_size=16")
    dm = SSLDataModule(cfg.data, (ViewAug(size=16),) * 2, batch_size=4, num_workers=2)
    dm.setup()
    loader = dm.train_dataloader()  # persistent workers, as the training loop keeps them
    it = iter(loader)
    next(it)
    workers = list(it._workers)  # noqa: SLF001 -- torch's multiprocessing iterator
    subprocess.run(["kill", "-TERM", *(str(worker.pid) for worker in workers)], check=True)
    time.sleep(0.5)
    assert len(list(it)) == 64 // 4 - 1  # every remaining batch of the epoch
    assert all(worker.is_alive() for worker in workers)
    it._shutdown_workers()  # noqa: SLF001 -- what the loop's teardown does; nothing to raise
    assert all(not worker.is_alive() for worker in workers)


@pytest.mark.slow  # waits out the worker's grace
def test_a_worker_left_alone_after_sigterm_ends_by_itself():
    """A worker whose training process never ends it (stuck, or gone without a word) ends
    :data:`~hvp_lightning.run.job_signals.WORKER_GRACE_S` after the SIGTERM, even while blocked."""
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=2, **worker_options(1, wait_s=60, persistent=True))
    loader.worker_init_fn = functools.partial(_grace_of_one_second, trainer_pid=os.getpid())
    it = iter(loader)
    next(it)
    (worker,) = it._workers  # noqa: SLF001 -- torch's multiprocessing iterator
    subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)  # not from its training process
    worker.join(timeout=20)
    assert worker.exitcode == -signal.SIGALRM


@pytest.mark.slow  # a loader worker started and ended
def test_a_sigterm_from_its_own_training_process_ends_a_worker_at_once():
    """torch's loader shutdown and multiprocessing's exit handler end workers with SIGTERM from the
    training process: no grace then (the process would wait for it at exit)."""
    it = iter(
        torch.utils.data.DataLoader(list(range(8)), batch_size=2, **worker_options(1, wait_s=60, persistent=True))
    )
    next(it)
    (worker,) = it._workers  # noqa: SLF001 -- torch's multiprocessing iterator
    start = time.monotonic()
    worker.terminate()
    worker.join(timeout=20)
    assert worker.exitcode == 0 and time.monotonic() - start < 5
