"""Console commands: ``hvp-train``, ``hvp-eval``, ``hvp-transfer``, ``hvp-export``, ``hvp-monitors``,
``hvp-make-shards``, ``hvp-analysis``, ``hvp-sweep-summary``.

``python train.py`` / ``python eval.py`` / ``python transfer.py`` in the repository call
:func:`train` / :func:`evaluate_main` / :func:`transfer_main` too. The Hydra configs are the
repository's top-level ``conf/``; a wheel ships that same folder as ``hvp_lightning/conf``
(pyproject.toml), so an installed copy trains from any directory.

    hvp-train method=simclr_cifar +hvp=on            # = python train.py ...
    hvp-train -m hvp.num_views=2,4,8 +hvp=on         # Hydra multirun, as with train.py
    hvp-eval protocol=knn ckpt=runs/<date>/<time>_simclr
    hvp-transfer ckpt=runs/<date>/<time>_simclr root=/datasets   # the paper's transfer table
    hvp-export RUN_DIR/checkpoints/last.ckpt backbone.pt
    hvp-monitors RUN_DIR [--follow 60] [--plot monitors.png]
    hvp-make-shards SRC OUT [--shard-size 256MB]        # then: data=shards 'data.urls="OUT/train-{...}.tar"'
    hvp-analysis RUN_DIR [BASELINE_RUN_DIR]
    hvp-sweep-summary multirun/<date>/<time> [--plot flops.png]

``hvp-export``, ``hvp-monitors``, ``hvp-make-shards``, ``hvp-analysis`` and ``hvp-sweep-summary`` are the
``main`` functions of :mod:`hvp_lightning.training.export`, :mod:`hvp_lightning.analysis.monitors`,
:mod:`hvp_lightning.data.make_shards`, :mod:`hvp_lightning.analysis` and :mod:`hvp_lightning.cluster.sweep`.
"""

from __future__ import annotations

import difflib
import logging
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .cluster import slurm, sweep  # noqa: F401  register ${hvp_dirname:...} (hydra.sweep.subdir), ${hvp_slurm_*:...}
from .config import check_eval_options, check_options
from .data.workers import worker_context
from .errors import CheckpointError, ConfigError
from .run.directory import RunDir, resolve_checkpoint
from .schema import EvalConfig, TrainConfig, TransferConfig, config_dir, container, help_listing, settings

# Nothing here imports torch, Lightning or the model code at module level: the commands check
# their config first (hvp_lightning/config.py) and import those only for a config that passed.


CONFIG_DIR = str(config_dir())


def resume_run_dir(resume: str) -> str:
    """The run dir that ``resume=`` names: the path itself, or for a checkpoint file the run dir
    holding it (``<run_dir>/checkpoints/<file>``), so that Hydra never tries to make a folder
    at a file's path."""
    p = Path(str(resume)).expanduser()
    return str(RunDir.of_checkpoint(p)) if p.is_file() or p.suffix == ".ckpt" else str(resume)


def hydra_files_subdir(resume: str | None, output_dir: str) -> str | None:
    """``hydra.output_subdir`` of a job: ``.hydra`` for a new run, None (Hydra writes no files) for
    a session that continues a run -- ``resume=`` given, or a run dir that already holds
    ``checkpoints/last.ckpt`` -- so that the run dir's ``.hydra/`` keeps describing the command that
    started the run (a sweep job's row keeps its overrides), and a refused resume, which Hydra
    would otherwise have rewritten them for before our checks run, leaves the run dir as it was."""
    run_dir = RunDir(output_dir)
    return None if resume or run_dir.has_run() else run_dir.hydra.name


# hydra.run.dir: the run dir being resumed, else a new timestamped one; hydra.output_subdir:
# hydra_files_subdir (conf/config.yaml).
OmegaConf.register_new_resolver(
    "hvp_resume_or", lambda resume, new: resume_run_dir(resume) if resume else new, replace=True
)
OmegaConf.register_new_resolver("hvp_hydra_files", hydra_files_subdir, replace=True)

