"""Shared fixtures: tiny Hydra configs composed from the real conf/ tree, offline W&B."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import itertools
import logging
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf, open_dict
from pytest import ParameterSet

from hvp_lightning.selection import CandidateScores

# The suite checks the library in one fixed environment, whatever the user's shell has set for
# their own runs: HYDRA_FULL_ERROR (Hydra re-raises errors itself), WANDB_* (mode, project, run id,
# directory), SLURM_* and torchrun's process variables (another cluster environment and rank).
# They go for this process and every subprocess it starts; the tests about them set them
# themselves. W&B runs offline and quietly. Subprocesses compute on one thread, as this process
# does (the _one_thread fixture): intra-op threads spinning against other busy processes on a
# small machine slow a run down many times over.
PROCESS_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
)
for _key in list(os.environ):
    if _key == "HYDRA_FULL_ERROR" or _key.startswith(("WANDB_", "SLURM_")) or _key in PROCESS_VARIABLES:
        del os.environ[_key]
os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

REPO = Path(__file__).resolve().parents[1]
# Every subprocess of the default suite is a command's start-up or a tiny run: seconds on an idle
# 2-core machine, a few minutes at worst beside other CPU-bound work. Its timeout is no budget for
# that work, only the guard that turns a hung subprocess into a failure (pytest has no timeout of
# its own here), so it is set far above it rather than near it.
SUBPROCESS_TIMEOUT_S = 600
SHARED_CIFAR = REPO.parent / "shared" / "datasets" / "cifar10"


def tiered(
    cases: Iterable, keep: int | Collection[str], ids: Sequence[str] | None = None, *, single: bool = False
) -> list[ParameterSet]:
    """``cases`` for ``parametrize``, all of them in the slow tier and some in the default tier:
    ``keep`` cases spread evenly over the list, or the cases with those ids. The default tier then
    meets each kind of case and stays fast; the slow tier (``.ci/run``) checks every one. A tuple
    case fills several arguments unless ``single``; ``ids``: one per case (else its own or pytest's)."""
    cases = list(cases)
    n = len(cases)
    if isinstance(keep, int):
        chosen = set(range(n)) if keep >= n else {round(i * (n - 1) / max(keep - 1, 1)) for i in range(keep)}
    out: list[ParameterSet] = []
    for i, case in enumerate(cases):
        if isinstance(case, ParameterSet):
            values, marks, case_id = case.values, list(case.marks), case.id
        else:
            values, marks, case_id = (case if isinstance(case, tuple) and not single else (case,)), [], None
        case_id = ids[i] if ids is not None else case_id
        if not isinstance(keep, int):
            if case_id is None:
                raise ValueError(f"tiered: case {i} has no id to match against {sorted(keep)}")
            selected = case_id in keep
        else:
            selected = i in chosen
        if not selected:
            marks.append(pytest.mark.slow)
        out.append(pytest.param(*values, marks=marks, id=case_id))
    return out


# Small enough for a few seconds on 2 CPU cores.
# Tests were written against SimSiam on CPU in fp32 (the demo default is SimCLR, trainer auto):
# those stay the defaults of tiny configs on any machine, unless a test picks its own.
TINY_GROUPS = ["logger=csv", "trainer=cpu", "method=simsiam_cifar"]
TINY = [
    "data.train_size=64",
    "data.test_size=32",
    "data.crop_size=16",
    "data.num_workers=0",
    "method.batch_size=16",
    "method.proj_hidden_dim=64",
    "method.proj_dim=32",
    "backbone.width=8",
    "trainer.max_epochs=1",
    "eval.at_start=false",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
]


def write_images(root: Path, n: int, side: int = 20) -> list[Path]:
    """``n`` small generated JPEGs for ``data=images``, a third at ``root``'s top and the rest
    one and two folders down (any depth counts); random pixels of a fixed seed, so every test
    and subprocess sees the same images. Returns their paths, sorted."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        folder = root / ("", "a", "a/b")[i % 3]
        folder.mkdir(parents=True, exist_ok=True)
        paths.append(folder / f"img{i:03d}.jpg")
        Image.fromarray(rng.integers(0, 256, (side, side + 4, 3), dtype=np.uint8)).save(paths[-1], quality=90)
    return sorted(paths)


def write_plain_shards(out: Path, paths: list[Path], sizes: tuple[int, ...]) -> list[str]:
    """Shards as another tool writes them (no manifest: the reader scans the headers), of the
    given sample counts, ``<key>.jpg`` members only."""
    out.mkdir(parents=True, exist_ok=True)
    urls, start = [], 0
    for s, n in enumerate(sizes):
        url = str(out / f"part-{s}.tar")
        with tarfile.open(url, "w") as tar:
            for k, path in enumerate(paths[start : start + n], start):
                tar.add(path, arcname=f"sample{k:05d}.jpg")
        urls.append(url)
        start += n
    return urls


def images_run(overrides: list[str], root: Path, monitor_size: int) -> list[str]:
    """``overrides`` of a run on the generated textures turned into ``data=images`` on the images
    under ``root`` (``write_images``), ``monitor_size`` of them held out: the textures' own keys go."""
    own = ("data.train_size=", "data.test_size=")
    kept = [o for o in overrides if not o.startswith(own)]
    return [*kept, "data=images", f"data.root={root}", f"data.monitor_size={monitor_size}"]


@functools.lru_cache(maxsize=32)
def _composed(config_name: str, overrides: tuple[str, ...]) -> DictConfig:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


def compose_conf(config_name: str, *overrides: str) -> DictConfig:
    """``conf/<config_name>.yaml`` composed with ``overrides``: a copy of the composition, which
    is kept (Hydra takes ~0.1 s a composition, and the suite composes many configs more than
    once: a copy takes ~1 ms). Interpolations stay unresolved, so nothing of the moment is kept."""
    return copy.deepcopy(_composed(config_name, tuple(overrides)))


def make_cfg(*overrides: str, tiny: bool = True) -> DictConfig:
    """Compose conf/ with ``overrides``; then shrink it with TINY wherever the chosen groups
    have that key and the test did not set it ("+key" entries are always added)."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    groups = [g for g in TINY_GROUPS if tiny and g.split("=")[0] not in given]
    cfg = compose_conf("config", *groups, *overrides)
    if tiny:
        with open_dict(cfg):
            for item in TINY:
                key, value = item.split("=", 1)
                add, key = key.startswith("+"), key.lstrip("+")
                if key not in given and (add or OmegaConf.select(cfg, key) is not None):
                    OmegaConf.update(cfg, key, yaml.safe_load(value), force_add=True)
    return cfg


def typed(cfg):
    """A composed training config as the code below the command line gets it: validated, typed
    (:class:`~hvp_lightning.schema.TrainConfig`; the schema's checks only, nothing on disk)."""
    from hvp_lightning.schema import TrainConfig, train_settings

    return cfg if isinstance(cfg, TrainConfig) else train_settings(cfg)


def make_settings(*overrides: str, tiny: bool = True):
    """:func:`make_cfg`, validated (:func:`typed`)."""
    return typed(make_cfg(*overrides, tiny=tiny))


@pytest.fixture
def meta_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """``torch.autocast`` accepting the meta device (as a no-op, like CPU): the meta device
    stands in for a GPU in tests/test_device_guard.py and tests/test_host_syncs.py."""
    real = torch.autocast

    class autocast(real):  # type: ignore[misc,valid-type]
        def __init__(self, device_type: str, *args: object, **kwargs: object) -> None:
            super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch, "autocast", autocast)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tiny tensors: intra-op threads only add wake-up latency (seconds on a busy 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def cfg_factory():
    return make_cfg


def tiny_vit_run(method: str, tmp_path: Path) -> tuple[dict, dict, str]:
    """A 1-epoch multi-crop run (ViT-tiny, 32/16 px, +hvp=on) through training.driver.run, with the checks
    every method shares; returns (summary, checkpoint state_dict, metrics CSV text)."""
    import json
    import math

    from hvp_lightning.training.driver import run

    cfg = make_cfg(
        f"method={method}_cifar",
        "backbone=vit_tiny",
        "backbone.patch_size=8",
        "backbone.img_size=32",
        "backbone.depth=2",
        "+hvp=on",
        "logger=csv",
        "data.train_size=64",
        "data.test_size=32",
        "method.batch_size=8",
        "trainer.max_epochs=1",
        "data.num_workers=0",
        "method.out_dim=256",
        "method.head_hidden_dim=64",
        "method.bottleneck_dim=32",
        "eval.every_n_epochs=1",
        tiny=False,
    )
    summary = run(cfg, tmp_path)
    assert summary["method"] == method and summary["steps"] == 8
    assert summary["train_loss"] is not None and math.isfinite(summary["train_loss"])
    assert summary["hvp"]["selected_samples"] == 64
    assert summary["hvp"]["selection_selected_loss_mean"] >= summary["hvp"]["selection_candidate_loss_mean"]
    assert summary["knn_top1"] is not None
    assert json.loads((tmp_path / "summary.json").read_text())["method"] == method
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    state = ckpt["state_dict"]
    # Epoch 0 < freeze_last_layer: the student's last layer never moved, so the EMA teacher's
    # copy still equals it, while the rest of the head trained and the teacher lags behind.
    torch.testing.assert_close(state["head.last_layer.weight_v"], state["teacher.head.last_layer.weight_v"])
    assert not torch.equal(state["head.mlp.0.weight"], state["teacher.head.mlp.0.weight"])
    return summary, state, (tmp_path / "csv" / "metrics.csv").read_text()


@pytest.fixture(scope="session")
def simsiam_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One tiny SimSiam run (make_cfg's, a k-NN pass at its epoch's end), made once for every test
    that reads a finished run (its checkpoint, summary, evaluation, export, a refused resume):
    (run dir, summary). Such a test writes nothing into it but ``eval/`` (copy it to change it)."""
    from hvp_lightning.training.driver import run

    run_dir = tmp_path_factory.mktemp("simsiam_run")
    return run_dir, run(make_cfg("eval.every_n_epochs=1"), run_dir)


def score_and_assert_stateless(model: torch.nn.Module, batch: dict) -> CandidateScores:
    """Run the selection pass; assert every parameter, buffer (BN stats, teacher, centres)
    and the global RNG are exactly as before; return what it found (table and context)."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    scores = model.score_candidates(batch)
    assert torch.isfinite(scores.table).all()
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.state_dict()
    for k, v in before.items():
        assert torch.equal(after[k], v), k
    return scores


# summary.json's cost entries that are counts (the others are this session's times and rates)
COST_COUNTS = (
    "train_flops_per_image",
    "selection_flops_per_image",
    "baseline_flops_per_image",
    "total_flops",
    "selection_flops_share",
    "images",
    "selected_images",
)


def assert_same_reported_run(resumed: Path, straight: Path) -> None:
    """What a user reads of a run -- ``summary.json``'s train_loss, k-NN, label-free monitors and
    cost counts, every pass in ``monitors.json`` (hvp-monitors' record) and every epoch-level value
    of ``csv/metrics.csv`` (``*_epoch``, ``knn/*``, ``monitor/*``) -- is the uninterrupted run's,
    exactly (a resumed epoch's aggregates cover the whole epoch, not the resumed session's steps)."""
    import csv
    import json

    def reported(run_dir: Path) -> tuple[dict, dict]:
        summary = json.loads((run_dir / "summary.json").read_text())
        with (run_dir / "csv" / "metrics.csv").open(newline="") as f:
            rows = list(csv.DictReader(f))
        columns = [k for k in rows[0] if k.endswith("_epoch") or k.startswith(("knn/", "monitor/"))]
        epochs = {k: [(r["step"], r[k]) for r in rows if r[k]] for k in columns}
        keys = ("train_loss", "knn_top1", "steps", "monitor_rankme", "monitor_feature_std", "monitor_history")
        return {**{k: summary[k] for k in keys}, **{k: summary["cost"][k] for k in COST_COUNTS}}, epochs

    (summary_a, epochs_a), (summary_b, epochs_b) = reported(straight), reported(resumed)
    assert summary_a["train_loss"] is not None and epochs_a.get("train/loss_epoch") and epochs_a.get("monitor/rankme")
    assert summary_a["total_flops"] > 0
    assert summary_b == summary_a
    assert epochs_b == epochs_a
    passes = json.loads((straight / "monitors.json").read_text())
    assert passes["monitor_history"] and json.loads((resumed / "monitors.json").read_text()) == passes


def wandb_records(run_dir: Path, timeout_s: float = 30.0) -> list:
    """Every record of the one offline W&B run under ``run_dir/wandb``: the run (project, group,
    tags, name, config), metric definitions, history rows, ... (``wandb_internal_pb2.Record``).
    ``run.finish()`` can return before the W&B service has flushed the file, so this waits for
    the run's exit record."""
    import time

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + timeout_s
    while True:
        records = _read_wandb_log(path.read_bytes())
        if any(r.HasField("exit") for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _read_wandb_log(data: bytes) -> list:
    """The .wandb file is a LevelDB-style log: a 7-byte file header, then 32 KiB blocks of chunks,
    each with a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    import struct

    from wandb.proto import wandb_internal_pb2

    block = 32768
    assert b":W&B".startswith(data[:4]), "not a .wandb file"
    records, pos, buf = [], 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # no room for a chunk header: the block's zero trailer
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:  # zero padding
            pos += left
            continue
        if pos + 7 + length > len(data):  # a chunk still being written
            break
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            records.append(record)
            buf = b""
    return records


def eval_cfg(*overrides: str) -> DictConfig:
    """conf/eval.yaml composed with ``overrides`` (no progress bar)."""
    return compose_conf("eval", "progress_bar=false", *overrides)


def eval_settings(*overrides: str):
    """:func:`eval_cfg`, validated (the schema's checks only: ``ckpt`` need not exist)."""
    from hvp_lightning.schema import EvalConfig, settings

    return settings(EvalConfig, eval_cfg(*overrides))


def run_cli(main: Callable[[], None], *args: str, cwd: Path | None = None) -> tuple[int, str, str]:
    """A console command's ``main`` (``hvp_lightning.cli.train`` ...) called in this process as
    ``<command> *args`` from ``cwd``: (exit status, stdout, stderr). It answers what the command
    answers without the ~10 s a new interpreter spends importing torch and Lightning (the
    subprocess versions of these checks are in the slow tier). What Hydra changes in the process
    is put back: every logger's handlers and level (Hydra configures logging for the job), the
    working directory, ``sys.argv``."""
    from hydra.core.global_hydra import GlobalHydra

    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    saved = {id(lg): (list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in loggers}
    argv, here = sys.argv, Path.cwd()
    out, err = io.StringIO(), io.StringIO()
    code = 0
    sys.argv = ["command", *args]
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = argv
        os.chdir(here)
        GlobalHydra.instance().clear()
        for lg in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            if not isinstance(lg, logging.Logger):
                continue
            handlers, level, propagate, disabled = saved.get(id(lg), ([], logging.NOTSET, True, False))
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.handlers[:], lg.propagate, lg.disabled = handlers, propagate, disabled
            lg.setLevel(level)
    return code, out.getvalue(), err.getvalue()


def help_groups(script: str) -> set[str]:
    """The config groups ``python <script> --help`` lists (conf/hydra/help/hvp.yaml). Hydra lists
    them in ~3 s of CPU (a copy of its config store per group option), in a process or out."""
    proc = subprocess.run(
        [sys.executable, script, "--help"], cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    section = proc.stdout.split("== Configuration groups ==", 1)[1].split("== Keys ==", 1)[0]
    return {line.split(":", 1)[0] for line in section.splitlines()[2:] if ":" in line}


def compose_with_hydra(*overrides: str) -> DictConfig:
    """The composed config with its hydra node (launcher, callbacks, sweep dirs, mode)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def write_tiny_experiment(conf_dir: Path) -> None:
    """TINY as ``conf_dir/experiment/tiny.yaml``: ``train.py -m --config-dir conf_dir +experiment=tiny``
    is a tiny run in one override, so the sweep's job dir names stay short."""
    tiny = OmegaConf.create()
    for item in TINY:
        key, value = item.lstrip("+").split("=", 1)
        OmegaConf.update(tiny, key, yaml.safe_load(value), force_add=True)
    (conf_dir / "experiment").mkdir(parents=True, exist_ok=True)
    (conf_dir / "experiment" / "tiny.yaml").write_text("# @package _global_\n" + OmegaConf.to_yaml(tiny))


def official_pairs(G: int, rule: str = "cross") -> list[tuple[int, int]]:
    """Oracle for ``hvp.global_pairs``: the global pairs the official HVP code (automl/hvp,
    branches dino and ibot) scores -- a crop of pipeline 1 (even position) with one of
    pipeline 2 (odd), ``itertools.product(range(0, G, 2), range(1, G, 2))`` -- or all C(G,2)."""
    if rule == "cross":
        return list(itertools.product(range(0, G, 2), range(1, G, 2)))
    return list(itertools.combinations(range(G), 2))


# Every fp32_precision flag torch has; the generic one first (setting it cascades to the rest).
PRECISION_FLAGS = (
    "",
    "cuda.matmul",
    "mkldnn",
    "mkldnn.matmul",
    "mkldnn.conv",
    "mkldnn.rnn",
    "cudnn",
    "cudnn.conv",
    "cudnn.rnn",
)


def _precision_flag(path: str):
    obj = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def precision_flags() -> dict[str, str]:
    """torch's newer float32 precision API, every flag (``{"": generic, "cuda.matmul": ...}``)."""
    return {path: _precision_flag(path).fp32_precision for path in PRECISION_FLAGS}


@pytest.fixture
def matmul_precision_restored():
    """A test that changes torch's float32 precision (either API) leaves it as it found it."""
    legacy, flags = torch.get_float32_matmul_precision(), precision_flags()
    yield
    torch.set_float32_matmul_precision(legacy)  # first: it rewrites the matmul flags
    for path, value in flags.items():
        _precision_flag(path).fp32_precision = value
    assert torch.get_float32_matmul_precision() == legacy


def living_session(sid: int) -> list[int]:
    """The living (not zombie) processes of session ``sid``: a run started with
    ``start_new_session=True`` and everything it started (ranks, fork servers, loader workers)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@pytest.fixture
def hub_weights_cached(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The released weights the presets start from (``backbone.init=timm:...``) as if in the local
    Hugging Face cache: start-up then needs no network (tests download nothing)."""
    cache = tmp_path_factory.mktemp("hf_hub")
    for name in ("vit_small_patch16_224.dino",):
        (cache / f"models--timm--{name}").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))


def build(cfg):
    """The method of a training config (composed: validated first), as train.py builds it: its
    settings, HVP's and its backbone from the config (hvp_lightning/training/build.py)."""
    from hvp_lightning.training.build import build_method

    return build_method(typed(cfg))


def augs_of(cfg) -> tuple:
    """The view augmentation of each view the config's method asks its loader for."""
    from hvp_lightning.training.build import run_view_augs

    return run_view_augs(typed(cfg))


def counts_of(cfg) -> tuple[int, int]:
    """(G global, L local) views per image of a multi-crop method's config."""
    from hvp_lightning.settings import HVP_OFF
    from hvp_lightning.training.build import hvp_of, method_settings_of

    return method_settings_of(typed(cfg)).candidate_counts(hvp_of(typed(cfg)) or HVP_OFF)
