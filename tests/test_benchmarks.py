"""benchmarks/ as a suite: every maintained script runs (smoke tests at the tiniest size, in-process
where that takes a second or two, else in the slow tier), the GPU session's stages name scripts and
options that exist, benchmarks/README.md lists exactly the scripts there with commands their parsers
take, and each figure the README and RESULTS.md's table of current figures give is in the dated
section they link to, which gives its command.

The device machine is lent for minutes a session: a benchmark that ignores its time limit, or fails at
the end after its rounds ran, or a stage whose command line its script rejects, costs the whole stage.
The first two happened on the first GPU run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

from . import test_quality
from .conftest import REPO, make_cfg
from .test_device_guard import VIT
from .test_docs import FENCE, slug

BENCH = REPO / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh"))
MAX_SCRIPTS = 8  # a suite a maintainer keeps working, not a lab notebook


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def process_state() -> Iterator[None]:
    """A script run in-process sets what a script's own process may: torch's thread count (one
    thread for CPU time per item), SIGTERM ending the process at once. The rest of the suite keeps its own."""
    threads, handler = torch.get_num_threads(), signal.getsignal(signal.SIGTERM)
    yield
    torch.set_num_threads(threads)
    signal.signal(signal.SIGTERM, handler)


# --- smoke tests: each maintained script at the tiniest size -------------------------------------

TINY_LOADER = ["--data", "synthetic", "--images", "16", "--image-size", "16", "--crop", "16", "--views", "3"]
TINY_LOADER += ["--batch-size", "4", "--batches", "1", "--warmup", "1", "--rounds", "1", "--workers", "0"]


def test_loader_times_every_arm_and_appends_its_report(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "results.md"
    load_script("loader").main([*TINY_LOADER, "--method", "simsiam_cifar", "--out", str(out)])
    text = out.read_text()
    for arm in ("pipeline", "workers", "colour_in_main"):
        assert float(_row(text, arm)[0]) > 0
    assert "loader.py --data synthetic" in text
    assert re.search(r"^images/s: \d", capsys.readouterr().out, re.MULTILINE)


@pytest.mark.parametrize(
    "argv",
    [
        ["--method", "simclr", "--backbone", "resnet18_narrow", "--width", "4", "--batch-size", "4", "--crop", "16"]
        + ["--variant", "scale50:hvp.selection_scale=0.5", "min_iou:hvp.mode=min_iou"],
        ["--method", "vicreg", "--backbone", "resnet18_narrow", "--width", "4", "--batch-size", "4", "--crop", "16"],
        pytest.param(  # ~3-6 s: a ViT teacher and student, three models
            ["--method", "dino", "--backbone", "vit_tiny", "--crop", "16", "--local-crop", "8", "--batch-size", "2"]
            + ["--compare-reuse", "--override", *VIT[1:4], "method.out_dim=32"],
            marks=pytest.mark.slow,
        ),
    ],
    ids=["pair", "batch_loss", "multicrop"],
)
@pytest.mark.slow  # overhead.py's rounds
def test_overhead_times_both_models_and_the_bound(tmp_path: Path, argv: list[str]) -> None:
    out = tmp_path / "results.md"
    load_script("overhead").main([*argv, "--num-views", "3", "--iters", "1", "--warmup", "0", "--out", str(out)])
    text = out.read_text()
    assert "uv run python benchmarks/overhead.py " + shlex.join(argv[:2]) in text  # the command as given
    assert re.search(r"hvp/baseline step \(paired\) \| [\d.]+x", text), text
    assert "bound" in text and ("leave-one-out" in text) == ("vicreg" in argv)
    assert ("hvp_noreuse" in text) == ("--compare-reuse" in argv)
    assert float(_row(text, "baseline: images/s")[0]) > 0 and "TFLOP/s" in _row(text, "hvp: images/s")[2]
    assert float(_row(text, "hvp: step-time ratio / FLOPs ratio")[0]) > 0
    if "--variant" in argv:  # the cheaper selections in the same rounds, against the baseline and HVP
        assert re.search(r"scale50/hvp step \(paired\) \| [\d.]+x", text) and "min_iou/baseline step (paired)" in text
        # model FLOPs per image: SimCLR's N=3 candidates add 3 forwards to the step's 6 (2 views x fwd + bwd)
        ratio = {n: float(re.findall(r"; ([\d.]+)x the baseline's", _row(text, f"{n}: model FLOPs/image")[2])[0])
                 for n in ("baseline", "hvp", "scale50", "min_iou")}  # fmt: skip
        assert ratio["baseline"] == ratio["min_iou"] == 1.0 and ratio["hvp"] == 1.5 and 1.0 < ratio["scale50"] < 1.5


def test_overhead_cut_by_sigterm_reports_the_rounds_it_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU stage's ``timeout`` sends SIGTERM: the rounds end after the current one and the report
    still comes, saying how many were timed; the previous SIGTERM handler is back afterwards."""
    overhead, out, steps = load_script("overhead"), tmp_path / "results.md", []
    step = overhead.Runner.step

    def step_then_sigterm(self, batch):  # the HVP step of the first timed round gets a SIGTERM
        step(self, batch)
        steps.append(self.name)
        if len(steps) == 2:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(overhead.Runner, "step", step_then_sigterm)
    before = signal.getsignal(signal.SIGTERM)
    overhead.main(
        ["--method", "simclr", "--backbone", "resnet18_narrow", "--width", "4", "--batch-size", "4", "--crop", "16"]
        + ["--num-views", "2", "--iters", "5", "--warmup", "0", "--no-extras", "--out", str(out)]
    )
    assert steps == ["baseline", "hvp"] and signal.getsignal(signal.SIGTERM) is before
    text = out.read_text()
    assert "- rounds: 1 timed (of 5: stopped by SIGTERM)" in text and float(_row(text, "hvp: images/s")[0]) > 0