# The config groups eval.py and transfer.py compose from (by their config's name); train.py's
# are all the others but protocol. Hydra's --help would list every group under conf/ for each.
EVAL_GROUPS = {"eval": ("protocol", "data", "logger"), "transfer": ("logger",)}


def help_groups(config_name: str) -> str:
    """The "Configuration groups" of ``--help`` (conf/hydra/help/hvp.yaml) for the command whose
    top-level config is ``config_name``, one line a group as Hydra writes them; the schema's own
    nodes (``_simclr``, ``_resnet``: what presets extend, hvp_lightning/schema/nodes.py) left out."""
    from hydra.core.global_hydra import GlobalHydra

    def shown(group: str) -> bool:
        if group.split("/")[0] == "hydra":
            return False
        return group in EVAL_GROUPS[config_name] if config_name in EVAL_GROUPS else group != "protocol"

    hydra_app = GlobalHydra.instance().hydra
    assert hydra_app is not None  # set while Hydra prints --help
    lines = []
    for group in sorted(g for g in hydra_app.list_all_config_groups() if shown(g)):
        options = sorted(o for o in hydra_app.config_loader.get_group_options(group) if not o.startswith("_"))
        lines.append(f"{group}: {', '.join(options)}")
    return "\n".join(lines)


OmegaConf.register_new_resolver("hvp_help_groups", help_groups, replace=True)


def help_keys(config_name: str, _root_: DictConfig) -> str:
    """``--help``'s listing of every key of the groups the command line chose, with its value, what
    it allows and its doc (:func:`hvp_lightning.schema.help_listing`)."""
    command = config_name if config_name in EVAL_GROUPS else "train"
    task = OmegaConf.masked_copy(_root_, [k for k in _root_ if k != "hydra"])
    return help_listing(command, OmegaConf.to_container(task, resolve=True, throw_on_missing=False))


OmegaConf.register_new_resolver("hvp_help_keys", help_keys, replace=True)


def checked_resume(resume: str, run_dir: Path, fresh: bool) -> str:
    """``resume=``'s run dir, or a :class:`CheckpointError` that says what is wrong with it: a
    run resumes from its own ``checkpoints/last.ckpt``, so that file (= its run dir) is accepted
    and any other checkpoint file is not; a path where Hydra has just made the run dir held
    no run."""
    p = Path(str(resume)).expanduser()
    if p.is_file():
        if RunDir.is_last_checkpoint(p):
            return str(RunDir.of_checkpoint(p))
        raise CheckpointError(
            f"resume={str(resume)!r} is not allowed: a run dir (it continues from its "
            "checkpoints/last.ckpt; to restart from another checkpoint, copy it to "
            "checkpoints/last.ckpt of a new run dir and resume that)"
        )
    if fresh and (p.resolve() == run_dir.resolve() or p.suffix == ".ckpt"):
        raise CheckpointError(
            f"resume={str(resume)!r} is not allowed: a run dir holding checkpoints/last.ckpt (no run at that path)"
        )
    return str(resume)


# Overrides whose value is a path. Kept checkpoints are named ``epoch=NNN.ckpt``, and Hydra's
# override grammar refuses an unquoted '=' in a value: :func:`quote_path_overrides` quotes it.
PATH_KEYS = (
    r"ckpt|resume|out_dir|budget\.match|backbone\.init|(?:[\w.]+\.)?(?:eval_)?root"  # root: transfer.py's, data.*root
)
PATH_OVERRIDE = re.compile(rf"(?P<key>\+{{0,2}}(?:{PATH_KEYS}))=(?P<value>.*)", re.S)


def existing_paths(value: str) -> list[str] | None:
    """``value`` cut at commas into the fewest existing paths, or None if it cannot be. A sweep job
    dir's name holds commas itself (``0_+hvp=on,hvp.enabled=true,seed=0``), so a sweep over two of
    them is not its comma-separated pieces but runs of them, each an existing path."""
    pieces = value.split(",")
    fewest: dict[int, list[str]] = {0: []}  # fewest[i]: pieces[:i] as the fewest existing paths
    for j in range(1, len(pieces) + 1):
        cuts = [fewest[i] + [",".join(pieces[i:j])] for i in list(fewest)]
        cuts = [c for c in cuts if Path(c[-1]).expanduser().exists()]
        if cuts:
            fewest[j] = min(cuts, key=len)
    return fewest.get(len(pieces))


