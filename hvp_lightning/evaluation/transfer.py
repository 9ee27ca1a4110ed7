"""The paper's transfer table for one checkpoint (``transfer.py``, ``hvp-transfer``; conf/transfer.yaml).

Every (data set, protocol) asked for is one evaluation of eval.py's (:func:`hvp_lightning.evaluation.evaluate`),
one after another in this process, each writing ``<out_dir>/[<checkpoint>/]<dataset>/<protocol>/eval_summary.json``
(:func:`checkpoint_cells`). After each, the checkpoint's row is rebuilt from those files into
``<out_dir>/transfer_table.csv`` and ``.md``, beside the rows of other checkpoints sharing ``out_dir``; a
column per data set and protocol in the paper's order (its table
"transfer_classification_results": CIFAR10, CIFAR100, Flowers102, iNat 21, Food101, each Lin. and
F.T.). Built from disk, the table keeps what an earlier command for the same checkpoint left there:
a subset run later (``datasets=[inat21]``) fills in its cells, and a failed evaluation loses none.

This module imports neither torch nor Lightning at module level: the settings and every data
set's files are checked before the heavy imports.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from ..config import check_eval_options, check_torchvision_root
from ..errors import ConfigError
from ..run.atomic import atomic_write_text
from ..run.directory import RunDir, TransferDir, resolve_checkpoint
from ..schema import TRANSFER_DATASETS, TRANSFER_PROTOCOLS, EvalConfig, TransferConfig, settings
from ..schema.data import DataSettings

log = logging.getLogger(__name__)

TITLES = {
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "flowers102": "Flowers102",
    "inat21": "iNat 21",
    "food101": "Food101",
}
SHORT = {"linear": "Lin.", "finetune": "F.T."}
# eval.py's keys (conf/eval.yaml) that conf/transfer.yaml carries for every evaluation; protocol,
# data and out_dir are set per evaluation (tests/test_transfer.py checks the two files agree).
EVAL_KEYS = (
    "ckpt",
    "student",
    "seed",
    "num_workers",
    "limits",
    "accelerator",
    "devices",
    "precision",
    "progress_bar",
    "logger",
)


def cell(name: str, protocol: str) -> str:
    """The table column of one evaluation, e.g. ``flowers102_linear``."""
    return f"{name}_{protocol}"


def transfer_out_dir(cfg: TransferConfig) -> TransferDir:
    """The table's folder: ``out_dir``, or ``<run_dir>/eval/transfer`` of the checkpoint."""
    return TransferDir(Path(cfg.out_dir)) if cfg.out_dir else resolve_checkpoint(cfg.ckpt)[1].transfer


def checkpoint_cells(cfg: TransferConfig) -> TransferDir:
    """Where this checkpoint's cells go: the table's folder for a run's last.ckpt in its own
    ``eval/transfer``, else a subfolder naming the checkpoint (``out_dir=``: :func:`run_folder_name`,
    and the file's stem unless last.ckpt), so that the checkpoints sharing a table keep their own cells."""
    ckpt_path, run_dir = resolve_checkpoint(cfg.ckpt)
    parts = [run_folder_name(run_dir)] if cfg.out_dir else []
    parts += [] if RunDir.is_last_checkpoint(ckpt_path) else [ckpt_path.stem]
    table = transfer_out_dir(cfg)
    return TransferDir(table.path / "_".join(parts)) if parts else table


def run_folder_name(run_dir: RunDir) -> str:
    """The run dir's name and a short hash of its resolved path: run dirs are named by time and
    method (``10-30-00_simsiam``) or sweep job (``0_seed=0``), so two runs sharing an ``out_dir=``
    may share a name, and must not share cells."""
    digest = hashlib.sha1(str(run_dir.path.resolve()).encode()).hexdigest()[:6]
    return f"{run_dir.name}-{digest}"


def job_config(
    cfg: TransferConfig, name: str, protocol: str, checkpoint_data: DataSettings | None = None
) -> EvalConfig:
    """eval.py's config of one evaluation: ``protocol`` = ``cfg.<protocol>``, ``data`` =
    ``cfg.data.<name>`` (its null crop size and crop ratio: ``checkpoint_data``'s, the run's),
    eval.py's keys as given."""
    values = cfg.model_dump()
    job = {key: values[key] for key in EVAL_KEYS}
    job["protocol"], job["data"] = values[protocol], values["data"][name]
    if checkpoint_data is not None:
        for key in ("crop_size", "eval_crop_ratio"):
            if job["data"][key] is None:  # transfer.py's "the checkpoint's"
                job["data"][key] = getattr(checkpoint_data, key)
    job["out_dir"] = str(checkpoint_cells(cfg).cell(name, protocol).path)
    return settings(EvalConfig, job)