def test_overhead_reports_the_whole_rounds_before_a_loss_goes_non_finite(tmp_path: Path, monkeypatch) -> None:
    """A model whose loss goes non-finite ends the rounds at once: the unfinished round is dropped
    (the baseline had stepped in it), the whole rounds before are reported with the reason, and the
    script still fails."""
    overhead, out, steps = load_script("overhead"), tmp_path / "results.md", []
    step = overhead.Runner.step

    def diverge_in_round_two(self, batch):
        steps.append(self.name)
        if len(steps) == 6:  # HVP in the second timed round (after a warm-up round)
            raise FloatingPointError(f"{self.name}: loss nan")
        step(self, batch)

    monkeypatch.setattr(overhead.Runner, "step", diverge_in_round_two)
    with pytest.raises(SystemExit, match=r"hvp: loss nan in timed round 2"):
        overhead.main(
            ["--method", "simclr", "--backbone", "resnet18_narrow", "--width", "4", "--batch-size", "4", "--crop", "16"]
            + ["--num-views", "2", "--iters", "5", "--warmup", "1", "--no-extras", "--out", str(out)]
        )
    text = out.read_text()
    assert "- rounds: 1 timed (of 5: hvp: loss nan in timed round 2)" in text
    assert float(_row(text, "hvp/baseline step (paired)")[0].rstrip("x")) > 0  # paired on the whole round


def test_view_cost_item_times_both_arms_on_the_same_crops(tmp_path: Path) -> None:
    """`item` with this tree's batched.py as its own baseline: the views are bit-equal, and every arm
    gets a positive time per round and a reference / pipeline ratio."""
    loader = load_script("loader")
    root = loader.make_jpeg_folder(tmp_path / "jpeg", 8)
    text = load_script("view_cost").main(
        ["item", "--items", "2", "--rounds", "1", "--baseline", str(REPO / "hvp_lightning/data/batched.py")]
        + ["--root", str(root), "--method", "simsiam", "--crop", "16", "--views", "2"]
    )
    assert "bit-equal on 2 items" in text
    for arm in ("reference", "crops", "colour", "colour_baseline", "colour_hue_blur_free"):
        assert float(_row(text, arm)[0]) > 0
    assert _row(text, "reference / (crops + colour)")[0].endswith("x")


def test_view_cost_blur_times_every_path() -> None:
    text = load_script("view_cost").main(["blur", "--size", "16", "--sigmas", "1.5", "--calls", "1"])
    cells = _row(text, "1.5")
    assert cells[0] == "1" and len(cells) == 8  # box radius 1, seven paths
    assert all(c == "n/a" or float(c) > 0 for c in cells[1:])
    assert "hue: batched.hue (torch ops)" in text