def quoted_path(arg: str, multirun: bool = False) -> str:
    """``arg`` with its value quoted, if it is a path override whose value holds '=' and is not
    written in Hydra's grammar already (quoted, escaped with a backslash, a list, a sweep
    function). A comma is part of the path (sweep job dirs are named ``0_method=simclr,seed=1``),
    except under ``-m`` where the value cuts into several existing paths (:func:`existing_paths`):
    a sweep over them."""
    m = PATH_OVERRIDE.fullmatch(arg)
    value = m["value"] if m else ""
    if "=" not in value or value[0] in "'\"" or any(c in value for c in "()[]{}\\"):
        return arg
    paths = (existing_paths(value) if multirun else None) or [value]
    if any("'" in p and '"' in p for p in paths):
        return arg  # no quote left to quote it with: Hydra says what is wrong
    return f"{m['key']}=" + ",".join(f'"{p}"' if "'" in p else f"'{p}'" for p in paths)


def quote_path_overrides(argv: list[str]) -> list[str]:
    """``argv`` with path overrides such as ``ckpt=<run_dir>/checkpoints/epoch=100.ckpt`` quoted,
    so that the documented commands parse as typed (the shell has already removed the user's quotes)."""
    multirun = "-m" in argv or "--multirun" in argv
    return [quoted_path(arg, multirun) for arg in argv]


class SweepConfigError(CompactHydraException):
    """A sweep job's config error: Hydra reports the job failed with this one line (no traceback),
    runs the other jobs, and its sweep_summary.csv row says failed."""


def user_errors() -> tuple[type[Exception], ...]:
    """The exceptions that mean "bad settings": :class:`ConfigError`, and Lightning's
    ``MisconfigurationException`` once Lightning is imported (a config error found before
    that cannot be Lightning's)."""
    lightning_errors = sys.modules.get("lightning.fabric.utilities.exceptions")
    return (ConfigError,) + ((lightning_errors.MisconfigurationException,) if lightning_errors else ())


def sigterm_exits() -> tuple[type[BaseException], ...]:
    """Lightning's ``SIGTERMException`` once Lightning is imported: a ``SystemExit`` without a code,
    with which a killed evaluation would end with status 0."""
    lightning_errors = sys.modules.get("lightning.pytorch.utilities.exceptions")
    return (lightning_errors.SIGTERMException,) if lightning_errors else ()


def say_config_error(err: Exception) -> None:
    """Each problem of a refused command on its own line: ``config error: <key>=<value> is not allowed: ...``."""
    for line in str(err).splitlines() or [""]:
        print(f"config error: {line}", file=sys.stderr)


def stopped(what: str) -> NoReturn:
    """End a command that SIGTERM stopped, saying ``what`` it left, with status 143 (128 + signal) as train.py."""
    print(f"stopped by SIGTERM: {what}", file=sys.stderr)
    sys.exit(128 + signal.SIGTERM)


