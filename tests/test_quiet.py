"""Loader workers: more than the usable cores are capped, with one warning of ours instead of
torch's warning for every loader."""

from __future__ import annotations

import logging
import os
import warnings

import pytest

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
        "loader workers"
    ]


def test_lightning_messages_print_once_under_hydras_console_handler(capsys):
    """Under Hydra the root logger has a console handler; Lightning's own one printed every
    message a second time. It goes, and the messages still reach the root's handlers."""
    import lightning  # noqa: F401  (adds its console handler to the "lightning" logger)

    from hvp_lightning.warning_filters import one_console_copy_of_lightning_logs

    root, lightning_logger = logging.getLogger(), logging.getLogger("lightning")
    saved_root, saved_lightning = list(root.handlers), list(lightning_logger.handlers)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):  # stands in for Hydra's train.log handler
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    try:
        root.handlers[:] = []
        one_console_copy_of_lightning_logs()  # no root console: Lightning's handler is the only one, kept
        assert any(type(h) is logging.StreamHandler for h in lightning_logger.handlers)
        root.handlers[:] = [logging.StreamHandler(), Keep()]
        one_console_copy_of_lightning_logs()
        assert not any(type(h) is logging.StreamHandler for h in lightning_logger.handlers)
        lightning_logger.info("GPU available: once")
        assert [r.getMessage() for r in records] == ["GPU available: once"]
        assert capsys.readouterr().err.count("GPU available: once") == 1
    finally:
        root.handlers[:] = saved_root
        lightning_logger.handlers[:] = saved_lightning


@pytest.mark.slow  # a run with its loader workers
def test_loader_workers_default_to_the_machine_and_the_start_up_line_says_so(cfg_factory, caplog, monkeypatch):
    """Every data preset's ``num_workers: auto``: on a single core no worker (and no warning about
    the cores, which every run on 2 cores gave with 4), said in the data start-up line."""
    from .conftest import REPO, make_cfg

    presets = sorted(p.stem for p in (REPO / "conf" / "data").glob("*.yaml"))
    assert {make_cfg(f"data={name}", tiny=False).data.num_workers for name in presets} == {"auto"}
    monkeypatch.setattr("hvp_lightning.device.usable_cpu_cores", lambda: 1)
    cfg = cfg_factory("data.train_size=8", "data.test_size=4")
    with caplog.at_level(logging.INFO):
        dm = SSLDataModule(cfg.data, (ViewAug(size=16),) * 2, batch_size=4, num_workers="auto")
        dm.setup()
    assert dm.num_workers == 0 and all(loader.num_workers == 0 for loader in [dm.train_dataloader()])
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data: ")]
    assert line.endswith("; 0 loader workers (data.num_workers=auto: 1 usable CPU core)")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