def test_view_cost_batch_times_every_kind(tmp_path: Path) -> None:
    """`batch` (the GPU session's ``blur`` stage) on the CPU: a row per blur kind and shape, the step,
    the blur alone and a ``--baseline`` batched.py's step timed, the section appended to ``--out``."""
    out = tmp_path / "results.md"
    load_script("view_cost").main(
        ["batch", "--device", "cpu", "--shapes", "4x16", "--rounds", "1", "--calls", "1", "--out", str(out)]
        + ["--baseline", str(REPO / "hvp_lightning/data/batched.py")]
    )
    rows = [line.strip("| ").split(" | ") for line in out.read_text().splitlines() if line.startswith("| 4x16 |")]
    assert [row[1] for row in rows] == ["pil", "torchvision9", "simclr"]
    assert all(float(row[2]) > 0 and float(row[3]) > 0 and float(row[5]) > 0 for row in rows)
    assert all(re.fullmatch(r"[\d.]+x", row[6]) for row in rows)


def test_loader_report_names_the_ratios_of_the_arms_it_ran() -> None:
    """A loader run without --shards has a ``pipeline`` but no ``shards`` arm: the report gives
    the rates and only the ratios whose both arms ran (it raised KeyError after all rounds)."""
    loader = load_script("loader")
    args = loader.parse_args(["--device", "cpu", "--reference"])
    res = {"pipeline": [10.0, 30.0], "workers": [20.0, 40.0], "reference": [5.0, 10.0]}
    text = loader.report(args, res, torch.device("cpu"), ["--reference"])
    assert "| pipeline | 20.0 | 10.0 | 30.0 | 2 |" in text
    assert "| pipeline / reference (per round) | 2.50x | 2.00x | 3.00x | 2 |" in text
    assert "shards" not in text and "step" not in text