def _close_log_files(run_dir: Path) -> None:
    """Close Hydra's log file handlers that write into ``run_dir`` (``train.log``)."""
    for handler in list(logging.root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == run_dir.resolve():
            logging.root.removeHandler(handler)
            handler.close()


def _leave_as_it_was(run_dir: Path) -> None:
    """After a refused continuation of the run in ``run_dir``: Hydra wrote no ``.hydra/`` files
    (:func:`hydra_files_subdir`) but opened ``train.log``, creating it empty where the run had none;
    that empty file goes (a run that trained has always logged to it)."""
    _close_log_files(run_dir)
    log_file = RunDir(run_dir).train_log
    if log_file.is_file() and log_file.stat().st_size == 0:
        log_file.unlink()


def _remove_run_dir(run_dir: Path) -> None:
    """Delete a run dir made for a run that never started (close Hydra's log file in it first),
    and the folders above it that are left empty, up to the working directory (the default
    ``runs/<date>/``), so that a rejected command leaves nothing behind."""
    run_dir = run_dir.resolve()
    _close_log_files(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    cwd = Path.cwd().resolve()
    for parent in run_dir.parents:
        if parent == cwd or cwd not in parent.parents:
            break
        try:
            parent.rmdir()  # only an empty folder goes
        except OSError:
            break


@hydra.main(config_path=CONFIG_DIR, config_name="config", version_base="1.3")
def train_job(cfg: DictConfig) -> float | None:
    """One training job under Hydra (a run, or one job of a ``-m`` sweep); :func:`train` starts it."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    fresh = RunDir(run_dir).just_made()
    try:
        if cfg.get("resume"):  # continue that run with its own config (+ what the command line changes)
            cfg.resume = checked_resume(cfg.resume, run_dir, fresh)
            resolve_checkpoint(cfg.resume, key="resume")  # the path, before the heavy imports
            from .training.checkpoint import resume_config

            cfg = resume_config(cfg.resume, cfg, list(HydraConfig.get().overrides.task))
            run_dir = Path(cfg.resume)
        s = check_options(cfg)  # the config alone, before the heavy imports: the validated config
        if s.data.num_workers:
            worker_context()  # the loader workers' fork server imports its preload beside ours
        from .training.driver import run

        summary = run(s, run_dir)
    except user_errors() as err:  # bad settings: one line, no traceback
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # this job fails, the sweep goes on
            raise SweepConfigError("; ".join(f"config error: {line}" for line in str(err).splitlines())) from err
        say_config_error(err)
        output_dir = Path(HydraConfig.get().runtime.output_dir)
        if fresh:  # a rejected command leaves nothing behind
            _remove_run_dir(output_dir)
        else:  # nor does a refused resume change the run's dir
            _leave_as_it_was(output_dir)
        sys.exit(2)
    from lightning.pytorch.utilities import rank_zero_only

    from .training.driver import final_line

    if rank_zero_only.rank == 0:  # DDP: one final line per run, not one per process
        print(final_line(summary))
    return summary["knn_top1"]  # lets Hydra sweepers optimise it


# Hydra's flags that take a value (the value is no override)
VALUE_FLAGS = ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
               "--info", "-i", "--experimental-rerun")  # fmt: skip
HELP_FLAGS = ("--help", "-h", "--hydra-help", "--info", "-i", "--cfg", "-c", "--shell-completion", "-sc")
SCHEMAS = {"config": TrainConfig, "eval": EvalConfig, "transfer": TransferConfig}


def checked_command_line(config_name: str, args: list[str]) -> list[str]:
    """The command's overrides, checked before Hydra runs anything: a typo is one line naming the
    closest key, whether or not it was written with ``+`` (Hydra refuses ``key=value`` for a key
    the config lacks in four lines, without one), a group option that does not exist names the
    options, and a bad value names what is allowed, for the first value of each swept key before
    any job starts. An unknown key becomes an addition (``+key=value``) for the schema to judge
    (:mod:`hvp_lightning.schema`): refused, except a ``trainer`` key, which may be any
    ``lightning.Trainer`` argument; ``+key=value`` for a key the schema declares sets it
    (``++key=value``: before the schema, some keys needed the ``+``). Returns ``args`` so changed."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException

    if any(a in HELP_FLAGS or a.startswith(("--help", "--cfg=", "--info=")) for a in args):
        return args
    positions = [i for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in VALUE_FLAGS)]
    try:
        overrides = OverridesParser.create().parse_overrides([args[i] for i in positions])
    except HydraException:
        return args  # Hydra says what is wrong with the grammar
    single: list[str | None] = []
    for ov in overrides:
        value = next(iter(ov.sweep_string_iterator())) if ov.is_sweep_override() else None
        single.append(f"{ov.get_key_element()}={value}" if value is not None else ov.input_line)
    search = [f"file://{Path(d).resolve()}" for d in config_dirs(args)]
    hydra_keys = [f"hydra.searchpath=[{','.join(search)}]"] if search else []
    prefix = {}  # override index -> "+" (an unknown key) or "+" (a known key given with +: now ++)
    chosen = [i for i, ov in enumerate(overrides) if not ov.key_or_group.startswith("hydra")]
    groups = {i for i in chosen if is_group(overrides[i].key_or_group, search)}
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        try:
            try:
                cfg = compose(config_name, overrides=[single[i] for i in chosen] + hydra_keys)
            except MissingConfigException:  # a group option that does not exist: said with the group's options
                loader = GlobalHydra.instance().hydra.config_loader  # type: ignore[union-attr]
                for i in sorted(groups):
                    if not overrides[i].is_delete():
                        check_options_exist(overrides[i], loader.get_group_options(overrides[i].key_or_group))
                raise
            except ConfigCompositionException:  # a key's +: from whether the config of the groups chosen has it
                base = compose(config_name, overrides=[single[i] for i in sorted(groups)] + hydra_keys)
                for i in chosen:
                    ov = overrides[i]
                    if i in groups or ov.is_delete() or ov.is_force_add():
                        continue
                    there = OmegaConf.select(base, ov.key_or_group, default=ABSENT) is not ABSENT
                    if there == ov.is_add():  # key=value for a key it lacks, +key=value for one it has
                        prefix[i] = "+"
                        single[i] = f"+{single[i]}"
                cfg = compose(config_name, overrides=[single[i] for i in chosen] + hydra_keys)
        except ConfigError:
            raise
        except Exception:  # noqa: BLE001 -- anything else is Hydra's to report, as without this check
            return args
    if config_name == "config":
        from .config import refuse_group_keys_without_group

        if cfg.get("resume"):
            return args  # the run's own config, with these changes: checked when it is read
        refuse_group_keys_without_group(cfg)
    settings(SCHEMAS[config_name], container(cfg))
    out = list(args)
    for at, plus in prefix.items():
        out[positions[at]] = f"{plus}{args[positions[at]]}"
    return out


def config_dirs(args: list[str]) -> list[str]:
    """The folders ``--config-dir DIR`` / ``-cd DIR`` / ``--config-dir=DIR`` add to Hydra's search path."""
    out = []
    for i, a in enumerate(args):
        if a in ("--config-dir", "-cd") and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith("--config-dir="):
            out.append(a.split("=", 1)[1])
    return out


def command_line_or_exit(config_name: str, args: list[str]) -> list[str]:
    """:func:`checked_command_line`, or its problems said (one line each) and exit status 2."""
    try:
        return checked_command_line(config_name, args)
    except ConfigError as err:
        say_config_error(err)
        sys.exit(2)


ABSENT = object()  # OmegaConf.select's answer for a key a config lacks


def is_group(key: str, search: list[str]) -> bool:
    """Whether an override's ``key`` names a config group (``method``, ``data/aug``, ``+hvp``), not a
    key: a folder of the config dirs (ours, a ``--config-dir``'s) or a group of the schema's nodes."""
    from hydra.core.config_store import ConfigStore

    folders = [Path(CONFIG_DIR), *(Path(s.removeprefix("file://")) for s in search)]
    if any((folder / key).is_dir() for folder in folders):
        return True
    try:
        return bool(ConfigStore.instance().list(key))
    except OSError:  # ConfigStore: no such group
        return False


def check_options_exist(ov: Any, options: list[str]) -> None:
    """A group override's option (each of a sweep's) is one of the group's, or one line naming
    them (the schema's own nodes, ``_simclr`` ..., are not options to choose)."""
    shown = [o for o in options if not o.startswith("_")]
    values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.value()]
    for option in values:
        if isinstance(option, str) and option not in options:
            close = difflib.get_close_matches(option, shown, n=1)
            hint = f" (did you mean {ov.key_or_group}={close[0]}?)" if close else ""
            raise ConfigError(f"{ov.key_or_group}={option} is not allowed: one of {', '.join(shown)}{hint}")


