"""A run resumed from a checkpoint inside an epoch logs that epoch's ``on_epoch`` aggregates over
the whole epoch -- mean, sum, max and min alike -- exactly as the uninterrupted run does."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import Dataset

from hvp_lightning.checkpoint import RunCheckpoint
from hvp_lightning.data.sampler import EpochSampler, ResumableLoader

STEPS = 6  # one epoch of 6 batches; every_n_steps=2 writes after steps 2 and 4
STOP_AT = 3  # the first session stops inside step 4's batch: it continues from step 2's checkpoint


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

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(run_dir: Path, stop_at: int | None = None, ckpt_path: str | None = None) -> L.Trainer:
    torch.manual_seed(0)
    rows = Rows(torch.randn(STEPS * 4 - 3, 3))  # the last batch is smaller: batch sizes 4, 4, 4, 4, 4, 1
    trainer = L.Trainer(
        max_epochs=1,
        callbacks=[RunCheckpoint(run_dir, every_n_steps=2)],
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
    return trainer


def _epoch_values(trainer: L.Trainer) -> dict[str, torch.Tensor]:
    return {k: v for k, v in trainer.callback_metrics.items() if k.endswith("_epoch")}


def test_every_reduction_of_a_resumed_epoch_covers_the_whole_epoch(tmp_path: Path) -> None:
    want = _epoch_values(_fit(tmp_path / "straight"))
    assert set(want) == {"m/mean_epoch", "m/sum_epoch", "m/max_epoch", "m/min_epoch"}
    with pytest.raises(Stopped):
        _fit(tmp_path / "resumed", stop_at=STOP_AT)
    saved = torch.load(tmp_path / "resumed" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 2 and saved["callbacks"]["RunCheckpoint"]["epoch_sums"][0].keys() == {
        f"training_step.m/{r}" for r in ("mean", "sum", "max", "min")
    }
    got = _epoch_values(_fit(tmp_path / "resumed", ckpt_path=str(tmp_path / "resumed" / "last.ckpt")))
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), (key, got[key], want[key])


def test_an_epoch_end_checkpoint_carries_no_partial_sums(tmp_path: Path) -> None:
    """The epoch's own end resets the aggregates: a resume from there must not add them in again."""
    _fit(tmp_path)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert "epoch_sums" not in saved["callbacks"]["RunCheckpoint"]