@pytest.mark.slow
def test_sigterm_ends_the_step_benchmark() -> None:
    """``timeout`` sends SIGTERM: the benchmark ends at once with 128 + 15, instead of Lightning
    stopping the round in progress and the next round starting."""
    cmd = [
        sys.executable,
        "benchmarks/loader.py",
        *("--data", "synthetic", "--image-size", "32", "--images", "64", "--crop", "16", "--views", "2"),
        *("--batch-size", "8", "--batches", "2", "--warmup", "1", "--rounds", "1000", "--workers", "0"),
        *("--step", "--method", "simsiam"),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:  # rounds are running
            if line.startswith("round 1 "):
                break
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert time.monotonic() - start < 10
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


TINY_DINO = [
    "--method",
    "dino_cifar",
    "--data",
    "synthetic",
    "--images",
    "64",
    "--crop",
    "16",
    "--views",
    "3",
    "--batch-size",
    "8",
    "--workers",
    "0",
    "--warmup",
    "1",
    "--batches",
    "2",
    "--device",
    "cpu",
    "--top",
    "5",
    "--backbone",
    "vit_tiny",
    "--override",
    *VIT[1:],  # the tiny ViT of the device guard; the backbone itself is named above
]


def _row(text: str, name: str) -> list[str]:
    """The cells after the first of the markdown table row that starts with ``name``."""
    match = re.search(rf"^\| {re.escape(name)} \|(.*)\|$", text, re.MULTILINE)
    assert match, f"no row {name!r} in the report"
    return [c.strip() for c in match.group(1).split("|")]


@pytest.mark.slow  # five tiny fits: ~20 s on 2 cores
def test_step_profile_reports_rates_split_ranges_and_ops(tmp_path: Path) -> None:
    """step_profile.py (the GPU session's ``profile`` stage) on the CPU at a tiny size: every arm's
    rate, the split between the hooks, the package's profiler ranges once per step, the op tables."""
    sp = load_script("step_profile")
    out = tmp_path / "profile.md"
    text = sp.main([*TINY_DINO, "--out", str(out)])
    assert out.read_text().endswith(text)
    for arm in ("hvp", "hvp_fixed_batch", "no_hvp", "no_hvp_fixed_batch"):
        steps, to_return = (float(x) for x in _row(text, arm))
        assert steps > 0 and to_return > 0
    for segment in ("batch_start", "before_backward", "before_optimizer_step", "batch_end"):
        assert float(_row(text, sp.SEGMENTS[segment])[0]) > 0
        assert _row(text, sp.SEGMENTS[segment])[1] == "n/a"  # no CUDA events on the CPU
    for name in ("hvp/selection", "hvp/train_forward"):
        host, _, calls = _row(text, name)
        assert float(host) > 0 and int(calls) == 2  # once per timed step
    assert int(_row(text, "hvp/ema")[2]) >= 1
    assert "By cpu_time_total" in text and "aten::" in text
    assert "Host syncs: n/a on the CPU" in text


def test_step_profile_ranges_read_the_host_entry_of_a_range() -> None:
    """With CUDA activities ``key_averages`` holds each profiler range twice, the host's and its
    mirror on the GPU timeline (no host time): the row reads the host's, whichever comes last."""
    sp = load_script("step_profile")
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    host = SimpleNamespace(key="hvp/selection", device_type=cpu, cpu_time_total=6000, device_time_total=4000, count=2)
    mirror = SimpleNamespace(key="hvp/selection", device_type=cuda, cpu_time_total=0, device_time_total=5000, count=2)
    rows = sp.range_rows(SimpleNamespace(key_averages=lambda: [host, mirror]), steps=2)
    assert "| hvp/selection | 3.00 | 2.00 | 2 |" in rows


# --- the GPU session's stages ----------------------------------------------------------------------

SESSION = BENCH / "gpu_session.sh"
FAKES = {  # the device machine's commands, recording instead of running: a stage's calls, not its work
    "python3": 'printf "%s\\037" "$@" >> "$CALLS"; echo >> "$CALLS"',
    "timeout": 'while [[ $1 == -* ]]; do [[ $1 == -k ]] && shift; shift; done; shift; exec "$@"',
    "nvidia-smi": "true",
    "tar": "true",
}


def session_stages() -> dict[str, set[str]]:
    """The stages as the script's case labels, its usage line and its header name them."""
    text = SESSION.read_text()
    usage = re.search(r'stage=\$\{1:\?"stage: ([^"]*)"\}', text)
    assert usage, "no usage line"
    return {
        "case": set(re.findall(r"^    ([a-z][a-z-]*)\)", text, re.MULTILINE)),
        "usage": set(re.split(r",? (?:or )?", usage.group(1))),
        "header": set(re.findall(r"^#\s+bash benchmarks/gpu_session.sh ([a-z-]+)", text, re.MULTILINE)),
    }


def stage_calls(stage: str, tmp_path: Path, **fakes: str) -> list[list[str]]:
    """The python3 command lines that ``gpu_session.sh STAGE`` runs, with fakes first on PATH
    (``fakes``: other bodies for some of :data:`FAKES`)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / f"{stage}.calls"
    bin_dir.mkdir(exist_ok=True)
    for name, body in {**FAKES, **fakes}.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"), CALLS=str(calls))
    proc = subprocess.run(["bash", str(SESSION), stage], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [line.split("\x1f")[:-1] for line in lines]


def check_command(argv: list[str]) -> None:
    """A python command line of a stage or a doc: its script takes the options (its own parser),
    pytest's paths exist, train.py's overrides compose."""
    if argv[:2] == ["-m", "pytest"]:
        paths = [a for a in argv if a.startswith("tests")]
        assert all((REPO / p.split("::")[0]).exists() for p in paths), paths
    elif argv[0] == "train.py":
        make_cfg(*(o for o in argv[1:] if not o.startswith("hydra.")), tiny=False)
    else:
        match = re.fullmatch(r"benchmarks/(\w+)\.py", argv[0])
        assert match and f"{match.group(1)}.py" in SCRIPTS, argv
        try:
            load_script(match.group(1)).parse_args(argv[1:])
        except SystemExit as e:  # argparse's error, printed on stderr
            raise AssertionError(f"{shlex.join(argv)} does not parse") from e


def test_gpu_session_stages_run_existing_scripts_with_their_options(tmp_path: Path) -> None:
    """Each stage, run with the GPU machine's commands faked, calls scripts and tests that exist with
    options their parsers take: a stage that fails on its command line costs a lent machine's call."""
    assert subprocess.run(["bash", "-n", str(SESSION)]).returncode == 0
    names = session_stages()
    assert names["case"] == names["usage"] == names["header"], names
    for stage in sorted(names["case"]):
        work = [c for c in stage_calls(stage, tmp_path) if c[0] != "-c" and c[:2] != ["-m", "pip"]]
        assert work, f"stage {stage} runs nothing"
        for argv in work:
            check_command(argv)


def test_steady_times_every_method_when_one_runs_out_of_time(tmp_path: Path) -> None:
    """`steady` runs overhead.py once per method, each under its own `timeout`. One cut at its limit
    (exit 124 after writing its report) must not end the stage under `set -e -o pipefail`."""
    timed_out = FAKES["timeout"].replace('exec "$@"', '"$@"; exit 124')
    calls = [c for c in stage_calls("steady", tmp_path, timeout=timed_out) if c[0] == "benchmarks/overhead.py"]
    assert [c[c.index("--method") + 1] for c in calls] == ["dino", "simsiam"]
    assert (tmp_path / "out" / "steady.txt").read_text().count(": exit 124") == 2


def test_session_wheels_are_the_lock_versions_of_what_the_gpu_image_lacks() -> None:
    """The header's wheels for the GPU machine (no network there): the packages the code imports
    that its image lacks (benchmarks/gpu_session.sh; the image's list, 2026-11-17, has no hydra,
    omegaconf or pydantic and an older typing-extensions), each at uv.lock's version."""
    header = "\n".join(line for line in SESSION.read_text().splitlines() if line.startswith("#"))
    wheels = dict(re.findall(r"([A-Za-z0-9_.-]+)==([\w.]+)", header))
    lock = dict(re.findall(r'^name = "([^"]+)"\nversion = "([^"]+)"', (REPO / "uv.lock").read_text(), re.MULTILINE))
    lacks = ["hydra-core", "omegaconf", "antlr4-python3-runtime", "pydantic", "pydantic-core", "annotated-types"]
    assert set(lacks + ["typing-inspection", "typing-extensions"]) <= set(wheels), wheels
    assert {name: lock.get(name) for name in wheels} == wheels


def test_an_unknown_stage_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="unknown stage: profiles"):
        stage_calls("profiles", tmp_path)