def train() -> None:
    """``hvp-train`` / ``python train.py``: :func:`train_job` through Hydra. A sweep in which a job
    stopped on a config error ends the same way whether or not ``HYDRA_FULL_ERROR`` is set: that
    job's ``config error: ...`` line and exit code 1, as Hydra ends any sweep with a failed job
    (with ``HYDRA_FULL_ERROR=1`` Hydra would re-raise it: a traceback for a user error). A single
    run refused for its settings exits with 2 (:func:`train_job`); crashes keep Hydra's handling."""
    sys.argv = quote_path_overrides(sys.argv)
    sys.argv[1:] = command_line_or_exit("config", sys.argv[1:])
    try:
        train_job()
    except SweepConfigError as err:  # only reaches here when Hydra re-raises (HYDRA_FULL_ERROR=1)
        print(err, file=sys.stderr)
        sys.exit(1)


@hydra.main(config_path=CONFIG_DIR, config_name="eval", version_base="1.3")
def evaluate_job(cfg: DictConfig) -> float | None:
    """One evaluation under Hydra; :func:`evaluate_main` starts it."""
    try:
        s = check_eval_options(cfg)  # the config alone, before the heavy imports: the validated config
        if s.num_workers != 0:  # null: the data's (2 by default)
            worker_context()  # the loader workers' fork server imports its preload beside ours
        from .evaluation import evaluate

        summary = evaluate(s)
    except user_errors() as err:  # bad settings or checkpoint: one line each, no traceback
        say_config_error(err)
        sys.exit(2)
    except sigterm_exits():
        stopped("the evaluation wrote no eval_summary.json (the earlier one was removed when it started)")
    print(eval_line(summary))
    return summary["metrics"]["top1"]


