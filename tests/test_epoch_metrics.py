"""A run resumed from a checkpoint inside an epoch logs that epoch's ``on_epoch`` aggregates over
the whole epoch -- mean, sum, max and min alike, what the epoch's start logged and what the batch
end logs on some steps only -- exactly as the uninterrupted run does, wherever in the epoch it
resumes (the last batch included). The aggregates are the project's own
(hvp_lightning/run/epoch_metrics.py), under Lightning's keys and in its log rows."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import Dataset

from hvp_lightning.data.sampler import EpochSampler, ResumableLoader
from hvp_lightning.run.directory import RunDir
from hvp_lightning.run.epoch_metrics import EpochAggregates, epoch_aggregates
from hvp_lightning.training.checkpoint import RunCheckpoint

STEPS = 6  # batches an epoch
EPOCHS = 2  # the second epoch logs every key again: the restored ones must match its self.log calls


class Stopped(Exception):
    pass


class Rows(Dataset):
    """Row ``index`` of a fixed tensor, under the sampler's ``(epoch, index)`` keys."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, key: tuple[int, int]) -> torch.Tensor:
        return self.x[key[1]]


class Logs(L.LightningModule):
    """A linear layer whose step logs its loss with each reduction (batch sizes differ, so a mean
    that drops the first session's steps, or weights them wrongly, shows)."""

    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.stop_at = stop_at

    def log(self, name: str, value, **kwargs) -> None:
        """As a host does it (SSLMethod.log): the trainer's EpochAggregates takes what it keeps."""
        aggregates = epoch_aggregates(self.trainer)
        if aggregates is None or not aggregates.take_log(self, name, value, kwargs):
            super().log(name, value, **kwargs)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if self.global_step == self.stop_at:
            raise Stopped  # a kill, after step STOP_AT - 1's checkpoint (step 2's)
        x = batch
        loss = self.layer(x).pow(2).mean()
        kw = {"on_step": True, "on_epoch": True, "batch_size": x.shape[0]}
        self.log("m/mean", loss, **kw)
        self.log("m/sum", loss, reduce_fx="sum", **kw)
        self.log("m/max", loss, reduce_fx="max", **kw)
        self.log("m/min", loss, reduce_fx="min", **kw)
        return loss

    def on_train_epoch_start(self) -> None:
        """Lightning does not run it again in a session resumed inside the epoch: its value is carried over."""
        self.log("m/at_start", 2.0, on_step=False, on_epoch=True, reduce_fx="sum", batch_size=1)

    def on_train_batch_end(self, outputs: dict, batch: torch.Tensor, batch_idx: int) -> None:
        """An every-other-step value (as HVP's analysis with ``hvp.every_n_steps=2``), then one on
        every step: that hook's first ``self.log`` of a session resets its epoch aggregates."""
        if self.global_step % 2 == 0:
            self.log("m/even_steps", outputs["loss"], on_step=True, on_epoch=True, reduce_fx="sum", batch_size=1)
        self.log("m/lr", 0.1, on_step=True, on_epoch=False, batch_size=1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class EpochValues(L.Callback):
    """Each finished epoch's epoch-level values."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, torch.Tensor]] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        values = trainer.callback_metrics.items()
        self.epochs.append({k: v.clone() for k, v in values if k.endswith("_epoch") or k == "m/at_start"})


def _fit(
    run_dir: Path,
    stop_at: int | None = None,
    ckpt_path: str | None = None,
    every_n_steps: int = 2,
    aggregates: bool = True,
) -> list[dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    rows = Rows(torch.randn(STEPS * 4 - 3, 3))  # the last batch is smaller: batch sizes 4, 4, 4, 4, 4, 1
    values = EpochValues()
    trainer = L.Trainer(
        max_epochs=EPOCHS,
        callbacks=[
            *([EpochAggregates()] if aggregates else []),
            RunCheckpoint(run_dir, every_n_steps=every_n_steps),
            values,
        ],
        logger=False,
        enable_checkpointing=True,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
    )
    position = lambda: (trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_progress.current.processed)
    loader = ResumableLoader(rows, EpochSampler(rows, batch_size=4, seed=0), position, batch_size=4)
    trainer.fit(Logs(stop_at), loader, ckpt_path=ckpt_path)
    return values.epochs


@pytest.mark.parametrize(
    ("every_n_steps", "stop_at"),
    [(2, 3), (5, 5)],
    ids=["resumed_at_step_2_of_6", "resumed_at_the_last_batch"],  # (5, 5): the one resumed batch ends the epoch
)
def test_every_reduction_of_a_resumed_epoch_covers_the_whole_epoch(tmp_path: Path, every_n_steps, stop_at) -> None:
    """Stopped inside step ``stop_at + 1``'s batch, resumed from the last ``every_n_steps`` checkpoint."""
    want = _fit(tmp_path / "straight")
    assert len(want) == EPOCHS
    keys = {"m/mean_epoch", "m/sum_epoch", "m/max_epoch", "m/min_epoch", "m/at_start", "m/even_steps_epoch"}
    assert set(want[0]) == keys
    with pytest.raises(Stopped):
        _fit(tmp_path / "resumed", stop_at=stop_at, every_n_steps=every_n_steps)
    saved = torch.load(RunDir(tmp_path / "resumed").last_checkpoint, weights_only=False)
    assert saved["global_step"] == stop_at - stop_at % every_n_steps
    assert saved["callbacks"]["RunCheckpoint"]["epoch_sums"][0].keys() == keys
    got = _fit(
        tmp_path / "resumed", ckpt_path=str(RunDir(tmp_path / "resumed").last_checkpoint), every_n_steps=every_n_steps
    )
    assert len(got) == EPOCHS  # the resumed epoch, then one more
    for got_epoch, want_epoch in zip(got, want):
        assert got_epoch.keys() == want_epoch.keys()
        for key in want_epoch:
            assert torch.equal(got_epoch[key], want_epoch[key]), (key, got_epoch[key], want_epoch[key])


def test_an_epoch_end_checkpoint_carries_no_partial_sums(tmp_path: Path) -> None:
    """The epoch's own end resets the aggregates: a resume from there must not add them in again."""
    with pytest.raises(Stopped):  # in the second epoch's second batch: last.ckpt is the first epoch's end
        _fit(tmp_path, stop_at=STEPS + 1)
    saved = torch.load(RunDir(tmp_path).last_checkpoint, weights_only=False)
    assert saved["global_step"] == STEPS
    assert "epoch_sums" not in saved["callbacks"]["RunCheckpoint"]


def test_the_kept_aggregates_are_lightnings_own(tmp_path: Path) -> None:
    """Kept by EpochAggregates or by Lightning (a module that does not hand its values over), the
    epoch values of an uninterrupted run are the same, bit for bit: same keys, same operations."""
    ours = _fit(tmp_path / "ours")
    lightning = _fit(tmp_path / "lightning", aggregates=False)
    for got, want in zip(ours, lightning, strict=True):
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), (got, want)