# --- benchmarks/README.md and RESULTS.md -------------------------------------------------------------

README = BENCH / "README.md"
RESULTS = BENCH / "RESULTS.md"
SMOKE = {  # each maintained script -> the tests that run it
    "gpu_session.sh": [test_gpu_session_stages_run_existing_scripts_with_their_options],
    "loader.py": [test_loader_times_every_arm_and_appends_its_report, test_sigterm_ends_the_step_benchmark],
    "overhead.py": [test_overhead_times_both_models_and_the_bound],
    "quality.py": [test_quality.test_main_plans_and_reports_from_finished_runs, test_quality.test_a_tiny_scale_runs],
    "step_profile.py": [test_step_profile_reports_rates_split_ranges_and_ops],
    "view_cost.py": [
        test_view_cost_item_times_both_arms_on_the_same_crops,
        test_view_cost_blur_times_every_path,
        test_view_cost_batch_times_every_kind,
    ],
}


def test_the_suite_is_the_readmes_list_and_each_script_has_a_smoke_test() -> None:
    headings = re.findall(r"^## `([\w.]+)`:", README.read_text(), re.MULTILINE)
    assert len(SCRIPTS) <= MAX_SCRIPTS
    assert sorted(headings) == SCRIPTS
    assert sorted(SMOKE) == SCRIPTS


def fenced_commands(md: Path) -> list[list[str]]:
    """The command lines in a markdown file's fenced blocks that run a benchmark script: its words
    from the script on, continuations joined, comments dropped."""
    commands, in_fence, lines = [], False, []
    for line in md.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif in_fence:
            lines.append(line)
    for line in re.sub(r"\\\n\s*", " ", "\n".join(lines)).splitlines():
        if not re.search(r"benchmarks/\w+\.(py|sh)", line):
            continue
        words = shlex.split(line, comments=True)
        starts = [i for i, w in enumerate(words) if re.fullmatch(r"benchmarks/\w+\.(py|sh)", w)]
        for i in starts:
            rest = words[i + 1 :]
            end = next((k for k, w in enumerate(rest) if w in (";", "&&", "||", "|") or w.endswith(";")), None)
            commands.append([words[i], *(rest if end is None else [*rest[:end], rest[end].rstrip(";")])])
    return commands


@pytest.mark.parametrize("md", [README, REPO / "docs" / "testing.md"], ids=lambda p: p.name)
def test_readme_commands_parse(md: Path) -> None:
    """Every benchmark command the docs give is one its script takes (a stage the session script has)."""
    commands = fenced_commands(md)
    assert commands
    stages = session_stages()["case"]
    for argv in commands:
        if argv[0].endswith(".sh"):
            assert argv[1:2] and argv[1] in stages, argv
        else:
            check_command(argv)