def check_transfer_options(cfg: DictConfig | TransferConfig) -> tuple[TransferConfig, list[tuple[str, str]]]:
    """The validated config and the (data set, protocol) evaluations asked for, in the paper's
    order, once every setting and every data set's files have passed (a missing root names
    ``data.<name>.root``). Torch-free."""
    s = cfg if isinstance(cfg, TransferConfig) else settings(TransferConfig, cfg)  # every key, all at once
    datasets = [n for n in TRANSFER_DATASETS if n in s.datasets]
    for name in datasets:
        d = s.data[name]
        if d.download:
            continue
        try:
            check_torchvision_root(d, f"data.{name}")
        except ConfigError as err:
            rest = [n for n in datasets if n != name]
            hint = f"; or leave it out: datasets=[{','.join(rest)}]" if rest else ""
            raise ConfigError(f"{err}{hint}") from None
    jobs = [(n, p) for n in datasets for p in TRANSFER_PROTOCOLS if p in s.protocols]
    for name, protocol in jobs:
        check_eval_options(job_config(s, name, protocol))
    return s, jobs


def read_results(out_dir: TransferDir, checkpoint: Path) -> dict[str, dict[str, Any]]:
    """``{column: eval_summary}`` of the evaluations of ``checkpoint`` under ``out_dir``."""
    found = {}
    for name in TRANSFER_DATASETS:
        for protocol in TRANSFER_PROTOCOLS:
            path = out_dir.cell(name, protocol).summary
            if path.is_file():
                summary = json.loads(path.read_text())
                if summary.get("checkpoint") == str(checkpoint.resolve()):
                    found[cell(name, protocol)] = summary
    return found


# Per evaluation, four CSV columns ``<dataset>_<protocol>_<kind>`` and four Markdown rows: the best
# test top-1 over epochs (what the official eval_linear.py reports, dino:eval_linear.py lines 192 and
# 217, hence the paper's tables), the last epoch's, and the batch and epochs the evaluation trained
# with (a table made with linear.epochs=5 must not pass for the paper's recipe).
KINDS = {
    "best": "top-1, best epoch (the paper's / official scripts' convention)",
    "last": "top-1, last epoch",
    "batch": "batch",
    "epochs": "epochs",
}


def cell_values(summary: dict[str, Any] | None) -> dict[str, str]:
    """One evaluation's cells: best and last top-1 (%), its batch and epochs; "" where not run or not recorded."""
    if summary is None:
        return dict.fromkeys(KINDS, "")
    m, s = summary["metrics"], summary.get("settings", {})
    pct = lambda v: f"{100 * v:.2f}" if v is not None else ""  # noqa: E731
    text = lambda key: str(s[key]) if s.get(key) else ""  # noqa: E731
    return {
        "best": pct(m.get("best_top1")),
        "last": pct(m["top1"]),
        "batch": text("batch_size"),
        "epochs": text("epochs"),
    }


