"""What starting loader workers from the fork server costs (issue 32), against forking them from
the training process, in one process, interleaved (a benchmark, not a test).

Per round, for the k-NN test loader and the training loader of the main job's data (``train.py``'s
``SSLDataModule``, textures), each arm starts a fresh iterator and times its first batch (the
workers' start plus one batch), then the rest of the pass:

* ``fork``: the same loader with ``multiprocessing_context="fork"`` (the code before the change);
* ``server``: the package's loader (:mod:`hvp_lightning.data.workers`), a fresh iterator each time;
* ``kept``: the package's k-NN loader as a run uses it, its persistent workers reused (the k-NN
  passes after the first).

The fork server's own start (its preload imports, once per process, overlapping the run's
set-up) is timed once, before the rounds.

    uv run python benchmarks/worker_start.py --rounds 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from torch.utils.data import DataLoader

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def timed_pass(loader: DataLoader) -> tuple[float, float]:
    """(seconds to the first batch, seconds for the whole pass) of a fresh ``iter``."""
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter() - start
    for _ in it:
        pass
    return first, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    from hydra import compose, initialize_config_dir

    from hvp_lightning.data import workers
    from hvp_lightning.data.datamodule import SSLDataModule
    from hvp_lightning.methods import METHODS

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["logger=csv"])
    start = time.perf_counter()
    workers.worker_context()
    dm = SSLDataModule(cfg.data, METHODS[cfg.method.name].view_augs(cfg), cfg.method.batch_size, args.workers, 0)
    dm.setup()
    (server_loader,) = [dm.val_dataloader()[1]]
    first, _ = timed_pass(server_loader)  # waits for the server's preload
    print(f"fork server start to the first k-NN batch (once per process): {time.perf_counter() - start:.2f} s")

    def fresh(ds, method: str | None) -> DataLoader:
        options = (
            dict(num_workers=args.workers, multiprocessing_context="fork")
            if method == "fork"
            else workers.worker_options(args.workers, 600.0)
        )
        return DataLoader(ds, batch_size=cfg.method.batch_size, **options)

    rows: dict[str, list[tuple[float, float]]] = {}
    train_set = dm.train_dataloader().dataset
    for r in range(args.rounds):
        order = ["fork", "server", "kept"] if r % 2 == 0 else ["kept", "server", "fork"]
        for arm in order:
            if arm == "kept":
                rows.setdefault("knn kept", []).append(timed_pass(server_loader))
                continue
            rows.setdefault(f"knn {arm}", []).append(timed_pass(fresh(dm.eval_sets["test"], arm)))
            rows.setdefault(f"train {arm}", []).append(timed_pass(fresh(train_set, arm)))
    print(f"\n{args.rounds} rounds, {args.workers} workers, median seconds (interleaved in one process)")
    print("| loader | arm | first batch | whole pass |\n|---|---|---|---|")
    for key, values in rows.items():
        loader, arm = key.split()
        print(
            f"| {loader} | {arm} | {statistics.median(v[0] for v in values):.3f} | "
            f"{statistics.median(v[1] for v in values):.3f} |"
        )


if __name__ == "__main__":
    main()