def test_a_checkpoint_from_before_carries_its_sums_over() -> None:
    """A mid-epoch checkpoint written before EpochAggregates holds Lightning's own running sums,
    keyed ``<hook>.<name>`` with their self.log arguments: they continue under the epoch keys."""
    args = {"prog_bar": False, "logger": True, "enable_graph": False, "add_dataloader_idx": True}
    args |= {"metric_attribute": None, "sync_dist": False, "rank_zero_only": False}
    saved = {
        "training_step.m/mean": {
            "reduction": "mean",
            "value": torch.tensor(6.0),
            "count": torch.tensor(3),
            "log": {"fx": "training_step", "name": "m/mean", "on_step": True, "on_epoch": True, **args},
        },
        "on_train_epoch_start.m/at_start": {
            "reduction": "sum",
            "value": torch.tensor(2.0),
            "count": None,
            "log": {"fx": "on_train_epoch_start", "name": "m/at_start", "on_step": False, "on_epoch": True, **args},
        },
    }
    aggregates = EpochAggregates()
    aggregates.restore(saved)
    assert set(aggregates.running) == {"m/mean_epoch", "m/at_start"}
    assert aggregates.running["m/mean_epoch"]["log"] == {
        "prog_bar": False,
        "logger": True,
        "rank_zero_only": False,
        "add_dataloader_idx": True,
        "sync_dist": False,
    }
    assert torch.equal(aggregates.partial()["m/mean_epoch"]["count"], torch.tensor(3))