def table_row(label: dict[str, Any], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint's row: ``label``'s columns, then per data set and protocol its best and
    last top-1 (%), batch and epochs ("" if not run)."""
    row = dict(label)
    for name in TRANSFER_DATASETS:
        for protocol in TRANSFER_PROTOCOLS:
            for kind, value in cell_values(results.get(cell(name, protocol))).items():
                row[f"{cell(name, protocol)}_{kind}"] = value
    return row


def table_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def pretraining(row: dict[str, Any]) -> str:
    """``2 pretraining epochs``, or ``0 pretraining epochs + 3 batches`` for a checkpoint saved inside an epoch."""
    batches = int(row["pretrain_batches"])
    return f"{row['pretrain_epochs']} pretraining epochs" + (f" + {batches} batches" if batches else "")


def table_markdown(rows: list[dict[str, Any]]) -> str:
    """The paper's layout: Method, Arch., then Lin. and F.T. per data set; per checkpoint a row per kind of cell."""
    cols = [cell(n, p) for n in TRANSFER_DATASETS for p in TRANSFER_PROTOCOLS]
    heads = ["Method", "Arch.", ""] + [f"{TITLES[n]} {SHORT[p]}" for n in TRANSFER_DATASETS for p in TRANSFER_PROTOCOLS]
    lines = [f"| {' | '.join(heads)} |", f"|{'---|' * len(heads)}"]
    for row in rows:
        for kind, title in KINDS.items():
            values = [row["method"], row["backbone"], title] + [row[f"{c}_{kind}"] or "-" for c in cols]
            lines.append(f"| {' | '.join(values)} |")
    sources = "; ".join(f"`{r['checkpoint']}` ({pretraining(r)})" for r in rows)
    return (
        "\n".join(lines) + "\n\n"
        f"Top-1 accuracy (%) of {sources}; "
        "each cell's settings: `[<checkpoint>/]<dataset>/<protocol>/eval_summary.json` next to this file.\n"
    )


def table_rows(path: Path, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the table at ``path`` with ``row`` in place of its checkpoint's (or added): the
    rows of several checkpoints sharing ``out_dir`` stack. Rows of another layout are dropped."""
    old = list(csv.DictReader(io.StringIO(path.read_text()))) if path.is_file() else []
    rows = {r["checkpoint"]: r for r in old if list(r) == list(row)}
    rows[row["checkpoint"]] = row
    return list(rows.values())


def write_table(out_dir: TransferDir, cells: TransferDir, label: dict[str, Any], checkpoint: Path) -> dict[str, Any]:
    """Rebuild the checkpoint's row of ``transfer_table.csv`` and ``.md`` in ``out_dir`` from its eval
    summaries in ``cells``; the row."""
    row = table_row(label, read_results(cells, checkpoint))
    rows = table_rows(out_dir.table_csv, row)
    atomic_write_text(out_dir.table_csv, table_csv(rows))
    atomic_write_text(out_dir.table_md, table_markdown(rows))
    return row


def check_settings(job: EvalConfig, method: str) -> None:
    """The protocol's recipe for this checkpoint exists, before any runs; an error names the key as typed
    here (``linear.epochs``, not eval.py's ``protocol.epochs``)."""
    from .protocols import protocol_settings

    protocol = job.protocol.name
    try:
        protocol_settings(job.protocol, method, job.data["name"])
    except ConfigError as err:
        raise ConfigError(f"{protocol}.{str(err).removeprefix('protocol.')}") from None


def run_transfer(cfg: TransferConfig, jobs: list[tuple[str, str]]) -> dict[str, Any]:
    """Every evaluation of ``jobs`` (from :func:`check_transfer_options`), then the table; its row."""
    from ..training.checkpoint import checkpoint_config, load_checkpoint, pretrained_for
    from .data import eval_data, eval_data_cfg
    from .run import evaluate

    ckpt_path, _ = resolve_checkpoint(cfg.ckpt)
    ckpt = load_checkpoint(ckpt_path, mmap=True)
    train_cfg = checkpoint_config(ckpt)
    pretrain = pretrained_for(ckpt)
    label = {
        "method": train_cfg.method.name + (" + HVP" if train_cfg.hvp_on else ""),
        "backbone": train_cfg.backbone.name,
        "checkpoint": str(ckpt_path.resolve()),
        "pretrain_epochs": pretrain["epochs"],
        "pretrain_batches": pretrain["batches"],  # into the next epoch: a checkpoint saved inside one
    }
    del ckpt
    configs = []
    for name, protocol in jobs:  # every data set's crop, and its splits read once, before the first evaluation
        job = job_config(cfg, name, protocol, train_cfg.data)
        check_settings(job, train_cfg.method.name)
        configs.append(job)
    plan = {}  # data set -> its line of the plan
    for job, (name, _) in zip(configs, jobs):
        if name not in plan:
            try:
                data = eval_data(eval_data_cfg(job, train_cfg))
            except ConfigError as err:  # its keys are data.<name>.* here
                raise ConfigError(f"data.{name}: {err}") from None
            plan[name] = (
                f"  {name}: {len(data.train):,} train / {len(data.test):,} test images, "
                f"{len(data.classes)} classes, {data.cfg.crop_size} px crops"
            )
    out_dir = transfer_out_dir(cfg)
    log.info(
        "transfer of %s (%s, %s): %d evaluations (%s) into %s\n%s",
        ckpt_path,
        label["method"],
        label["backbone"],
        len(jobs),
        ", ".join(str(p) for p in cfg.protocols),
        out_dir.path,
        "\n".join(plan.values()),
    )
    row: dict[str, Any] = {}
    for i, ((name, protocol), job) in enumerate(zip(jobs, configs), 1):
        log.info("transfer %d/%d: %s on %s ...", i, len(jobs), protocol, name)
        start = time.time()
        summary = evaluate(job)
        row = write_table(out_dir, checkpoint_cells(cfg), label, ckpt_path)
        cells = cell_values(summary)
        log.info(
            "transfer %d/%d: %s on %s at batch %s: top-1 %s%% best epoch, %s%% last (%.0f s); table: %s",
            i,
            len(jobs),
            protocol,
            name,
            cells["batch"],
            cells["best"],
            cells["last"],
            time.time() - start,
            out_dir.table_md,
        )
    return row
