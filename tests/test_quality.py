"""benchmarks/quality.py: the run plan, the commands and the report, on fake finished runs."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
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


BASE_FPI = 100  # the fake runs' baseline model FLOPs per image
EPOCH_IMAGES = 1000


def _fake_run(
    job, knn: list[float], linear: float | None, cfg: dict, ratio: float = 1.0, selection: float | None = None
) -> None:
    """A finished run: its k-NN per epoch (``knn[0]`` at init), linear top-1, config, and model FLOPs
    (``ratio`` times the baseline's per image, one epoch per k-NN pass after init)."""
    job.run_dir.mkdir(parents=True)
    hist = [{"epoch": float(e), "step": 10 * e, "top1": v, "top5": 0.9, "images_seen": 0} for e, v in enumerate(knn)]
    epochs, images = len(knn) - 1, EPOCH_IMAGES * (len(knn) - 1)
    cost = {
        "train_flops_per_image": BASE_FPI,
        "selection_flops_per_image": BASE_FPI * (ratio - 1) if selection is None else selection,
        "baseline_flops_per_image": BASE_FPI,
        "total_flops": round(BASE_FPI * ratio * images),
        "images": images,
        "images_per_s": 100.0,
    }
    (job.run_dir / "summary.json").write_text(
        json.dumps(
            {
                "knn_top1": knn[-1],
                "knn_top1_init": knn[0],
                "wall_time_s": 60.0,
                "knn_history": hist,
                "images_seen": images,
                "epochs": epochs,
                "hvp": None,
                "cost": cost,
            }
        )
    )
    (job.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    if linear is not None:
        (job.run_dir / "eval" / "linear").mkdir(parents=True)
        (job.run_dir / "eval" / "linear" / "eval_summary.json").write_text(json.dumps({"metrics": {"top1": linear}}))


def test_plan_and_commands_differ_only_in_hvp_keys_and_seed(tmp_path: Path) -> None:
    scale = q.SCALES["cpu"]
    jobs = q.plan(scale, list(scale.per_method), q.ALL_ARMS, [0, 1, 2], tmp_path)
    per_seed = len(scale.per_method) * len(q.ALL_ARMS)
    assert len(jobs) == 3 * per_seed and [j.seed for j in jobs[:per_seed]] == [0] * per_seed  # seeds outermost
    base = q.train_command(scale, jobs[0])
    for j in jobs:
        extra = set(q.train_command(scale, j)) - set(base)
        assert all(e.startswith(("+hvp", "hvp.", "seed=", "hydra.run.dir=", "method", "budget.match=")) for e in extra)
    hard = next(j for j in jobs if j.arm == "hard" and j.method == "simclr")
    rand = next(j for j in jobs if j.arm == "random" and j.method == "simclr")
    assert set(q.train_command(scale, hard)) ^ set(q.train_command(scale, rand)) == {
        "hvp.mode=hard",
        "hvp.mode=random",
        f"hydra.run.dir={hard.run_dir}",
        f"hydra.run.dir={rand.run_dir}",
    }
    cheap = next(j for j in jobs if j.arm == "scale50_fraction50" and j.method == "simclr")
    assert set(q.train_command(scale, cheap)) - set(q.train_command(scale, hard)) == {
        "hvp.selection_scale=0.5",
        "hvp.selection_fraction=0.5",
        f"hydra.run.dir={cheap.run_dir}",
    }
    assert set(q.DEFAULT_ARMS) == {"baseline", "hard", "scale50", "fraction25", "scale50_fraction50", "min_iou"} | {
        f"baseline@{a}" for a in ("hard", "scale50", "fraction25", "scale50_fraction50")
    }  # every cheaper selection, and each one that costs FLOPs at equal FLOPs too


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
    knn = text.split("k-NN, equal images")[1]
    row = next(line for line in knn.splitlines() if line.startswith("| simclr | hard |"))
    assert "33.00 ± 1.00" in row and "+2.00 (2.00, 2.00)" in row  # identical paired diffs: zero-width CI
    assert "checked: saved configs agree" in text
    assert "simclr hard: at or above baseline at 1/2 epochs (2); at epoch 2: +2.00 pp" in text
    assert (tmp_path / "knn_flops.png").stat().st_size > 10_000
    numbers = json.loads((tmp_path / "quality.json").read_text())
    assert numbers["linear"]["simclr/hard"]["mean"] == pytest.approx(0.41)
    # a key other than hvp/seed that differs between arms is reported, not hidden
    (jobs[1].run_dir / "config.yaml").write_text(yaml.safe_dump(dict(cfg, method={"name": "simclr", "lr": 9})))
    assert any("method.lr differs" in p for p in q.config_differences(jobs))


def test_methods_whose_baseline_does_not_learn_are_left_out(tmp_path: Path) -> None:
    """A method whose baseline ends at or below its random-init k-NN has nothing to compare: the
    report names it and why, and has no table row for it (the CPU scale's SimSiam)."""
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


@pytest.mark.parametrize("scale_name", sorted(q.SCALES))
@pytest.mark.slow  # every run of a scale composed and validated: seconds a scale
def test_every_run_config_composes_and_validates(scale_name: str, tmp_path: Path) -> None:
    """A typo in a scale's overrides would only show after hours of other runs: compose them all.
    ``baseline@<arm>`` is the baseline with ``budget.match`` at <arm>'s run of its seed."""
    from hvp_lightning.config import validate

    from .conftest import SHARED_CIFAR, make_cfg

    scale = q.SCALES[scale_name]
    others = [m for m in scale.per_method if m != "simclr"]  # every arm once, every method with and without HVP
    jobs = q.plan(scale, ["simclr"], [*q.ALL_ARMS, "baseline_x2"], [0], tmp_path) + q.plan(
        scale, others, ["baseline", "hard"], [0], tmp_path
    )
    for job in jobs:
        overrides = [o for o in q.train_command(scale, job)[2:] if not o.startswith("hydra.")]
        cfg = make_cfg(*overrides, tiny=False)
        assert cfg.method.name == job.method and q.baseline_family(job.arm) == (cfg.get("hvp") is None)
        assert cfg.trainer.max_epochs == (2 * scale.epochs if job.arm == "baseline_x2" else scale.epochs)
        assert cfg.budget.match == (str(job.matched_dir) if q.matched(job.arm) else None)
        if SHARED_CIFAR.is_dir():  # validation also checks the data root and the matched run
            cfg.data.root = str(SHARED_CIFAR)
            if job.matched_dir is not None:
                job.matched_dir.mkdir(parents=True, exist_ok=True)
                (job.matched_dir / "summary.json").write_text(json.dumps({"cost": {"total_flops": 1e12}}))
            validate(cfg)


def test_equal_flops_arms_add_only_the_budget_and_wait_for_their_run(tmp_path: Path) -> None:
    """``baseline@<arm>``'s command is the baseline's plus ``budget.match`` at <arm>'s run of the same
    seed, planned after every arm of keys of its seed; the config check allows it the budget keys
    (and the epochs they set), nothing else."""
    scale = q.SCALES["cpu"]
    jobs = q.plan(scale, ["simclr"], ["baseline@hard", "baseline", "hard"], [0, 1], tmp_path)
    assert [j.arm for j in jobs] == ["baseline", "hard", "baseline@hard"] * 2
    base, hard, at = jobs[:3]
    extra = set(q.train_command(scale, at)) - set(q.train_command(scale, base))
    assert extra == {f"budget.match={hard.run_dir}", f"hydra.run.dir={at.run_dir}"}
    assert at.matched_dir == hard.run_dir and base.matched_dir is None
    cfg = {"method": {"name": "simclr"}, "trainer": {"max_epochs": 12}, "budget": {"match": None}, "seed": 0}
    for j in jobs[:3]:
        run_cfg = dict(cfg, hvp={"mode": "hard"} if j.arm == "hard" else None)
        if j is at:
            run_cfg.update(trainer={"max_epochs": 20}, budget={"match": str(hard.run_dir)})
        _fake_run(j, [0.2, 0.3], None, run_cfg)
    assert q.config_differences(jobs) == []
    (hard.run_dir / "config.yaml").write_text(yaml.safe_dump(dict(cfg, trainer={"max_epochs": 13})))
    assert q.config_differences(jobs) == [
        "simclr: trainer.max_epochs differs (simclr/baseline/seed0: 12, simclr/hard/seed0: 13)"
    ]


def _finish(job, epochs: int, ratio: float) -> None:
    _fake_run(job, [0.2] * (epochs + 1), 0.3, {"seed": job.seed}, ratio)


def test_next_job_waits_for_the_matched_run_and_links_a_run_of_the_same_epochs(tmp_path: Path) -> None:
    """A ``baseline@`` job starts once its matched run has finished; its epochs are the budget's
    (the closest whole epochs, as train.py counts them); a finished baseline run of its seed with
    those epochs is the same training, so the job becomes a link to it; while a running job trains
    those epochs it waits."""
    scale = q.SCALES["cpu"]  # 12 epochs
    arms = ["baseline", "scale50", "fraction25", "baseline@scale50", "baseline@fraction25"]
    queue = q.plan(scale, ["simclr"], arms, [0], tmp_path)
    base, scale50, fraction25, at_scale, at_fraction = queue
    picked, _ = q.next_job(scale, queue, set(), linear=True)
    assert picked is base and q.next_job(scale, queue, {("simclr", 0, 12)}, True)[0] is scale50
    assert q.next_job(scale, queue, set(), True)[0] is fraction25
    assert q.next_job(scale, queue, set(), True) is None  # both baseline@ jobs wait for their runs
    _finish(base, 12, 1.0)
    _finish(scale50, 12, 1.172)  # 14.06 baseline epochs
    _finish(fraction25, 12, 1.1666)  # 13.9992: 14
    assert q.budget_epochs(scale50.run_dir) == q.budget_epochs(fraction25.run_dir) == 14
    picked, slot = q.next_job(scale, queue, set(), True)
    assert picked is at_scale and slot == ("simclr", 0, 14)
    assert q.next_job(scale, queue, {slot}, True) is None  # the same training is running
    _finish(at_scale, 14, 1.0)
    assert q.next_job(scale, queue, set(), True) is None and queue == []  # linked, nothing left to run
    assert at_fraction.run_dir.is_symlink() and at_fraction.run_dir.resolve() == at_scale.run_dir.resolve()
    assert q._done(at_fraction, linear=True)


def test_budget_epochs_match_the_library(tmp_path: Path) -> None:
    """The epochs a link stands for are those train.py's budget sets (training/budget.py), tie included."""
    from hvp_lightning.run.perf import StepFlops
    from hvp_lightning.training.budget import closest_count, epoch_of, run_flops

    job = q.Job("simclr", "hard", 0, tmp_path / "hard")
    epoch = epoch_of(EPOCH_IMAGES, 100, 1)
    flops = StepFlops(train=BASE_FPI, selection=0, baseline=BASE_FPI)
    for ratio in (1.0, 1.05, 1.25, 1.5, 1.6667, 2.0):
        shutil.rmtree(job.run_dir, ignore_errors=True)
        _finish(job, 12, ratio)
        expected = closest_count(BASE_FPI * ratio * 12 * EPOCH_IMAGES, lambda e: run_flops(e, flops, epoch))
        assert q.budget_epochs(job.run_dir) == expected


ARMS5 = ["baseline", "hard", "scale50", "min_iou", "baseline@hard", "baseline@scale50"]


def _equal_flops_runs(tmp_path: Path, gain: float) -> list:
    """Fake runs over 3 seeds: ``hard`` (1.667x FLOPs per image) and ``scale50`` (1.17x), their
    baselines at equal FLOPs, and ``min_iou`` (no selection FLOPs). ``scale50`` minus its
    equal-FLOPs baseline is ``gain`` + 0.005 * (seed - 1)."""
    jobs = q.plan(q.SCALES["cpu"], ["simclr"], ARMS5, [0, 1, 2], tmp_path)
    for j in jobs:
        knn = {
            "baseline": 0.30,
            "hard": 0.34,
            "scale50": 0.31 + gain + 0.005 * (j.seed - 1),
            "min_iou": 0.295,
            "baseline@hard": 0.33,
            "baseline@scale50": 0.31,
        }[j.arm] + 0.002 * j.seed
        ratio = {"hard": 1.667, "scale50": 1.17}.get(j.arm, 1.0)
        epochs = {"baseline@hard": 20, "baseline@scale50": 14}.get(j.arm, 12)
        run_cfg = {"seed": j.seed, "hvp": None if q.baseline_family(j.arm) else {"mode": j.arm}}
        _fake_run(j, [0.2] * epochs + [knn], knn + 0.05, run_cfg, ratio, 0.0 if j.arm == "min_iou" else None)
    return jobs


def test_report_pairs_each_arm_with_the_baseline_at_its_flops(tmp_path: Path) -> None:
    """The cost table gives each arm's FLOPs per image against the baseline's (and which are within
    1.2x); the equal-FLOPs table pairs each arm with ``baseline@<arm>`` by seed, ``min_iou`` (no
    selection FLOPs) with the baseline itself; the verdict line follows from those numbers."""
    jobs = _equal_flops_runs(tmp_path, gain=0.02)
    text = q.report("cpu", q.SCALES["cpu"], jobs, ["simclr"], ARMS5, tmp_path, "cmd")
    cost = text.split("Model FLOPs")[1].split("k-NN, equal images")[0]
    assert "| simclr | hard | 3 | 12 | 0.0 + 0.0 | 1.667 | 2e+06 | 1.667 | no |" in cost
    assert "| simclr | scale50 | 3 | 12 | 0.0 + 0.0 | 1.170 | 1.404e+06 | 1.170 | yes |" in cost
    assert "| simclr | baseline@hard | 3 | 20 |" in cost and "| 1.667 | — |" in cost
    equal_images = text.split("k-NN, equal images")[1].split("k-NN, equal model FLOPs")[0]
    assert "| simclr | hard | 3 | 34.20 ± 0.20 | +4.00 (4.00, 4.00) |" in equal_images
    assert "baseline@" not in equal_images  # they are compared at equal FLOPs only
    flops = text.split("k-NN, equal model FLOPs")[1].split("Linear probe")[0]
    # scale50 - baseline@scale50 = 0.02 + 0.005 * (seed - 1): mean 2 pp, sd 0.5 pp, t(0.975, 2) = 4.303
    half = stats.t.ppf(0.975, 2) * 0.5 / math.sqrt(3)
    row = next(line for line in flops.splitlines() if line.startswith("| simclr | scale50 |"))
    assert f"| baseline@scale50 | 0.997 | 33.20 ± 0.70 | 31.20 ± 0.20 | +2.00 ({2 - half:.2f}, {2 + half:.2f}) |" in row
    assert row.endswith("| +1.50, +2.00, +2.50 |")
    assert "| simclr | min_iou | 1.000 | baseline | 1.000 |" in flops  # equal images are equal FLOPs
    assert "| simclr | hard | 1.667 | baseline@hard | 1.000 |" in flops  # 20 epochs for 20.004
    numbers = json.loads((tmp_path / "quality.json").read_text())
    assert numbers["knn_equal_flops"]["simclr/scale50"]["ci"] == pytest.approx([0.02 - half / 100, 0.02 + half / 100])
    assert numbers["cost"]["simclr/scale50"]["within_target"] and not numbers["cost"]["simclr/hard"]["within_target"]
    assert (
        f"**Verdict, simclr, k-NN at equal FLOPs: above the baseline (95% CI above 0) at <= 1.2x its model FLOPs "
        f"per image: scale50 (1.17x) +2.00 ({2 - half:.2f}, {2 + half:.2f}) pp" in text
    )
    assert (tmp_path / "knn_flops.png").stat().st_size > 10_000


def test_verdict_says_plainly_when_no_cheap_selection_beats_the_baseline(tmp_path: Path) -> None:
    jobs = _equal_flops_runs(tmp_path, gain=-0.021)  # scale50 - baseline@scale50: -2.6, -2.1, -1.6 pp
    text = q.report("cpu", q.SCALES["cpu"], jobs, ["simclr"], ARMS5, tmp_path, "cmd")
    half = stats.t.ppf(0.975, 2) * 0.5 / math.sqrt(3)
    verdict = next(line for line in text.splitlines() if line.startswith("**Verdict, simclr, k-NN"))
    assert verdict == (
        "**Verdict, simclr, k-NN at equal FLOPs: no selection at <= 1.2x the baseline's model FLOPs per image is "
        "above the baseline (none has its 95% CI above 0); best: min_iou (1.00x) -0.50 (-0.50, -0.50) pp. "
        "Above 1.2x: hard (1.67x) +1.00 (1.00, 1.00) pp.**"
    )
    assert f"-2.10 ({-2.1 - half:.2f}, {-2.1 + half:.2f})" in text  # scale50's row, below min_iou's
    assert any(line.startswith("**Verdict, simclr, Linear probe at equal FLOPs") for line in text.splitlines())


@pytest.mark.slow  # FLOPs counted for every arm of a scale
def test_planned_flops_are_what_a_run_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """--dry-run's FLOPs: a baseline run's total is its images times the baseline step's FLOPs per
    image; SimCLR's N=4 selection adds 4 forwards to the step's 6 (2 views, forward and backward)."""
    from hvp_lightning.training.cost import count_step_flops

    from .conftest import make_settings

    monkeypatch.setitem(q.SCALES, "tiny", TINY_SCALE)
    ratio, total = q.planned_flops(TINY_SCALE, q.Job("simclr", "baseline", 0, Path("/tmp/unused")))
    per_image = count_step_flops(make_settings(*TINY_SCALE.common, *TINY_SCALE.per_method["simclr"], tiny=False)).train
    assert ratio == 1.0 and total == 64 * per_image  # 4 batches of 16, 1 epoch
    ratio, total = q.planned_flops(TINY_SCALE, q.Job("simclr", "baseline@hard", 0, Path("/tmp/unused")))
    assert ratio == pytest.approx(5 / 3) and total == pytest.approx(64 * per_image * 5 / 3)


def test_main_plans_and_reports_from_finished_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's main in-process: --dry-run prints one train.py command per run; --report-only on
    finished runs writes the report and appends it, with the figure beside it, to --results."""
    args = ["--methods", "simclr", "--arms", "baseline", "hard", "--seeds", "0", "1", "--out", str(tmp_path)]
    planned = {"baseline": (1.0, 6e12), "hard": (5 / 3, 1e13)}  # counting is tested below; here only its sum
    monkeypatch.setattr(q, "planned_flops", lambda scale, job: planned[job.arm])
    q.main([*args, "--dry-run"])
    printed = capsys.readouterr().out.split("\n\n")
    commands = printed[0].splitlines()
    assert len(commands) == 4 and all(" train.py " in c and "method=simclr_cifar" in c for c in commands)
    assert "simclr hard: 1e+13 (1.667x the baseline step per image)" in printed[1]
    assert printed[1].endswith("all 4 runs: 3.2e+13 model FLOPs (k-NN passes and linear probes not counted)\n")
    for j in q.plan(q.SCALES["cpu"], ["simclr"], ["baseline", "hard"], [0, 1], tmp_path):
        knn = 0.30 + 0.01 * j.seed + 0.02 * (j.arm == "hard")
        _fake_run(j, [0.25, knn], knn + 0.1, {"method": {"name": "simclr"}, "seed": j.seed, "hvp": j.arm})
    results = tmp_path / "RESULTS.md"
    q.main([*args, "--report-only", "--results", str(results)])
    text = results.read_text()
    assert "Command: `uv run python benchmarks/quality.py --methods simclr" in text
    assert "| simclr | hard | 2 | 32.50 ± 0.71 | +2.00 (2.00, 2.00) |" in text
    assert text.endswith("![k-NN against model FLOPs, cpu scale](quality_cpu_knn_flops.png)\n")
    assert (tmp_path / "quality_cpu_knn_flops.png").stat().st_size > 10_000


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
)


@pytest.mark.slow  # three tiny train.py runs and their linear probes, two at a time: ~1-2 min on 2 cores
def test_a_tiny_scale_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole benchmark at a tiny scale: train.py and eval.py per run, ``baseline@hard`` after
    ``hard`` with the epochs its budget sets (1 HVP epoch at 5/3 the FLOPs: 2), then the report with
    both comparisons; a second call finds every run done and trains nothing."""
    monkeypatch.setitem(q.SCALES, "tiny", TINY_SCALE)
    monkeypatch.setattr(q, "MIN_BASELINE_GAIN", -1.0)  # one epoch: report the method whatever it learnt
    arms = ["baseline", "hard", "baseline@hard"]
    args = ["--scale", "tiny", "--arms", *arms, "--seeds", "0", "--out", str(tmp_path)]
    q.main(args)
    for arm in arms:
        run = tmp_path / "simclr" / arm / "seed0"
        assert (run / "summary.json").is_file() and (run / "eval" / "linear" / "eval_summary.json").is_file()
    at = json.loads((tmp_path / "simclr" / "baseline@hard" / "seed0" / "summary.json").read_text())
    assert at["epochs"] == 2 == q.budget_epochs(tmp_path / "simclr" / "hard" / "seed0")
    report = (tmp_path / "report.md").read_text()
    assert "Runs finished: 3/3" in report and "checked: saved configs agree" in report
    assert "| simclr | hard | 1.667 | baseline@hard |" in report and "**Verdict, simclr, k-NN" in report
    assert json.loads((tmp_path / "quality.json").read_text())["config_differences"] == []
    times = [
        json.loads(line) for line in (tmp_path / "simclr" / "hard" / "seed0" / q.TIMES_FILE).read_text().splitlines()
    ]
    assert [t["step"] for t in times] == ["pretrain", "linear"] and all(
        t["cpu_s"] > 0 and t["exit"] == 0 for t in times
    )
    assert "| all | | 3 |" in report  # the hours table: three runs trained
    log = (tmp_path / "simclr" / "hard" / "seed0" / "benchmark.log").read_text()
    q.main(args)
    assert (tmp_path / "simclr" / "hard" / "seed0" / "benchmark.log").read_text() == log  # nothing ran again


# --- out to saturation, the baseline trained longer, --data -----------------------------------------------


def test_saturation_scale_plans_the_ceiling_and_the_equal_flops_baselines(tmp_path: Path) -> None:
    """The saturation scale's default arms, at its data size (runs under ``<out>/n2000/``):
    ``baseline_x2`` is the baseline's command with twice its epochs and nothing else."""
    args = q.parse_args(["--scale", "saturation", "--out", str(tmp_path)])
    assert args.methods == ["simclr"] and args.arms == list(q.SCALES["saturation"].arms)
    out, parts = q.settings(args)
    assert out == tmp_path and [(p.size, p.out) for p in parts] == [(2000, tmp_path / "n2000")]
    scale = parts[0].scale
    e = q.SATURATION_EPOCHS
    assert scale.epochs == e and scale.train_images == 2000 and parts[0].label == f"2000 training images, {e} epochs"
    jobs = q.plan(scale, args.methods, args.arms, [0], parts[0].out)
    assert [j.arm for j in jobs] == [
        "baseline", "hard", "scale50_fraction50", "baseline_x2", "baseline@hard", "baseline@scale50_fraction50"
    ]  # fmt: skip
    base, x2 = jobs[0], jobs[3]
    assert set(q.train_command(scale, x2)) ^ set(q.train_command(scale, base)) == {
        f"trainer.max_epochs={e}",
        f"trainer.max_epochs={2 * e}",
        f"hydra.run.dir={base.run_dir}",
        f"hydra.run.dir={x2.run_dir}",
    }
    assert (
        q.longer("baseline_x2") == 2.0
        and q.longer("baseline_x1.5") == 1.5
        and q.longer_epochs("baseline_x1.5", 9) == 14
    )
    assert q.longer("baseline_x") is None and q.longer("baseline@hard") is None and q.longer("hard") is None
    assert q.baseline_family("baseline_x2") and q._slot(scale, x2) == ("simclr", 0, 2 * e)
    with pytest.raises(SystemExit):
        q.parse_args(["--arms", "baseline", "baseline_xx"])
    # another size and its epochs, and the cpu scale as it was (no sizes: <out> itself)
    _, parts = q.settings(q.parse_args(["--scale", "saturation", "--sizes", "2000", "5000:60", "--out", str(tmp_path)]))
    assert [(p.size, p.scale.epochs, p.scale.train_images, p.out.name) for p in parts] == [
        (2000, e, 2000, "n2000"), (5000, 60, 5000, "n5000")
    ]  # fmt: skip
    _, parts = q.settings(q.parse_args(["--out", str(tmp_path)]))
    assert parts == [q.Setting(None, q.SCALES["cpu"], tmp_path)]


def test_a_baseline_at_the_flops_of_twice_the_epochs_is_the_longer_baseline(tmp_path: Path) -> None:
    """``baseline@<arm>`` whose budget comes to ``baseline_x2``'s epochs links to that run."""
    scale = q.SCALES["cpu"]  # 12 epochs
    queue = q.plan(scale, ["simclr"], ["baseline", "hard", "baseline_x2", "baseline@hard"], [0], tmp_path)
    base, hard, x2, at = queue
    assert q.next_job(scale, queue, set(), True)[0] is base
    assert q.next_job(scale, queue, set(), True)[0] is hard
    assert q.next_job(scale, queue, set(), True) == (x2, ("simclr", 0, 24))
    for job, epochs, ratio in ((base, 12, 1.0), (hard, 12, 2.0), (x2, 24, 1.0)):
        _finish(job, epochs, ratio)
    assert q.next_job(scale, queue, set(), True) is None and queue == []
    assert at.run_dir.resolve() == x2.run_dir.resolve()


def _saturation_runs(tmp_path: Path, seeds=(0, 1, 2)) -> tuple[list, list[str]]:
    """Fake runs of the saturation arms at 20 epochs (k-NN every 5): the baseline climbs 4 points
    in its last quarter; ``hard`` ends 1 point above the baseline at its FLOPs and 1 below
    ``baseline_x2``; each run's times (TIMES_FILE): 600 s pretraining, 30 s probe, CPU 1.25x wall."""
    arms = list(q.SCALES["saturation"].arms)
    jobs = q.plan(q.SCALES["saturation"], ["simclr"], arms, list(seeds), tmp_path)
    end = {"baseline": 0.40, "hard": 0.44, "scale50_fraction50": 0.405, "baseline_x2": 0.45, "baseline@hard": 0.43,
           "baseline@scale50_fraction50": 0.40}  # fmt: skip
    epochs = {"baseline_x2": 40, "baseline@hard": 33, "baseline@scale50_fraction50": 22}
    ratio = {"hard": 1.667, "scale50_fraction50": 1.086}
    for j in jobs:
        n = epochs.get(j.arm, 20)
        final = end[j.arm] + 0.002 * j.seed
        knn = [0.25 + (final - 0.25) * min(1.0, e / n) ** 0.5 for e in range(n + 1)]
        knn[round(0.75 * n)] = final - 0.04  # the last quarter adds 4 points
        run_cfg = {"seed": j.seed, "hvp": None if q.baseline_family(j.arm) else {"mode": j.arm},
                   "trainer": {"max_epochs": n}}  # fmt: skip
        _fake_run(j, knn, final + 0.1, run_cfg, ratio.get(j.arm, 1.0))
        summary = json.loads((j.run_dir / "summary.json").read_text())  # k-NN every 5 epochs and at the end
        summary["knn_history"] = [h for h in summary["knn_history"] if h["epoch"] % 5 == 0 or h["epoch"] == n]
        (j.run_dir / "summary.json").write_text(json.dumps(summary))
        with (j.run_dir / q.TIMES_FILE).open("w") as fh:
            for step, wall in (("pretrain", 600.0), ("linear", 30.0)):
                fh.write(
                    json.dumps({"step": step, "wall_s": wall, "cpu_s": 1.25 * wall, "threads": 1, "exit": 0}) + "\n"
                )
    return jobs, arms


def test_report_gives_the_ceiling_the_saturation_check_and_the_cpu_hours(tmp_path: Path) -> None:
    """The baseline at each length, each arm against the best baseline of any length (paired by
    seed), whether the baseline's last quarter adds under a point, and the hours the runs took."""
    jobs, arms = _saturation_runs(tmp_path)
    text = q.report("saturation", q.SCALES["saturation"], jobs, ["simclr"], arms, tmp_path, "cmd")
    equal_images = text.split("k-NN, equal images")[1].split("k-NN, equal model FLOPs")[0]
    assert "baseline_x2" not in equal_images and "| simclr | hard | 3 | 44.20 ± 0.20 | +4.00 (4.00, 4.00) |" in text
    lengths = text.split("k-NN, the baseline at each length")[1].split("k-NN, each arm against the ceiling")[0]
    rows = [line for line in lengths.splitlines() if line.startswith("| simclr |")]
    assert [r.split(" | ")[1] for r in rows] == [
        "baseline",
        "baseline@scale50_fraction50",
        "baseline@hard",
        "baseline_x2",
    ]
    assert rows[-1].startswith("| simclr | baseline_x2 | 3 | 40 | 2.000 | 45.20 ± 0.20 | +5.00 (5.00, 5.00) |")
    assert rows[0].endswith("| — | +4.00 (4.00, 4.00) |")  # its last quarter: epoch 15 to 20
    ceiling = text.split("each arm against the ceiling")[1].split("Linear probe")[0]
    assert (
        "| simclr | hard | 1.667 | baseline_x2 | 40 | 2.000 | 44.20 ± 0.20 | 45.20 ± 0.20 | -1.00 (-1.00, -1.00) |"
        in ceiling
    )
    assert (
        "**Ceiling, simclr, k-NN: against the best baseline of any length measured (baseline_x2), no HVP arm is above "
        "it (none has its 95% CI above 0); best: hard -1.00 (-1.00, -1.00) pp.**" in text
    )
    assert "- simclr: the baseline's last quarter (epochs 15-20) adds +4.00 (4.00, 4.00) pp k-NN over 3 seed(s): " \
        "1 point or more: NOT saturated, train longer; a whole schedule 2x as long (`baseline_x2`) adds " \
        "+5.00 (5.00, 5.00) pp: training longer still pays (its interval is above 0)" in text  # fmt: skip
    # 6 arms x 3 runs x (600 + 30) s = 3.15 h of wall, 1.25x of it CPU
    assert "| simclr | hard | 3 | 0.50 | 0.03 | 0.53 | 0.66 | 10.5 |" in text
    assert "| all | | 18 | 3.00 | 0.15 | 3.15 | 3.94 | 10.5 |" in text
    numbers = json.loads((tmp_path / "quality.json").read_text())
    assert numbers["knn_ceiling"]["simclr/hard"]["ceiling"] == "baseline_x2"
    assert numbers["knn_lengths"]["simclr/baseline"]["last_quarter"] == pytest.approx(0.04)
    assert numbers["hours"]["all"]["cpu"] == pytest.approx(18 * 630 * 1.25)
    curve = q.band_curve(q.load_results(jobs)[("simclr", "baseline@hard")])
    assert len(curve) == 8 and curve[-1][1:] == pytest.approx((0.432, 0.43, 0.434))  # epochs 0-30 by 5, and the end


def _image_folder(root: Path, per_class: int = 6) -> Path:
    """An ImageNet-layout folder of tiny PNGs: train/ and val/, two classes."""
    from PIL import Image

    for split, n in (("train", per_class), ("val", 2)):
        for c, colour in (("cats", (200, 40, 40)), ("dogs", (40, 40, 200))):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (12, 12), tuple(v + 5 * i for v in colour)).save(root / split / c / f"{i}.png")
    return root


def test_data_runs_the_regime_on_your_own_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``--data DIR``: every run on that folder with its own normalisation and views (no CIFAR-10
    keys), --sizes and --set in place of the scale's; the model FLOPs are counted on it (dry run);
    on finished runs the report has a panel per data size and the CPU-hours."""
    data = _image_folder(tmp_path / "pets")
    args = ["--scale", "saturation", "--data", str(data), "--sizes", "8:4", "--set", "method.batch_size=4",
            "data.test_subset=null", "--seeds", "0", "1", "--out", str(tmp_path / "out")]  # fmt: skip
    q.main([*args, "--arms", "baseline", "hard", "--dry-run"])  # two arms: each composes and counts once
    printed = capsys.readouterr().out.split("\n\n")
    commands = printed[0].splitlines()
    assert len(commands) == 4 and all(f"data.root={data}" in c and "data/aug=cifar" not in c for c in commands)
    assert all("data.train_subset=8 " in c and "method.batch_size=4 " in c and "data.mean" not in c for c in commands)
    assert all("trainer.max_epochs=4 " in c for c in commands)
    assert "all 4 runs:" in printed[1] and "simclr hard:" in printed[1]  # counted on the folder's images
    _, (part,) = q.settings(q.parse_args(args))
    x2 = q.train_command(part.scale, q.Job("simclr", "baseline_x2", 0, tmp_path / "x2"))
    assert "trainer.max_epochs=8" in x2 and f"data.root={data}" in x2
    assert (
        q.settings(q.parse_args(["--scale", "saturation", "--data", str(data)]))[0]
        == q.REPO / "runs" / "quality-saturation-pets"
    )
    _saturation_runs(tmp_path / "out" / "n8", seeds=(0, 1))
    q.main([*args, "--report-only"])
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.startswith("## Quality benchmark, saturation scale, 1 data size(s)")
    assert "| 8 training images, 4 epochs | 12 | 2.10 | 2.10 | 2.62 |" in report
    assert (
        "### Quality benchmark, saturation scale, 8 training images, 4 epochs (" in report
        and "Ceiling, simclr, k-NN" in report
    )
    assert (tmp_path / "out" / "knn_flops.png").stat().st_size > 10_000  # the panel per size
    assert (tmp_path / "out" / "n8" / "report.md").is_file() and (tmp_path / "out" / "n8" / "knn_flops.png").is_file()
    with pytest.raises(SystemExit, match="not a folder"):
        q.main(["--scale", "saturation", "--data", str(tmp_path / "nowhere"), "--dry-run"])
