"""Soak check (issue 32): consecutive ``trainer=ddp`` runs on 2 CPU processes, each with a k-NN
pass at the start and at the end, every other one killed with SIGKILL mid-training (its whole
process group: both ranks, fork servers, workers) and resumed with the same command. Every run
must finish; one that waits longer than ``--timeout`` seconds counts as hung (a benchmark, not a
test: it takes about 25 minutes on 2 cores).

    uv run python benchmarks/soak.py --runs 20 --out /tmp/soak

Prints one line per run and a last line ``N finished, N failed, N hung``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = [
    "trainer=ddp",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "trainer.max_epochs=1",
    "data.train_size=512",
    "data.test_size=128",
    "method.batch_size=32",
    "logger=csv",
    "eval.at_start=true",
    "eval.every_n_epochs=1",
    "checkpoint.every_n_steps=2",
]


def attempt(args: list[str], env: dict[str, str], timeout: float) -> tuple[str, float]:
    """Run one command in a session of its own; ('ok' | 'exit N' | 'hung', seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "hung", time.monotonic() - start
    took = time.monotonic() - start
    if proc.returncode == 0:
        return "ok", took
    tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return f"exit {proc.returncode}: {tail[0][:160]}", took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("/tmp/soak"))
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--kill-at-step", type=int, default=5)
    args = parser.parse_args()
    counts = {"finished": 0, "failed": 0, "hung": 0}
    for i in range(args.runs):
        run_dir = args.out / f"run{i:02d}"
        command = [*RUN, f"seed={i}", f"hydra.run.dir={run_dir}"]
        killed = i % 2 == 1
        outcomes = []
        if killed:  # kill -9 mid-training, then the same command again
            env = dict(os.environ, KILL_AT_STEP=str(args.kill_at_step))
            outcomes.append(attempt([sys.executable, "-m", "tests._killed_train", *command], env, args.timeout))
        outcomes.append(attempt([sys.executable, "train.py", *command], dict(os.environ), args.timeout))
        last, _ = outcomes[-1]
        first_ok = not killed or outcomes[0][0].startswith("exit -9") or outcomes[0][0].startswith("exit 137")
        state = "hung" if any(o == "hung" for o, _ in outcomes) else ("finished" if last == "ok" else "failed")
        counts[state] += 1
        shown = "; ".join(f"{o} ({s:.0f} s)" for o, s in outcomes)
        print(
            f"run {i:2d} {'kill -9 + resume' if killed else 'straight':16s} {state:8s} {shown}"
            + ("" if first_ok else " [the kill did not happen]"),
            flush=True,
        )
    print(f"{counts['finished']} finished, {counts['failed']} failed, {counts['hung']} hung")


if __name__ == "__main__":
    main()