def sections(md: Path) -> dict[str, str]:
    """Each heading's anchor (GitHub's, as tests/test_docs.py computes it) -> its text, down to the
    next heading of its level or above."""
    lines = md.read_text().splitlines()
    heads, seen, in_fence = [], {}, False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(2))
            heads.append((i, len(match.group(1)), base if base not in seen else f"{base}-{seen[base]}"))
            seen[base] = seen.get(base, 0) + 1
    out = {}
    for k, (i, level, anchor) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        out[anchor] = "\n".join(lines[i:end])
    return out


ENTRY_LINK = re.compile(r"\]\((?:RESULTS\.md)?#([^)\s]+)\)")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def missing_figures(text: str) -> list[str]:
    """The numbers of ``text`` (a table cell, a paragraph) that are not in the RESULTS.md entries it
    links to: a current figure must be the one measured, in the entry that says how."""
    entries = sections(RESULTS)
    anchors = ENTRY_LINK.findall(text)
    assert anchors, f"no link to a RESULTS.md entry: {text[:80]}"
    assert all(a in entries for a in anchors), anchors
    source = "\n".join(entries[a] for a in anchors)
    figures = NUMBER.findall(re.sub(r"\]\([^)]*\)", "]", text))
    return [n for n in figures if not re.search(rf"(?<![\d.]){re.escape(n)}(?!\d)", source)]


def table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]


def test_results_opens_with_one_table_of_current_figures_from_the_sections() -> None:
    """RESULTS.md's first section is the table of current figures; each row's setting, figure and
    date are in the section below that the row links to, and that section gives a command."""
    text = RESULTS.read_text()
    first = re.search(r"^## (.*)$", text, re.MULTILINE)
    assert first and first.group(1) == "Current figures"
    current = sections(RESULTS)["current-figures"]
    rows = table_rows(current)
    assert rows[0] == ["what", "setting", "figure", "machine", "date", "section"] and len(rows) > 10
    assert current.count("\n| what |") == 1  # one table
    for what, setting, figure, _, date, link in rows[2:]:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), what
        assert missing_figures(f"{setting} {figure} {date} {link}") == [], what
        source = "\n".join(sections(RESULTS)[a] for a in ENTRY_LINK.findall(link))
        assert re.search(r"`(uv run |python|bash |LIMIT=)[^`]*`|^```", source, re.MULTILINE), f"no command: {what}"


def test_results_headings_name_what_was_measured_not_work_labels() -> None:
    """A heading says what was measured and when; no issue, session or work-item label."""
    heads = [line for line in RESULTS.read_text().splitlines() if re.match(r"#{1,6} ", line)]
    labels = re.compile(r"\b(issues?|sessions?|items?|stop)\s+\d|\bi\d\d-", re.IGNORECASE)
    assert [h for h in heads if labels.search(h)] == []


def test_readme_latest_results_are_in_the_entries_they_link_to() -> None:
    """benchmarks/README.md's latest result of each script (its table and its sections) is in the
    RESULTS.md entry it links to."""
    text = README.read_text()
    table = [row for row in table_rows(text) if row[0].startswith("[`")]
    assert len(table) == len(SCRIPTS)
    chunks = [row[-1] for row in table]
    for para in re.split(r"\n\s*\n", text):
        if para.startswith("Latest result"):
            intro, *bullets = re.split(r"\n- ", para)
            chunks += [c for c in (intro, *bullets) if ENTRY_LINK.search(c)]
    assert len(chunks) >= 2 * len(SCRIPTS) - 1  # the table's and those of the sections (the analysis demo too)
    for chunk in chunks:
        assert missing_figures(chunk) == [], chunk


def test_figure_check_finds_a_number_not_in_the_entry() -> None:
    """The check itself: a figure of its entry passes, a changed one and a missing link do not."""
    link = "[x](RESULTS.md#hvp-step-time-overhead-benchmarksoverheadpy-2026-11-21)"
    assert missing_figures(f"SimSiam 1.585x (bound 1.583x) {link}") == []
    assert missing_figures(f"SimSiam 1.58x (bound 1.583x) {link}") == ["1.58"]
    with pytest.raises(AssertionError, match="no link"):
        missing_figures("SimSiam 1.585x")
