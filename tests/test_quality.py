"""benchmarks/quality.py: the run plan, the commands and the report, on fake finished runs."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import yaml
from scipy import stats

from .conftest import REPO


def _load():
    spec = importlib.util.spec_from_file_location("quality", REPO / "benchmarks" / "quality.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["quality"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


q = _load()


def _fake_run(job, knn: list[float], linear: float | None, cfg: dict) -> None:
    job.run_dir.mkdir(parents=True)
    hist = [{"epoch": float(e), "step": 10 * e, "top1": v, "top5": 0.9, "images_seen": 0} for e, v in enumerate(knn)]
    (job.run_dir / "summary.json").write_text(
        json.dumps(
            {
                "knn_top1": knn[-1],
                "knn_top1_init": knn[0],
                "wall_time_s": 60.0,
                "knn_history": hist,
                "images_seen": 1000,
                "hvp": None,
            }
        )
    )
    (job.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    if linear is not None:
        (job.run_dir / "eval" / "linear").mkdir(parents=True)
        (job.run_dir / "eval" / "linear" / "eval_summary.json").write_text(json.dumps({"metrics": {"top1": linear}}))


def test_plan_and_commands_differ_only_in_hvp_keys_and_seed(tmp_path: Path) -> None:
    scale = q.SCALES["cpu"]
    jobs = q.plan(scale, list(scale.per_method), q.DEFAULT_ARMS, [0, 1, 2], tmp_path)
    per_seed = len(scale.per_method) * len(q.DEFAULT_ARMS)
    assert len(jobs) == 3 * per_seed and [j.seed for j in jobs[:per_seed]] == [0] * per_seed  # seeds outermost
    base = q.train_command(scale, jobs[0])
    for j in jobs:
        extra = set(q.train_command(scale, j)) - set(base)
        assert all(e.startswith(("+hvp", "hvp.", "seed=", "hydra.run.dir=", "method")) for e in extra), extra
    hard = next(j for j in jobs if j.arm == "hard" and j.method == "simclr")
    rand = next(j for j in jobs if j.arm == "random" and j.method == "simclr")
    assert set(q.train_command(scale, hard)) ^ set(q.train_command(scale, rand)) == {
        "hvp.mode=hard",
        "hvp.mode=random",
        f"hydra.run.dir={hard.run_dir}",
        f"hydra.run.dir={rand.run_dir}",
    }


def test_t_interval_matches_scipy() -> None:
    d = [0.01, -0.02, 0.005]
    mean, lo, hi = q.t_interval(d)
    ref = stats.t.interval(0.95, len(d) - 1, loc=sum(d) / 3, scale=stats.sem(d))
    assert mean == pytest.approx(sum(d) / 3) and (lo, hi) == pytest.approx(ref)
    assert math.isnan(q.t_interval([0.1])[1])


def test_report_table_curves_and_config_check(tmp_path: Path) -> None:
    scale = q.SCALES["cpu"]
    arms = ["baseline", "hard"]
    jobs = q.plan(scale, ["simclr"], arms, [0, 1, 2], tmp_path)
    cfg = {"method": {"name": "simclr"}, "hvp": None, "seed": 0}
    for j in jobs:
        b = 0.30 + 0.01 * j.seed
        curve = [0.25, b - 0.02, b] if j.arm == "baseline" else [0.25, b - 0.03, b + 0.02]
        _fake_run(j, curve, b + 0.1, dict(cfg, seed=j.seed, hvp={"mode": "hard"} if j.arm == "hard" else None))
    text = q.report("cpu", scale, jobs, ["simclr"], arms, tmp_path, "cmd")
    row = next(line for line in text.splitlines() if line.startswith("| simclr | hard |") and "knn" not in line)
    assert "33.00 ± 1.00" in row and "+2.00 (2.00, 2.00)" in row  # identical paired diffs: zero-width CI
    assert "checked: saved configs agree" in text
    assert "simclr hard: at or above baseline at 1/2 epochs (2); at epoch 2: +2.00 pp" in text
    assert (tmp_path / "knn_curves.png").stat().st_size > 10_000
    numbers = json.loads((tmp_path / "quality.json").read_text())
    assert numbers["linear"]["simclr/hard"]["mean"] == pytest.approx(0.41)
    # a key other than hvp/seed that differs between arms is reported, not hidden
    (jobs[1].run_dir / "config.yaml").write_text(yaml.safe_dump(dict(cfg, method={"name": "simclr", "lr": 9})))
    assert any("method.lr differs" in p for p in q.config_differences(jobs))


def test_methods_whose_baseline_does_not_learn_are_left_out(tmp_path: Path) -> None:
    """A method whose baseline ends at or below its random-init k-NN has nothing to compare: the
    report names it and why, and has no table row for it (the CPU scale's SimSiam, issue 14)."""
    scale = q.SCALES["cpu"]
    arms = ["baseline", "hard"]
    jobs = q.plan(scale, ["simclr", "simsiam"], arms, [0, 1], tmp_path)
    for j in jobs:
        curve = [0.25, 0.40] if j.method == "simclr" else [0.63, 0.60 + 0.01 * (j.arm == "hard")]
        _fake_run(j, curve, None, {"method": {"name": j.method}, "seed": j.seed})
    text = q.report("cpu", scale, jobs, ["simclr", "simsiam"], arms, tmp_path, "cmd")
    assert "| simclr | hard |" in text and "| simsiam |" not in text
    assert "- simsiam: not reported, its baseline does not learn at this budget (final k-NN 60.00% vs 63.00%" in text
    assert "simsiam" not in q.SCALES["cpu"].per_method  # so the CPU benchmark does not spend hours on it


def test_a_report_where_no_method_learns_has_no_figure(tmp_path: Path) -> None:
    """Every method left out: the report says so and draws nothing (matplotlib cannot draw zero
    panels; the report failed after all runs had finished), and --results links no figure."""
    args = ["--methods", "simclr", "--arms", "baseline", "hard", "--seeds", "0", "--out", str(tmp_path)]
    for j in q.plan(q.SCALES["cpu"], ["simclr"], ["baseline", "hard"], [0], tmp_path):
        _fake_run(j, [0.30, 0.30], None, {"method": {"name": "simclr"}, "seed": 0})
    results = tmp_path / "RESULTS.md"
    q.main([*args, "--report-only", "--results", str(results)])
    text = results.read_text()
    assert "- simclr: not reported" in text and q.NO_FIGURE in text and "![" not in text
    assert not list(tmp_path.glob("*.png"))


def test_unfinished_runs_are_left_out(tmp_path: Path) -> None:
    scale = q.SCALES["cpu"]
    jobs = q.plan(scale, ["simsiam"], ["baseline", "easy"], [0, 1], tmp_path)
    _fake_run(jobs[0], [0.2, 0.3], None, {"seed": 0})
    res = q.load_results(jobs)
    assert list(res) == [("simsiam", "baseline")] and res[("simsiam", "baseline")][0]["linear"] is None
    assert not q._done(jobs[0], linear=True) and q._done(jobs[0], linear=False)


def _covering(jobs: list) -> list:
    """Each method once and each arm once: every override a scale's commands hold."""
    by_method = {j.method: j for j in reversed(jobs)}
    by_arm = {j.arm: j for j in jobs}
    return [j for j in jobs if j in by_method.values() or j in by_arm.values()]


@pytest.mark.parametrize(
    "scale_name, covering",
    [(name, True) for name in sorted(q.SCALES)]
    + [pytest.param(name, False, marks=pytest.mark.slow) for name in sorted(q.SCALES)],
    ids=[f"{name}-{part}" for part in ("each method and arm", "every job") for name in sorted(q.SCALES)],
)
def test_every_run_config_composes_and_validates(scale_name: str, covering: bool) -> None:
    """A typo in a scale's overrides would only show after hours of other runs: compose them all
    (each method once and each arm once in the default suite; every method x arm: slow)."""
    from hvp_lightning.config import validate

    from .conftest import SHARED_CIFAR, make_cfg

    scale = q.SCALES[scale_name]
    jobs = q.plan(scale, list(scale.per_method), list(q.ARMS), [0], Path("/tmp/unused"))
    for job in _covering(jobs) if covering else jobs:
        overrides = [o for o in q.train_command(scale, job)[2:] if not o.startswith("hydra.")]
        cfg = make_cfg(*overrides, tiny=False)
        assert cfg.method.name == job.method and job.arm.startswith("baseline") == (cfg.get("hvp") is None)
        epochs = int(next(o for o in scale.common if o.startswith("trainer.max_epochs=")).split("=")[1])
        assert cfg.trainer.max_epochs == (scale.long_epochs if job.arm == q.LONG_ARM else epochs)
        assert 1.5 * epochs <= scale.long_epochs <= 1.7 * epochs  # ~ the measured N=4 step cost
        if SHARED_CIFAR.is_dir():  # validation also checks the data root
            cfg.data.root = str(SHARED_CIFAR)
            validate(cfg)


def test_equal_compute_arm_changes_only_the_epochs(tmp_path: Path) -> None:
    """baseline_long is the baseline with the scale's long_epochs: its command adds exactly that
    override, the config check allows exactly that key for it, and the report compares hard to it."""
    scale = q.SCALES["cpu"]
    arms = ["baseline", "hard", q.LONG_ARM]
    jobs = q.plan(scale, ["simclr"], arms, [0, 1], tmp_path)
    base, _, long = jobs[:3]
    extra = set(q.train_command(scale, long)) - set(q.train_command(scale, base))
    assert extra == {f"trainer.max_epochs={scale.long_epochs}", f"hydra.run.dir={long.run_dir}"}
    cfg = {"method": {"name": "simclr"}, "trainer": {"max_epochs": 12}, "hvp": None, "seed": 0}
    for j in jobs:
        knn = {"baseline": 0.30, "hard": 0.33, q.LONG_ARM: 0.32}[j.arm] + 0.01 * j.seed
        run_cfg = dict(cfg, seed=j.seed, hvp={"mode": "hard"} if j.arm == "hard" else None)
        if j.arm == q.LONG_ARM:
            run_cfg["trainer"] = {"max_epochs": scale.long_epochs}
        _fake_run(j, [0.25, knn], knn + 0.1, run_cfg)
    assert q.config_differences(jobs) == []
    text = q.report("cpu", scale, jobs, ["simclr"], arms, tmp_path, "cmd")
    section = text.split("Equal compute")[1]
    row = next(line for line in section.splitlines() if line.startswith("| simclr | hard |"))
    assert "+1.00 (1.00, 1.00)" in row  # 33% vs 32%, paired over 2 seeds
    assert "simclr baseline_long" not in text  # no per-epoch crossing for a stretched schedule
    numbers = json.loads((tmp_path / "quality.json").read_text())
    assert numbers["knn"][f"simclr/hard vs {q.LONG_ARM}"]["diff"] == pytest.approx(0.01)
    # any other differing key is still reported
    (long.run_dir / "config.yaml").write_text(yaml.safe_dump(dict(cfg, seed=0, trainer={"max_epochs": 19, "x": 1})))
    assert [p for p in q.config_differences(jobs) if "trainer.x" in p]


def test_main_plans_and_reports_from_finished_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The script's main in-process: --dry-run prints one train.py command per run; --report-only on
    finished runs writes the report and appends it, with the figure beside it, to --results."""
    args = ["--methods", "simclr", "--arms", "baseline", "hard", "--seeds", "0", "1", "--out", str(tmp_path)]
    q.main([*args, "--dry-run"])
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 4 and all(" train.py " in c and "method=simclr_cifar" in c for c in commands)
    for j in q.plan(q.SCALES["cpu"], ["simclr"], ["baseline", "hard"], [0, 1], tmp_path):
        knn = 0.30 + 0.01 * j.seed + 0.02 * (j.arm == "hard")
        _fake_run(j, [0.25, knn], knn + 0.1, {"method": {"name": "simclr"}, "seed": j.seed, "hvp": j.arm})
    results = tmp_path / "RESULTS.md"
    q.main([*args, "--report-only", "--results", str(results)])
    text = results.read_text()
    assert "Command: `uv run python benchmarks/quality.py --methods simclr" in text
    assert "| simclr | hard | 2 | 32.50 ± 0.71 | +2.00 (2.00, 2.00) |" in text
    assert text.endswith("![k-NN curves, cpu scale](quality_cpu_knn_curves.png)\n")
    assert (tmp_path / "quality_cpu_knn_curves.png").stat().st_size > 10_000


TINY_SCALE = q.Scale(
    description="the built-in textures, 1 epoch: checks the benchmark runs, its numbers mean nothing",
    common=[
        "data=synthetic",
        "data.train_size=64",
        "data.test_size=32",
        "data.crop_size=16",
        "data.num_workers=0",
        "backbone.width=4",
        "method.batch_size=16",
        "trainer=cpu",
        "trainer.max_epochs=1",
        "logger=csv",
        "checkpoint.every_n_epochs=null",
        "+trainer.enable_progress_bar=false",
    ],
    per_method={"simclr": ["method=simclr_cifar", "method.proj_hidden_dim=32", "method.proj_dim=16"]},
    threads_per_job=1,
    jobs=2,
    linear=["protocol.epochs=1", "protocol.batch_size=16"],
    long_epochs=2,
)


@pytest.mark.slow  # two tiny train.py runs and their linear probes, two at a time: ~1 min on 2 cores
def test_a_tiny_scale_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole benchmark at a tiny scale: train.py and eval.py per run, then the report; a second
    call finds every run done and trains nothing."""
    monkeypatch.setitem(q.SCALES, "tiny", TINY_SCALE)
    args = ["--scale", "tiny", "--arms", "baseline", "hard", "--seeds", "0", "--out", str(tmp_path)]
    q.main(args)
    for arm in ("baseline", "hard"):
        run = tmp_path / "simclr" / arm / "seed0"
        assert (run / "summary.json").is_file() and (run / "eval" / "linear" / "eval_summary.json").is_file()
    report = (tmp_path / "report.md").read_text()
    assert "Runs finished: 2/2" in report and "checked: saved configs agree" in report
    assert json.loads((tmp_path / "quality.json").read_text())["config_differences"] == []
    log = (tmp_path / "simclr" / "hard" / "seed0" / "benchmark.log").read_text()
    q.main(args)
    assert (tmp_path / "simclr" / "hard" / "seed0" / "benchmark.log").read_text() == log  # nothing ran again
