"""A compute budget instead of epochs (hvp_lightning/training/budget.py; its rules: schema/run.py, config.py):
the FLOPs of a run's steps against Lightning's loop counted micro-batch by micro-batch, the epochs
closest to a budget, what a budget sets and says, its rules' one-line messages; the sweep
table's cost columns and its plot of quality against FLOPs (cluster/sweep.py). Whole runs (slow):
a budget run trains the FLOPs it planned and resumes to the same run; a sweep at equal compute and
``budget.match`` from the command line."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys

import pytest
import torch

from hvp_lightning.cluster.sweep import FILENAME, Job, flops_series, job_groups, main, plot_flops, sweep_csv
from hvp_lightning.config import check_options
from hvp_lightning.errors import ConfigError
from hvp_lightning.run.perf import StepFlops
from hvp_lightning.training import budget as budget_module
from hvp_lightning.training.budget import Epoch, apply_budget, closest_count, epoch_of, run_flops
from hvp_lightning.training.cost import count_step_flops

from .conftest import (
    REPO,
    SUBPROCESS_TIMEOUT_S,
    assert_same_reported_run,
    make_cfg,
    make_settings,
    write_tiny_experiment,
)
from .test_device_guard import VIT

# DINO-like: an HVP step's training step costs less than the baseline's (the selection's teacher
# outputs are reused), so a budget must not price every step alike.
FLOPS = StepFlops(train=4, selection=9, baseline=5)


def lightning_loop_flops(
    epochs: int, flops: StepFlops, images: int, batch: int, processes: int, accumulate: int, every: int, limit=1.0
) -> int:
    """The FLOPs of ``epochs`` epochs as Lightning runs them and PerfMonitor counts them: micro-batch
    by micro-batch (each process's share in full batches, cut by limit_train_batches), an optimiser
    step after every ``accumulate`` batches and at an epoch's end, HVP selecting on the steps
    where global_step % every == 0."""
    batches = images // processes // batch
    batches = min(batches, limit) if isinstance(limit, int) else int(batches * limit)
    total, step = 0, 0
    for _ in range(epochs):
        for b in range(batches):
            n = batch * processes
            total += flops.total(n, n if step % every == 0 else 0)
            if (b + 1) % accumulate == 0 or b == batches - 1:
                step += 1
    return total


@pytest.mark.parametrize(
    "images, batch, processes, accumulate, every, limit",
    [
        (64, 16, 1, 1, 1, 1.0),
        (64, 16, 1, 3, 2, 1.0),
        (100, 8, 2, 2, 3, 1.0),
        (200, 4, 1, 4, 5, 0.5),
        (90, 8, 1, 1, 4, 7),
    ],
)
def test_run_flops_is_lightnings_loop_counted_micro_batch_by_micro_batch(
    images, batch, processes, accumulate, every, limit
) -> None:
    epoch = epoch_of(images, batch, processes, accumulate, limit)
    for epochs in range(1, 13):
        expected = lightning_loop_flops(epochs, FLOPS, images, batch, processes, accumulate, every, limit)
        assert run_flops(epochs, FLOPS, epoch, every) == expected, epochs


def test_closest_count_is_the_brute_force_closest() -> None:
    """Whatever the budget, the count of epochs whose FLOPs are nearest (a tie: the fewer), within
    half of the dearest epoch's FLOPs; never fewer than one."""
    epoch = epoch_of(100, 8, 1, 2)  # 12 batches: 6 steps of 16 images; HVP every 4th step

    def cost(n: int) -> int:
        return run_flops(n, FLOPS, epoch, 4)

    dearest = max(cost(n + 1) - cost(n) for n in range(10))
    for budget in [1, 100, 500, 621.5, 622, 1000, 1234.5, 5000, 12345, 99999]:
        epochs = closest_count(budget, cost)
        assert epochs == min(range(1, 500), key=lambda n: (abs(cost(n) - budget), n)), budget
        assert epochs == 1 or abs(cost(epochs) - budget) <= dearest / 2


def test_a_budget_sets_the_epochs_and_says_so(caplog) -> None:
    """SimSiam + HVP on 64 images, batch 16: 4 steps an epoch of 16 images, each train +
    selection. 10.4 steps' FLOPs (2.6 epochs) -> 3 epochs, the preset's 1 replaced."""
    cfg = check_options(make_cfg("+hvp=on", "hvp.num_views=3", "budget.flops=1"))
    f = count_step_flops(cfg)
    step = 16 * (f.train + f.selection)
    cfg = cfg.with_values({"budget.flops": 10.4 * step})
    with caplog.at_level(logging.INFO, logger=budget_module.__name__):
        plan = apply_budget(cfg, f, 64)
    assert plan is not None and (plan.epochs, plan.steps, plan.planned_flops) == (3, 12, 12 * step)
    assert cfg.trainer.max_epochs == 1 and "max_steps" not in cfg.trainer.model_dump()  # the run takes plan.epochs
    (line,) = caplog.messages
    assert line == (
        f"budget: {10.4 * step:.4g} model FLOPs -> trainer.max_epochs=3 (12 steps, in place of trainer.max_epochs=1): "
        f"{12 * step:.4g} model FLOPs, +15.38% of the budget (whole epochs: within half of one, 16.7%)"
    )
    assert plan.summary() == {"flops": 10.4 * step, "match": None, "epochs": 3, "steps": 12, "planned_flops": 12 * step}
    assert apply_budget(check_options(make_cfg()), f, 64) is None  # no budget: the epochs decide


@pytest.mark.slow  # DINO's FLOPs counted for a budget
def test_dino_budget_with_every_n_steps_and_accumulation(tmp_path, caplog) -> None:
    """DINO + HVP selecting every 3rd optimiser step, 2 batches a step (32 images), 2 steps an
    epoch: steps 0, 3, 6, 9 cost train + selection per image, the others the baseline's (less:
    its teacher pass is the selection's). 4 epochs' FLOPs by hand -> 4 epochs; 40% of the way to
    the 5th still 4, 60% 5. The same through budget.match; a resumed run with the same budget keeps
    its stored epochs, a changed budget is counted again."""
    over = ("method=dino_cifar", *VIT, "+hvp=on", "hvp.every_n_steps=3", "trainer.accumulate_grad_batches=2")
    cfg = check_options(make_cfg(*over, "budget.flops=1"))
    f = count_step_flops(cfg)
    assert f.train < f.baseline and f.selection > 0
    four = 32 * (3 * (f.train + f.selection) + 5 * f.baseline)  # steps 0-7
    five = 32 * (4 * (f.train + f.selection) + 6 * f.baseline)  # steps 0-9
    for budget, epochs in ((four, 4), (four + 0.4 * (five - four), 4), (four + 0.6 * (five - four), 5)):
        plan = apply_budget(cfg.with_values({"budget.flops": budget}), f, 64)
        assert plan is not None and (plan.epochs, plan.steps) == (epochs, 2 * epochs), budget
    assert plan.planned_flops == five

    matched = tmp_path / "hvp_run"
    matched.mkdir()
    matched_summary = {"method": "simclr", "dataset": "synthetic", "cost": {"total_flops": four}}
    (matched / "summary.json").write_text(json.dumps(matched_summary))
    cfg = check_options(make_cfg(*over, f"budget.match={matched}"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=budget_module.__name__):
        plan = apply_budget(cfg, f, 64)
    assert plan is not None and (plan.flops, plan.match, plan.epochs) == (four, str(matched), 4)
    assert [r.getMessage() for r in caplog.records if r.name == budget_module.__name__] == [
        f"budget.match={matched} is a run of another setup (method simclr there, dino here): this run trains for its "
        "FLOPs all the same"
    ]

    # what this run's budget set when it started (on other data, say)
    stored = cfg.with_values({"trainer.max_epochs": 3})
    shutil.rmtree(matched)  # gone meanwhile: not needed to keep the stored epochs
    plan = apply_budget(check_options(make_cfg(*over, f"budget.match={matched}", f"resume={tmp_path}")), f, 64, stored)
    assert plan is not None and (plan.epochs, plan.kept, plan.flops) == (3, True, None)
    plan = apply_budget(check_options(make_cfg(*over, f"budget.flops={five}")), f, 64, stored)
    assert plan is not None and (plan.epochs, plan.kept) == (5, False)


def test_budget_rules_refuse_in_one_line(tmp_path) -> None:
    def refused(*overrides: str) -> str:
        with pytest.raises(ConfigError) as err:
            check_options(make_cfg(*overrides))
        assert "\n" not in str(err.value)
        return str(err.value)

    run_dir = tmp_path / "run"
    assert refused("budget.flops=1e12", f"budget.match={run_dir}") == (
        f"budget.match='{run_dir}' is not allowed: null when budget.flops is set (1e+12): the budget is a number "
        "of FLOPs or a run's, not both"
    )
    assert refused("budget.flops=0") == "budget.flops=0 is not allowed: a number > 0 or null"
    assert refused(f"budget.match={run_dir}").endswith("with cost.total_flops (no such folder)")
    run_dir.mkdir()
    assert refused(f"budget.match={run_dir}").endswith("(no summary.json in it: the run has not ended)")
    (run_dir / "summary.json").write_text(json.dumps({"knn_top1": 0.5, "cost": {"total_flops": None}}))
    assert "has no cost.total_flops" in refused(f"budget.match={run_dir}")
    (run_dir / "summary.json").write_text(json.dumps({"cost": {"total_flops": 123456}}))
    assert check_options(make_cfg(f"budget.match={run_dir}")).budget.match == str(run_dir)
    assert refused("budget.flops=1e12", "+trainer.max_steps=5") == (
        "trainer.max_steps=5 is not allowed: -1 (unset) with a budget: the budget sets trainer.max_epochs, and a step "
        "limit would end the run before them"
    )
    check_options(make_cfg("budget.flops=1e12", "+trainer.max_steps=-1"))

    # The IoU policy's warm-up is judged against the budget's epochs, once they are known.
    policy = ("+data/iou_policy=on", "data.iou_policy.warmup_epochs=2")
    assert "shorter than trainer.max_epochs=1" in refused(*policy)
    cfg = check_options(make_cfg(*policy, "budget.flops=640"))  # one epoch: 64 images x 10 FLOPs
    with pytest.raises(ConfigError, match=r"warmup_epochs=2 is not allowed: .*the budget's trainer.max_epochs=1\)"):
        apply_budget(cfg, StepFlops(10, 0, 10), 64)

    # Whole epochs come within half an epoch of a budget only if it holds half of one.
    said = (
        r"^budget.flops=319(\.0)? is not allowed: at least half of one epoch \(320\): "
        r"one epoch of this run is 640 model FLOPs, and a budget sets whole epochs$"
    )
    with pytest.raises(ConfigError, match=said):
        apply_budget(check_options(make_cfg("budget.flops=319")), StepFlops(10, 0, 10), 64)
    assert apply_budget(check_options(make_cfg("budget.flops=320")), StepFlops(10, 0, 10), 64).epochs == 1


# --- the sweep's table and plot ---------------------------------------------------------------------
def job(name: str, overrides: list[str], knn: float | None, flops: float | None, **extra) -> Job:
    cost = {"total_flops": flops, "selection_flops_share": 0.4 if "hvp.enabled=true" in overrides else 0.0}
    summary = {"hvp_enabled": "hvp.enabled=true" in overrides, "knn_top1": knn, "cost": cost, **extra}
    return Job(f"sweep/{name}", overrides, summary)


SWEEP = [
    job("0", ["+hvp=on", "hvp.enabled=true", "budget.flops=1e9", "seed=0"], 0.50, 0.99e9, monitor_rankme=20.0),
    job(
        "1",
        ["+hvp=on", "hvp.enabled=false", "budget.flops=1e9", "seed=0"],
        0.40,
        1.01e9,
        monitor_rankme=15.0,
        monitor_feature_std=0.02,
    ),
    job("2", ["+hvp=on", "hvp.enabled=true", "budget.flops=1e9", "seed=1"], 0.54, 0.99e9),
    job("3", ["+hvp=on", "hvp.enabled=true", "budget.flops=4e9", "seed=0"], 0.60, 4.0e9, budget={"flops": 4e9}),
    Job("sweep/4", ["+hvp=on", "hvp.enabled=false", "budget.flops=4e9", "seed=0"], None, "ConfigError: ..."),
]


def test_sweep_table_and_plot_put_quality_against_flops(tmp_path) -> None:
    """Groups by the swept keys but seeds and compute; one point per finished job (k-NN in %);
    a panel per quantity some job reports, k-NN first, the label-free monitors beside it (alone
    where no job has k-NN); nothing from summaries before cost reporting."""
    assert job_groups(SWEEP) == ["hvp.enabled=true", "hvp.enabled=false", "hvp.enabled=true", "hvp.enabled=true",
                                 "hvp.enabled=false"]  # fmt: skip
    series = flops_series(SWEEP)
    assert list(series) == ["knn_top1", "monitor_rankme", "monitor_feature_std"]
    assert {g: [p.value for p in v] for g, v in series["monitor_rankme"].items()} == {
        "hvp.enabled=true": [20.0],
        "hvp.enabled=false": [15.0],
    }
    assert {g: [p.value for p in v] for g, v in series["monitor_feature_std"].items()} == {"hvp.enabled=false": [0.02]}
    hvp, base = series["knn_top1"]["hvp.enabled=true"], series["knn_top1"]["hvp.enabled=false"]
    assert [(p.flops, p.value, p.setting) for p in hvp] == [
        (0.99e9, 50.0, ("1e9", None, None, None)),
        (0.99e9, 54.0, ("1e9", None, None, None)),
        (4.0e9, 60.0, ("4e9", None, None, None)),
    ]
    assert [(p.flops, p.value) for p in base] == [(1.01e9, 40.0)]

    rows = sweep_csv(SWEEP).splitlines()
    header = rows[0].split(",")
    row = dict(zip(header, rows[4].split(",")))
    assert (row["total_flops"], row["budget_flops"], row["selection_flops_share"]) == (
        "4000000000.0",
        "4000000000.0",
        "0.4",
    )
    assert dict(zip(header, rows[2].split(",")))["budget_flops"] == ""  # a run without a budget entry

    unlabelled = [job("0", ["seed=0"], None, 1e9, monitor_rankme=12.5, monitor_feature_std=0.05)]
    assert {k: {g: [p.value for p in v] for g, v in s.items()} for k, s in flops_series(unlabelled).items()} == {
        "monitor_rankme": {"all jobs": [12.5]},
        "monitor_feature_std": {"all jobs": [0.05]},
    }
    old = [Job("sweep/0", ["seed=0"], {"knn_top1": 0.5})]  # before cost reporting
    assert flops_series(old) == {}
    assert "cost.total_flops" in plot_flops(old, tmp_path / "none.png", "old")
    assert plot_flops(SWEEP, tmp_path / "flops.png", "sweep") is None
    width = int.from_bytes((tmp_path / "flops.png").read_bytes()[16:20], "big")  # PNG header: width in pixels
    assert width == round(3 * 5.5 * 110)  # three panels: k-NN, RankMe, feature std


def test_cli_writes_the_table_and_the_plot(tmp_path, capsys) -> None:
    from .test_sweep import fake_job

    sweep = tmp_path / "sweep"
    for i, j in enumerate(SWEEP):
        fake_job(sweep, f"{i}_x", j.overrides, j.summary)
    assert main([str(sweep), "--plot", str(tmp_path / "flops.png")]) == 0
    assert capsys.readouterr().out.split() == [str(sweep / FILENAME), str(tmp_path / "flops.png")]
    assert (tmp_path / "flops.png").stat().st_size > 0
    assert main([str(sweep), "--plot", str(tmp_path / "flops.xyz")]) == 2
    assert "--plot=" in capsys.readouterr().err
    old = tmp_path / "old"
    fake_job(old, "0_seed=0", ["seed=0"], {"knn_top1": 0.5})
    assert main([str(old), "--plot", str(tmp_path / "old.png")]) == 1  # the table is written, the plot is not
    assert (old / FILENAME).is_file() and not (tmp_path / "old.png").exists()
    assert "no plot: no finished job's summary.json has cost.total_flops" in capsys.readouterr().err


# --- whole runs ------------------------------------------------------------------------------------
BUDGET_RUN = [
    "+hvp=on",
    "hvp.num_views=3",
    "hvp.every_n_steps=2",
    "trainer.accumulate_grad_batches=3",  # 4 batches an epoch: steps of 3 and 1 batches
    "checkpoint.every_n_epochs=1",
    "eval.every_n_epochs=1",
    "+trainer.deterministic=true",
]


@pytest.mark.slow
def test_a_budget_run_trains_the_flops_it_planned_and_resumes_to_the_same_run(tmp_path, monkeypatch) -> None:
    """Just under 3 epochs' FLOPs (2 steps an epoch, the second a single batch; HVP on every other
    step): the run trains 3 epochs and its counted cost.total_flops is the plan's. Killed after
    epoch 2 (its checkpoint), the same command continues it with the stored epochs -- not counted
    again -- to the uninterrupted run's weights and report."""
    from hvp_lightning.training.driver import run

    f = count_step_flops(make_settings(*BUDGET_RUN))
    three = run_flops(3, f, Epoch(steps=2, step_images=48, last_images=16), every_n_steps=2)
    command = [*BUDGET_RUN, f"budget.flops={0.98 * three}"]
    straight = run(make_cfg(*command), tmp_path / "straight")
    assert (straight["epochs"], straight["steps"], straight["images_seen"]) == (3, 6, 3 * 64)
    assert straight["cost"]["total_flops"] == three
    assert straight["budget"] == {"flops": 0.98 * three, "match": None, "epochs": 3, "steps": 6, "planned_flops": three}

    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight", resumed)
    (resumed / "summary.json").unlink()
    shutil.copy(resumed / "checkpoints" / "epoch=002.ckpt", resumed / "checkpoints" / "last.ckpt")

    def not_again(*args, **kwargs):
        raise AssertionError("a resumed budget run counted its epochs again")

    monkeypatch.setattr(budget_module, "closest_count", not_again)
    summary = run(make_cfg(*command), resumed)
    assert summary["budget"] == straight["budget"]
    assert_same_reported_run(resumed, tmp_path / "straight")
    a, b = (
        torch.load(d / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for d in (tmp_path / "straight", resumed)
    )
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.slow
def test_a_sweep_at_equal_compute_and_the_baseline_at_a_runs_compute(tmp_path) -> None:
    """``train.py -m +hvp=on hvp.enabled=true,false budget.flops=X``: both jobs within half a step of
    X, in the table with their FLOPs, and in the plot; then ``train.py budget.match=<the HVP job's
    dir>`` (a path with '=' and ',') trains the baseline for that job's FLOPs."""
    write_tiny_experiment(tmp_path / "conf")
    tiny = ["--config-dir", str(tmp_path / "conf"), "+experiment=tiny", "logger=csv"]
    sweep, budget = tmp_path / "sweep", 5.7e9
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            *tiny,
            "+hvp=on",
            "hvp.enabled=true,false",
            f"budget.flops={budget}",
            f"hydra.sweep.dir={sweep}",
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert main([str(sweep), "--plot", str(tmp_path / "flops.png")]) == 0
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    summaries = [json.loads((d / "summary.json").read_text()) for d in jobs]
    assert [s["hvp_enabled"] for s in summaries] == [True, False]
    for s in summaries:
        epoch = s["cost"]["total_flops"] / s["epochs"]  # every epoch alike: HVP selects on each step
        assert s["budget"]["flops"] == budget and abs(s["cost"]["total_flops"] - budget) <= epoch / 2
    assert summaries[1]["epochs"] > summaries[0]["epochs"]  # the baseline's cheaper steps: more of them
    rows = (sweep / FILENAME).read_text().splitlines()
    assert "total_flops" in rows[0].split(",") and str(summaries[0]["cost"]["total_flops"]) in rows[1]

    base = tmp_path / "base"
    proc = subprocess.run(
        [sys.executable, "train.py", *tiny, f"budget.match={jobs[0]}", f"hydra.run.dir={base}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    matched = json.loads((base / "summary.json").read_text())
    assert not matched["hvp_enabled"] and matched["budget"]["match"] == str(jobs[0])
    target = summaries[0]["cost"]["total_flops"]
    epoch = matched["cost"]["total_flops"] / matched["epochs"]
    assert matched["budget"]["flops"] == target and abs(matched["cost"]["total_flops"] - target) <= epoch / 2