def eval_line(summary: dict[str, Any]) -> str:
    """``eval.py``'s last line: top-1 and top-5 and what they are of (a k-NN's k: the neighbours
    that voted, which a ``protocol.ks`` entry above the training images does not give)."""
    m, what = summary["metrics"], ""
    if summary["protocol"] == "knn":
        n = summary["dataset"]["train_images"]
        over = [k for k in summary["settings"]["ks"] if k > n]
        what = f" (k={m['k_for_top1']}" + (
            f"; protocol.ks {over} above the {n} training images count all of them)" if over else ")"
        )
    if m.get("best_top1") is not None:  # a classifier: also the official scripts' best epoch
        what = f" (last epoch; best: {100 * m['best_top1']:.2f}% at epoch {m['best_epoch']})"
    return (
        f"{summary['protocol']} top-1: {100 * m['top1']:.2f}%{what}, top-5: {100 * m['top5']:.2f}% "
        f"(chance {100 * summary['chance']:.1f}%) | {summary['out_dir']}/eval_summary.json"
    )


def evaluate_main() -> None:
    """``hvp-eval`` / ``python eval.py``: :func:`evaluate_job` on the command line, paths quoted."""
    sys.argv = quote_path_overrides(sys.argv)
    sys.argv[1:] = command_line_or_exit("eval", sys.argv[1:])
    evaluate_job()


@hydra.main(config_path=CONFIG_DIR, config_name="transfer", version_base="1.3")
def transfer_job(cfg: DictConfig) -> None:
    """The paper's transfer table for one checkpoint (:mod:`hvp_lightning.evaluation.transfer`)."""
    from .evaluation.transfer import check_transfer_options, run_transfer, transfer_out_dir

    s = None
    try:
        s, jobs = check_transfer_options(cfg)  # settings and every data set's files, before the heavy imports
        run_transfer(s, jobs)
    except user_errors() as err:  # bad settings or checkpoint: one line each, no traceback
        say_config_error(err)
        sys.exit(2)
    except sigterm_exits():
        table = transfer_out_dir(s).table_md if s is not None else "the table"
        stopped(f"the evaluation under way wrote no eval_summary.json; {table} holds the finished ones")
    print(transfer_out_dir(s).table_md.read_text(), end="")


def transfer_main() -> None:
    """``hvp-transfer`` / ``python transfer.py``: :func:`transfer_job` on the command line, paths quoted."""
    sys.argv = quote_path_overrides(sys.argv)
    sys.argv[1:] = command_line_or_exit("transfer", sys.argv[1:])
    transfer_job()
