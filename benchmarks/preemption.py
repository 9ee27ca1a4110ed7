"""Time lost to one pre-emption: from SLURM's signal until training is back at the step it had reached.

One small CPU run (the demo's SimCLR on the built-in textures, made smaller), 3 epochs of ``--steps``
steps, ``data.num_workers=2``. The signal comes in the middle of step ``S`` (epoch 2, ``--at`` of the
way through). Two ways it can end, interleaved (A, B, A, B, ...):

* ``step``: SIGUSR2. The run finishes step S, writes last.ckpt at step S + 1 and exits (what it does now,
  hvp_lightning/training/preemption.py).
* ``epoch``: the process ends at once, without a checkpoint. This is the epoch restart of before: submitit's
  handler requeued and exited mid-step, and the next job resumed from the epoch-end last.ckpt. Emulated here
  by SIGKILL.

The next session, the requeued job, starts as soon as the first has exited (no queue wait). It is the same
command in the same run dir. Time lost: from the signal until that session has trained step S + 1, the first
step the interrupted session did not train (it starts a batch at global step S + 2). An uninterrupted run
spends about 1.5 steps on that stretch. The table splits the time into the stop (signal to exit), the
start-up (exit to the next session's first batch) and the training until then. The step time is the
interrupted session's mean, data loading included, without its first step.

    uv run python benchmarks/preemption.py --reps 2
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = [
    "logger=csv",
    "trainer=cpu",
    "data.num_workers=2",
    "eval.at_start=false",
    "eval.every_n_epochs=100",
    "checkpoint.every_n_epochs=null",
    "trainer.max_epochs=3",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
]


def session(run_dir: Path, clock: Path, at_step: int, marker: Path, size: list[str]) -> subprocess.Popen:
    env = dict(
        os.environ,
        PREEMPT_AT_STEP=str(at_step),
        PREEMPT_MARKER=str(marker),
        PREEMPT_CLOCK=str(clock),
        WANDB_MODE="offline",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "tests._preempt_job", *RUN, *size, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def trial(mode: str, at: int, folder: Path, size: list[str]) -> dict[str, float]:
    run_dir, clock, marker = folder / f"{mode}-run", folder / f"{mode}-clock", folder / f"{mode}-marker"
    first = session(run_dir, clock, at, marker, size)
    while not marker.exists():
        if first.poll() is not None:
            raise RuntimeError(first.stderr.read()[-3000:])  # type: ignore[union-attr]
        time.sleep(0.01)
    pid = int(marker.read_text())
    signalled = time.time()
    os.kill(pid, signal.SIGUSR2 if mode == "step" else signal.SIGKILL)
    first.wait()
    exited = time.time()
    before = [float(line.split()[0]) for line in clock.read_text().splitlines()]
    step_s = (before[-1] - before[1]) / (len(before) - 2)  # mean, data loading included; the first step warms up
    clock.write_text("")  # from here on: the next session's batches
    second = session(run_dir, clock, -1, folder / f"{mode}-unused", size)
    _, err = second.communicate()
    if second.returncode != 0:
        raise RuntimeError(err[-3000:])
    batches = [(float(t), int(s)) for t, s in (line.split() for line in clock.read_text().splitlines())]
    back = next(t for t, s in batches if s >= at + 2)  # step S + 1 trained again (its first step warms up)
    return {
        "step_s": step_s,
        "stop_s": exited - signalled,
        "start_s": batches[0][0] - exited,
        "retrain_s": back - batches[0][0],
        "lost_s": back - signalled,
        "retrained_steps": at + 2 - batches[0][1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="steps per epoch")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--at", type=float, default=0.75, help="where in epoch 2 the signal comes")
    args = parser.parse_args()
    size = [f"data.train_size={args.steps * args.batch}", f"method.batch_size={args.batch}"]
    at = args.steps + int(args.at * args.steps)  # global step of the step the signal interrupts
    results: dict[str, list[dict[str, float]]] = {"step": [], "epoch": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for mode in ("step", "epoch"):
                folder = Path(tmp) / f"{rep}"
                folder.mkdir(exist_ok=True)
                results[mode].append(trial(mode, at, folder, size))
                print(mode, rep, {k: round(v, 2) for k, v in results[mode][-1].items()}, flush=True)
    print(f"\n{args.steps} steps/epoch of batch {args.batch}, signal in step {at} (epoch 2, {args.at:.0%} through)")
    print(
        "| checkpoint | step (s) | stop (s) | start-up (s) | training (s) | steps trained | lost (s), median of "
        f"{args.reps} |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode, rows in results.items():
        lost = ", ".join(f"{r['lost_s']:.1f}" for r in rows)
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        name = "at the step" if mode == "step" else "epoch restart"
        print(
            f"| {name} | {med['step_s']:.2f} | {med['stop_s']:.1f} | {med['start_s']:.1f} "
            f"| {med['retrain_s']:.1f} | {med['retrained_steps']:.0f} | {med['lost_s']:.1f} "
            f"({lost}) |"
        )


if __name__ == "__main__":
    main()
