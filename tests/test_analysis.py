"""Hard-view analysis: pair metrics vs hand-computed boxes, the callback's statistics on a
batch with known parameters and choice, the bounded Parquet log, and the CLI end to end."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hvp_lightning.analysis.callback import HardViewAnalysis, ViewLog, step_statistics
from hvp_lightning.analysis.gallery import replay_view
from hvp_lightning.analysis.logs import load_steps, load_table
from hvp_lightning.analysis.metrics import color_distance, crop_iou, pair_metrics, relative_center_distance
from hvp_lightning.data.augment import PARAM_NAMES, ViewAug, augment, normalize
from hvp_lightning.data.seeds import view_key
from hvp_lightning.selection import HVPConfig, pair_index

from .conftest import make_cfg


def make_params(
    boxes: list[list[tuple[float, float, float, float]]],
    jitter: list[list[tuple]] | None = None,
    src: tuple[int, int] = (40, 30),
) -> dict[str, torch.Tensor]:
    """Parameters ``[B, N]`` from boxes ``(x, y, w, h)`` and jitter ``(on, b, c, s, h)`` per view."""
    t = torch.tensor(boxes, dtype=torch.float32)  # [B, N, 4]
    b, n = t.shape[:2]
    p = {name: torch.zeros(b, n) for name in PARAM_NAMES}
    p["crop_x"], p["crop_y"], p["crop_w"], p["crop_h"] = t.unbind(-1)
    p["src_w"], p["src_h"] = torch.full((b, n), float(src[0])), torch.full((b, n), float(src[1]))
    j = torch.tensor(jitter if jitter is not None else [[(0, 1, 1, 1, 0)] * n] * b, dtype=torch.float32)
    p["jitter"], p["brightness"], p["contrast"], p["saturation"], p["hue"] = j.unbind(-1)
    p["jitter_order"] = torch.arange(4).expand(b, n, 4).clone()
    return p


# View 0 and 1 overlap in a 5x5 square; view 2 touches neither. Source 40x30: diagonal 50.
BOXES = [[(0, 0, 10, 10), (5, 5, 10, 10), (20, 0, 5, 5)]]
# View 0's jitter is off: its recorded (non-identity) factors must be ignored.
JITTER = [[(0, 1.3, 0.7, 1.2, 0.08), (1, 1.2, 0.8, 1.0, 0.05), (1, 0.6, 1.4, 1.4, -0.1)]]


def test_pair_metrics_match_hand_computed_boxes() -> None:
    p = make_params(BOXES, JITTER)
    pairs = pair_index(3)  # (0,1), (0,2), (1,2)
    torch.testing.assert_close(crop_iou(p, pairs), torch.tensor([[25 / 175, 0.0, 0.0]]))
    d = relative_center_distance(p, pairs)  # centres (5,5), (10,10), (22.5,2.5)
    torch.testing.assert_close(d, torch.tensor([[math.hypot(5, 5), math.hypot(17.5, 2.5), math.hypot(12.5, 7.5)]]) / 50)
    c = color_distance(p, pairs)
    want = [
        math.sqrt(0.2**2 + 0.2**2 + 0.05**2),
        math.sqrt(0.4**2 * 3 + 0.1**2),
        math.sqrt(0.6**2 + 0.6**2 + 0.4**2 + 0.15**2),
    ]
    torch.testing.assert_close(c, torch.tensor([want]))
    assert set(pair_metrics(p, pairs)) == {"iou", "rel_dist", "color_dist"}


def test_iou_identical_nested_and_flip_invariant() -> None:
    p = make_params([[(3, 4, 10, 12), (3, 4, 10, 12), (5, 6, 5, 6)]])
    p["flip"][0, 1] = 1.0
    iou = crop_iou(p, pair_index(3))
    torch.testing.assert_close(iou, torch.tensor([[1.0, 30 / 120, 30 / 120]]))


# Sample 1: views (0,1) far apart (IoU 0), (0,2) and (1,2) overlapping.
BOXES2 = BOXES + [[(0, 0, 10, 10), (30, 20, 10, 10), (0, 0, 10, 20)]]


def test_step_statistics_known_choice() -> None:
    p = make_params(BOXES2)
    iou = crop_iou(p, pair_index(3))  # [[1/7, 0, 0], [0, 0.5, 0]]
    torch.testing.assert_close(iou, torch.tensor([[1 / 7, 0, 0], [0, 0.5, 0]]))
    table = torch.tensor([[0.1, 0.2, 0.3], [0.9, 0.1, 0.2]])
    choice = torch.tensor([0, 0])  # sample 0: pair (0,1), not lowest; sample 1: pair (0,1), lowest (tied)
    s = step_statistics(p, table, choice)
    assert s["iou_selected"].item() == pytest.approx((1 / 7 + 0) / 2)
    assert s["iou_candidates"].item() == pytest.approx((1 / 7 + 0.5) / 6)
    assert s["lowest_iou_share"].item() == pytest.approx(0.5)
    assert s["lowest_iou_chance"].item() == pytest.approx(1 / 3)
    assert s["lowest_iou_chance_ties"].item() == pytest.approx((2 / 3 + 2 / 3) / 2)
    assert s["loss_selected"].item() == pytest.approx(0.5)
    assert s["loss_candidates"].item() == pytest.approx(1.8 / 6)
    # Baseline: no choice, the trained pair is views (0, 1) and only *_selected keys exist.
    base = step_statistics(p)
    assert set(base) == {"iou_selected", "rel_dist_selected", "color_dist_selected"}
    assert base["iou_selected"].item() == pytest.approx(1 / 14)


class FakeModule:
    """What the callback reads of a LightningModule: ``hvp``, ``last_selection``, ``log``."""

    def __init__(self, enabled: bool, num_globals: int | None = None, global_pairs: str = "cross") -> None:
        self.hvp = HVPConfig(enabled=enabled, global_pairs=global_pairs)
        self.last_selection = None
        self.logged: dict[str, float] = {}
        if num_globals is not None:
            self.num_globals = num_globals

    def log(self, key: str, value: torch.Tensor, **_: object) -> None:
        self.logged[key] = float(value)


def _drive(cb: HardViewAnalysis, module: FakeModule, batch: dict, selection: dict | None, step: int = 0) -> None:
    trainer = SimpleNamespace(global_step=step, current_epoch=0, global_rank=0)
    cb.setup(trainer, module, "fit")  # type: ignore[arg-type]
    cb.on_train_batch_start(trainer, module, batch, 0)  # type: ignore[arg-type]
    module.last_selection = selection  # what HardViewMixin.training_step leaves behind
    cb.on_train_batch_end(trainer, module, None, batch, 0)  # type: ignore[arg-type]


def test_callback_logs_stats_csv_and_parquet(tmp_path: Path) -> None:
    p = make_params(BOXES2)
    batch = {"params": p, "index": torch.tensor([7, 3])}
    table = torch.tensor([[0.1, 0.2, 0.3], [0.1, 0.9, 0.2]])
    choice = table.argmax(1)  # sample 0: pair (1,2) = lowest IoU (tied); sample 1: pair (0,2), IoU 0.5
    cb = HardViewAnalysis(tmp_path / "analysis", log_every_n_steps=1)
    module = FakeModule(enabled=True)
    _drive(cb, module, batch, {"table": table, "choice": choice})
    cb.on_train_end(SimpleNamespace(global_rank=0), module)  # type: ignore[arg-type]
    assert module.logged["analysis/iou_selected"] == pytest.approx(0.25)
    assert module.logged["analysis/lowest_iou_share"] == pytest.approx(0.5)
    assert module.logged["analysis/lowest_iou_chance"] == pytest.approx(1 / 3)
    steps = load_steps(tmp_path)
    assert steps is not None and steps["hvp"].tolist() == [True]
    assert steps["iou_selected"][0] == pytest.approx(0.25)
    pairs, views = load_table(tmp_path, "pairs"), load_table(tmp_path, "views")
    assert pairs is not None and views is not None
    assert pairs["selected"].tolist() == [False, False, True, False, True, False]
    assert pairs["loss"].tolist() == pytest.approx(table.reshape(-1).tolist())
    assert pairs["index"].tolist() == [7] * 3 + [3] * 3
    assert views["selected"].reshape(2, 3).tolist() == [[False, True, True], [True, False, True]]
    assert views["crop_x"].tolist() == [0, 5, 20, 0, 30, 0]
    assert views["jitter_order"].shape == (6, 4)


def test_callback_baseline_and_multicrop_globals(tmp_path: Path) -> None:
    # Baseline (HVP off, 2 views): the trained pair's IoU only, no candidate statistics.
    p = make_params([[(0, 0, 10, 10), (5, 5, 10, 10)]])
    base = FakeModule(enabled=False)
    _drive(HardViewAnalysis(tmp_path / "a"), base, {"params": p}, None)
    assert base.logged["analysis/iou_selected"] == pytest.approx(1 / 7)
    assert "analysis/iou_candidates" not in base.logged
    # Multi-crop (DINO-like, 3 global candidates + 2 locals): only the globals are paired.
    boxes = [BOXES[0] + [(0, 0, 2, 2), (1, 1, 2, 2)]]
    dino = FakeModule(enabled=True, num_globals=3, global_pairs="all")
    sel = {"table": torch.tensor([[0.0, 0.0, 1.0]]), "choice": torch.tensor([2])}
    _drive(HardViewAnalysis(tmp_path / "b"), dino, {"params": make_params(boxes)}, sel)
    assert dino.logged["analysis/iou_selected"] == pytest.approx(0.0)
    assert dino.logged["analysis/iou_candidates"] == pytest.approx(1 / 21)
    # hvp.global_pairs=cross: the columns are (0,1), (2,1) -- column 1 is views 2 and 1, not (0,2).
    cross = FakeModule(enabled=True, num_globals=3)
    boxes_cross = [[BOXES[0][0], BOXES[0][1], (6, 6, 8, 8), (0, 0, 2, 2)]]  # view 2 inside view 1: IoU 0.64
    sel = {"table": torch.tensor([[0.0, 1.0]]), "choice": torch.tensor([1])}
    _drive(HardViewAnalysis(tmp_path / "x"), cross, {"params": make_params(boxes_cross)}, sel)
    assert cross.logged["analysis/iou_selected"] == pytest.approx(0.64)
    assert cross.logged["analysis/iou_candidates"] == pytest.approx((1 / 7 + 0.64) / 2)
    assert cross.logged["analysis/lowest_iou_chance"] == pytest.approx(1 / 2)
    # A table that is not over the global pairs is skipped with a warning, not misread.
    odd = FakeModule(enabled=True, num_globals=3)
    with pytest.warns(UserWarning, match="not the 2 global pairs"):
        _drive(
            HardViewAnalysis(tmp_path / "c"),
            odd,
            {"params": make_params(boxes)},
            {"table": torch.zeros(1, 8), "choice": torch.tensor([5])},
        )
    assert not odd.logged


def _random_params(b: int, n: int, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    img = torch.randint(0, 255, (3, 32, 32), dtype=torch.uint8)
    plist = [augment(img, ViewAug(size=8), view_key(seed, 0, i, 0))[1] for i in range(b * n)]
    return {k: torch.stack([q[k] for q in plist]).reshape(b, n, *plist[0][k].shape) for k in plist[0]}


def test_parquet_log_bounded_and_readable(tmp_path: Path) -> None:
    b, n, steps = 32, 4, 5
    params = _random_params(b, n, 0)
    log = ViewLog(tmp_path / "analysis", rank=0, flush_every=2)
    for s in range(steps):
        log.add(10 * s, torch.arange(b), params, torch.randn(b, 6), torch.randint(6, (b,)))
    log.add(40, torch.arange(b), params, torch.randn(b, 6), torch.zeros(b, dtype=torch.long))  # resumed: step 40 again
    log.flush()
    files = sorted((tmp_path / "analysis").glob("*.parquet"))
    assert len(files) == 2 * 3  # part files after 2, 4 and the rest of the logged batches
    views, pairs = load_table(tmp_path, "views"), load_table(tmp_path, "pairs")
    assert views is not None and pairs is not None
    assert len(views["step"]) == steps * b * n and len(pairs["step"]) == steps * b * 6
    assert (pairs["selected"][pairs["step"] == 40].reshape(b, 6)[:, 0]).all()  # the newest step-40 rows won
    per_image = sum(f.stat().st_size for f in files) / ((steps + 1) * b)
    assert per_image < 1200, f"{per_image:.0f} bytes per image per logged step"  # ~330 B at B=256 (docs/analysis.md)


def test_replay_matches_augment() -> None:
    torch.manual_seed(3)
    img = torch.randint(0, 255, (3, 40, 36), dtype=torch.uint8)
    aug = ViewAug(size=16, jitter_p=1.0, gray_p=0.5, blur_p=1.0, solarize_p=0.5, mean=(0.5,) * 3, std=(0.25,) * 3)
    for a in (aug, dataclasses.replace(aug, blur_kind="pil", interpolation="bicubic")):
        for i in range(6):
            out, p = augment(img, a, view_key(3, 0, i, 0))
            row = {k: (v.numpy() if k == "jitter_order" else v.item()) for k, v in p.items()}
            torch.testing.assert_close(normalize(replay_view(img, row, a), a.mean, a.std), out)


@pytest.mark.slow  # a permutation-importance fit
def test_importance_recovers_a_planted_dependence() -> None:
    from hvp_lightning.analysis.callback import PAIR_FEATURES
    from hvp_lightning.analysis.importance import importance

    rng = np.random.default_rng(0)
    n = 400 * 6  # 400 images x 6 candidate pairs
    pairs = {f: rng.random(n) for f in PAIR_FEATURES}
    # Loss = -IoU + 0.5 |d brightness| + noise: main-effect shares ~ 0.8 and 0.2 of the explained variance.
    pairs["loss"] = -pairs["iou"] + 0.5 * pairs["brightness_diff"] + rng.normal(0, 0.1, n)
    pairs.update(
        hvp=np.ones(n, bool),
        rank=np.zeros(n, np.int16),
        step=np.repeat(np.arange(400) // 50, 6),
        sample=np.repeat(np.arange(400) % 50, 6),
    )
    imp = importance(pairs, trees=20)
    main = imp["main_effect"]
    assert imp["r2_test"] > 0.5
    assert main["iou"] > 0.5 and 0.05 < main["brightness_diff"] < main["iou"]
    assert all(main[f] < 0.05 for f in PAIR_FEATURES if f not in ("iou", "brightness_diff"))
    assert max(imp["permutation"], key=imp["permutation"].get) == "iou"


def test_importance_holds_out_whole_images() -> None:
    """The candidate pairs of one image at a step share views and their centred losses sum to
    zero: held-out R^2 is honest only if no image has pairs on both sides."""
    from hvp_lightning.analysis.importance import split_by_group

    group = np.repeat(np.arange(200), 6)[np.random.default_rng(0).permutation(1200)]
    train, test = split_by_group(group, test_size=0.25, seed=0)
    assert not set(group[train]) & set(group[test])
    assert sorted([*train, *test]) == list(range(1200))
    assert 0.2 < len(test) / 1200 < 0.3


def test_analysis_config_validated() -> None:
    from hvp_lightning.config import ConfigError, validate

    with pytest.raises(ConfigError, match="analysis.log_every_n_steps"):
        validate(make_cfg("analysis.log_every_n_steps=0"))


@pytest.mark.slow  # two runs, then hvp-analysis
def test_cli_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hvp_lightning.analysis.__main__ import main
    from hvp_lightning.training.driver import run

    common = ("analysis.log_every_n_steps=1", "analysis.flush_every_n_logs=3", "eval.every_n_epochs=1")
    run(make_cfg("+hvp=on", *common), tmp_path / "hvp")
    run(make_cfg(*common), tmp_path / "base")
    assert main([str(tmp_path / "hvp"), str(tmp_path / "base"), "--trees", "8", "--gallery", "3"]) == 0
    out = tmp_path / "hvp" / "analysis"
    result = json.loads((out / "analysis.json").read_text())
    for key in (
        "lowest_iou_share",
        "lowest_iou_chance",
        "selected_iou_mean",
        "candidate_iou_mean",
        "baseline_iou_mean",
        "importance",
        "figures",
    ):
        assert key in result, key
    assert result["lowest_iou_chance"] == pytest.approx(1 / 6, rel=1e-4)
    assert result["hvp_steps"] == 4 and result["logged_steps"] == 4
    assert set(result["importance"]["main_effect"]) >= {"iou", "rel_dist", "color_dist", "brightness_diff"}
    for name in ("iou_over_training", "lowest_iou_share", "iou_hist", "importance", "gallery"):
        png = out / f"{name}.png"
        assert png.stat().st_size > 5000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert "lowest_iou_share" in capsys.readouterr().out
    # the logger got the online statistics too
    header = (tmp_path / "hvp" / "csv" / "metrics.csv").read_text().splitlines()[0]
    assert "analysis/lowest_iou_share_epoch" in header
    assert np.isfinite(result["selected_iou_mean"])


def test_cli_missing_run_dir_says_so_and_makes_nothing(tmp_path: Path) -> None:
    """A typo'd run dir: one line naming it, and no ``<typo>/analysis/`` folder left behind."""
    from hvp_lightning.analysis.__main__ import main

    missing = tmp_path / "no_such_run"
    with pytest.raises(SystemExit, match="no such run dir"):
        main([str(missing)])
    assert not missing.exists()
    empty = tmp_path / "empty_run"  # a folder without the analysis logs: nothing written into it either
    empty.mkdir()
    with pytest.raises(SystemExit, match="steps-r"):
        main([str(empty)])
    assert list(empty.iterdir()) == []
    # a typo'd baseline (or --compare run) used to be a warnings.warn line and a path in analysis.json
    for argv in ([str(empty), str(missing)], [str(empty), "--compare", str(missing)]):
        with pytest.raises(SystemExit, match=f"{missing}: no such run dir"):
            main(argv)
        assert list(empty.iterdir()) == []


