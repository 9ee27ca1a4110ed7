"""Loader workers: more than the usable cores are capped, with one warning of ours instead of
torch's warning for every loader."""

from __future__ import annotations

import logging
import os
import warnings

from hvp_lightning.data.augment import ViewAug
from hvp_lightning.data.datamodule import SSLDataModule


def test_num_workers_beyond_the_cores_are_capped_with_one_warning(cfg_factory, caplog):
    cores = len(os.sched_getaffinity(0))
    cfg = cfg_factory("data.train_size=8", "data.test_size=4")
    with caplog.at_level(logging.WARNING):
        dm = SSLDataModule(cfg.data, (ViewAug(size=16),) * 2, batch_size=4, num_workers=cores + 3)
    dm.setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaders = [dm.train_dataloader(), *dm.val_dataloader()]
    assert all(loader.num_workers == cores for loader in loaders)
    assert not [w for w in caught if "worker" in str(w.message)]  # torch's "suggested max number of worker"
    assert [r.getMessage() for r in caplog.records] == [
        f"data.num_workers={cores + 3} is more than the {cores} CPU cores this process may use: using {cores} "
        "loader workers"]
