"""SLURM sends its pre-emption / time-limit warning to every process of a job step, loader workers
included, and a worker is a fork of its training process with that process's Python handlers.
Only the training process may act on it (hvp_lightning/job_signals.py): a worker running
submitit's handler would checkpoint and requeue the job from the middle of a step, once per
worker (seen on the SLURM test cluster: "A temporary saved file already exists")."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import torch

from hvp_lightning.data.augment import ViewAug
from hvp_lightning.data.datamodule import SSLDataModule
from hvp_lightning.evaluation.data import eval_loader
from hvp_lightning.job_signals import handled_in_this_process_only, preempt_signal


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
        loaders = [dm.train_dataloader(), *dm.val_dataloader(), eval_loader(dm.test_set, 4, 2, train=False)]
        read = [signal_the_workers(loader) for loader in loaders]
        os.kill(os.getpid(), preempt_signal())  # the training process still acts on it
        time.sleep(0.1)
    finally:
        signal.signal(preempt_signal(), previous)
    assert read == [8, 8, 4, 4]
    assert sorted(p.name for p in marks.iterdir()) == [str(os.getpid())]


class Items(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((2,), float(index))


def test_a_fork_signalled_before_its_init_does_nothing(tmp_path: Path):
    """Inside :func:`handled_in_this_process_only` (around every run), even a worker with no
    ``worker_init_fn`` -- as each is just after its fork -- does nothing on the signal; this process
    still acts, and the handler is put back afterwards."""
    marks = tmp_path / "acted"
    marks.mkdir()

    def act(signum: int, frame: object) -> None:
        (marks / str(os.getpid())).touch()

    previous = signal.signal(preempt_signal(), act)
    try:
        with handled_in_this_process_only():
            read = signal_the_workers(torch.utils.data.DataLoader(Items(), batch_size=2, num_workers=2))
            os.kill(os.getpid(), preempt_signal())
            time.sleep(0.1)
        assert signal.getsignal(preempt_signal()) is act
    finally:
        signal.signal(preempt_signal(), previous)
    assert read == 8
    assert sorted(p.name for p in marks.iterdir()) == [str(os.getpid())]


def test_a_worker_ended_by_sigterm_does_not_fail_the_training_process(cfg_factory):
    """SLURM's requeue SIGTERMs every process of the step while the training process is stopping:
    a worker killed by the signal would make torch raise in the training process (its SIGCHLD
    check), turning the requeue into a failed job. The worker ends with status 0 instead."""
    cfg = cfg_factory("data.train_size=32", "data.test_size=16")
    dm = SSLDataModule(cfg.data, (ViewAug(size=16),) * 2, batch_size=4, num_workers=2)
    dm.setup()
    loader = dm.train_dataloader()  # persistent workers, as the training loop keeps them
    it = iter(loader)
    next(it)
    workers = list(it._workers)  # noqa: SLF001 -- torch's multiprocessing iterator
    # From another process, as slurmstepd sends it (torch's worker exits quietly on its parent's SIGTERM only).
    subprocess.run(["kill", "-TERM", *(str(worker.pid) for worker in workers)], check=True)
    for worker in workers:
        worker.join(timeout=10)
    time.sleep(0.5)  # torch's SIGCHLD check runs here, in this process, and would raise
    assert [worker.exitcode for worker in workers] == [0, 0]
    it._shutdown_workers()  # noqa: SLF001 -- what the loop's teardown does; nothing to raise either