def test_view_log_lowest_iou_share_matches_a_brute_force_count(tmp_path: Path) -> None:
    """The report's lowest-IoU share from a tiny Parquet view log (two steps, the second with a
    tie at IoU 0) against counting by hand: a sample is a hit when no candidate pair's IoU is
    below its selected pair's."""
    from hvp_lightning.analysis.report import view_log_lowest_share

    g = torch.Generator().manual_seed(3)
    log, hits, total = ViewLog(tmp_path / "analysis", flush_every=1), 0, 0
    for step in (0, 1):
        xy = torch.randint(0, 20, (6, 4, 2), generator=g).float()
        wh = torch.randint(4, 12, (6, 4, 2), generator=g).float()
        boxes = torch.cat([xy, wh], -1)
        if step == 1:  # views 0 and 3 of sample 0 far apart: IoU 0 ties with any other disjoint pair
            boxes[0, 0], boxes[0, 3] = torch.tensor([0.0, 0, 4, 4]), torch.tensor([30.0, 20, 4, 4])
        params = make_params(boxes.tolist())
        choice = torch.randint(0, 6, (6,), generator=g)
        log.add(step, torch.arange(6), params, torch.zeros(6, 6), choice)
        for s in range(6):
            ious = []
            for a, b in pair_index(4).tolist():
                (xa, ya, wa, ha), (xb, yb, wb, hb) = boxes[s, a].tolist(), boxes[s, b].tolist()
                inter = max(0, min(xa + wa, xb + wb) - max(xa, xb)) * max(0, min(ya + ha, yb + hb) - max(ya, yb))
                ious.append(inter / (wa * ha + wb * hb - inter))
            hits += ious[int(choice[s])] <= min(ious)
            total += 1
    log.flush()
    assert 0 < hits < total  # the count can go either way
    assert view_log_lowest_share(load_table(tmp_path, "pairs")) == pytest.approx(hits / total)


@pytest.mark.slow  # two runs, then hvp-analysis
def test_report_compares_static_and_per_view_colour_runs(tmp_path: Path) -> None:
    """``--compare``: both runs' lowest-IoU share per epoch in one figure, labelled by hvp.colour."""
    from hvp_lightning.analysis.__main__ import main
    from hvp_lightning.analysis.report import summary_stats, view_log_lowest_share
    from hvp_lightning.training.driver import run

    common = ("+hvp=on", "analysis.log_every_n_steps=2", "eval.every_n_epochs=1")
    run(make_cfg(*common), tmp_path / "per_view")
    run(make_cfg(*common, "hvp.colour=static"), tmp_path / "static")
    argv = [str(tmp_path / "per_view"), "--compare", str(tmp_path / "static"), "--trees", "4", "--gallery", "0"]
    assert main(argv) == 0
    out = tmp_path / "per_view" / "analysis"
    result = json.loads((out / "analysis.json").read_text())
    assert result["label"] == "per_view: per-view colour"
    (other,) = result["compare"]
    assert other["label"] == "static: static colour"
    static_steps = load_steps(tmp_path / "static")
    assert other["lowest_iou_share"] == pytest.approx(summary_stats(static_steps)["lowest_iou_share"])
    assert other["view_log_lowest_iou_share"] == pytest.approx(
        view_log_lowest_share(load_table(tmp_path / "static", "pairs"))
    )
    png = out / "lowest_iou_share_compare.png"
    assert png.stat().st_size > 5000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
