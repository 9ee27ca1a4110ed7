"""Real SLURM submissions, the way users submit: ``train.py -m hydra/launcher=slurm ...`` against a
running cluster (scripts/slurm_cluster.sh start: two slurmd nodes on this machine). Marked ``slurm``:
deselected by default, run with ``pytest -m slurm``; skipped with the reason when ``sbatch`` is
missing or no node is up. Tiny jobs: built-in synthetic data, CPU, gloo, one-digit seconds of training."""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from .conftest import REPO, TINY, assert_same_reported_run, write_tiny_experiment

pytestmark = pytest.mark.slurm
JOB_TIMEOUT_S = 900  # one sweep on a busy 2-core machine: queueing, ~1 min of start-up per job, requeues


def cluster_down_reason() -> str | None:
    if shutil.which("sbatch") is None:
        return "sbatch not found: no SLURM client here (scripts/slurm_cluster.sh start installs one, as root)"
    try:
        states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"sinfo failed: {err}"
    if states.returncode != 0 or not {"idle", "mixed", "allocated"} & set(states.stdout.split()):
        return f"no SLURM node up (sinfo: {(states.stdout + states.stderr).strip()!r}; scripts/slurm_cluster.sh start)"
    return None


@pytest.fixture(scope="module", autouse=True)
def _cluster():
    reason = cluster_down_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    write_tiny_experiment(tmp_path / "conf")
    return tmp_path / "conf"


def command(conf_dir: Path, sweep_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "train.py",
        "-m",
        "--config-dir",
        str(conf_dir),
        "+experiment=tiny",
        "logger=csv",
        "hydra/launcher=slurm",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        f"hydra.sweep.dir={sweep_dir}",
        *overrides,
    ]


def submit(conf_dir: Path, sweep_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """A sweep, from submission to its table (the launcher waits for the jobs)."""
    return subprocess.run(
        command(conf_dir, sweep_dir, *overrides), cwd=REPO, capture_output=True, text=True, timeout=JOB_TIMEOUT_S
    )


def table(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "sweep_summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def task_logs(sweep_dir: Path) -> dict[str, list[str]]:
    """submitit's ``JobEnvironment(...)`` line of every task, by job (``<id>``, or ``<id>_<index>`` in an array)."""
    logs: dict[str, list[str]] = {}
    for out in sorted(sweep_dir.glob(".submitit/*/*_log.out")):
        start = [line for line in out.read_text().splitlines() if "Starting with JobEnvironment" in line]
        logs.setdefault(out.parent.name, []).extend(start[:1])
    return logs


def test_sweep_of_two_jobs_with_two_tasks_each_fills_the_table(conf_dir, tmp_path):
    """(a) one array job, 2 elements, each 2 DDP processes (one SLURM task per device)."""
    sweep = tmp_path / "sweep"
    proc = submit(conf_dir, sweep, "trainer.devices=2", "seed=0,1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = table(sweep)
    assert [(r["seed"], r["status"]) for r in rows] == [("0", "ok"), ("1", "ok")], rows
    assert all(r["knn_top1"] and Path(r["run_dir"], "summary.json").exists() for r in rows)
    logs = task_logs(sweep)
    assert len(logs) == 2 and all(len(starts) == 2 for starts in logs.values()), logs
    assert all("global_rank=1(2)" in starts[1] for starts in logs.values()), logs


def test_two_nodes_with_one_task_each(conf_dir, tmp_path):
    """(b) trainer.num_nodes=2 trainer.devices=1: one process on each of n1 and n2, one DDP world of 2."""
    sweep = tmp_path / "sweep"
    proc = submit(conf_dir, sweep, "trainer.num_nodes=2", "trainer.devices=1", "seed=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = table(sweep)
    assert row["status"] == "ok" and row["knn_top1"], row
    [starts] = task_logs(sweep).values()
    assert sorted(s[s.index("node=") : s.index("node=") + 9] for s in starts) == ["node=0(2)", "node=1(2)"], starts


def test_a_failing_element_fails_alone_and_is_in_the_table(conf_dir, tmp_path):
    """(d) method.batch_size=-1 is refused inside its job; the other job trains; the sweep exits 1."""
    sweep = tmp_path / "sweep"
    proc = submit(conf_dir, sweep, "trainer.devices=1", "method.batch_size=16,-1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    rows = {r["method.batch_size"]: r for r in table(sweep)}
    assert rows["16"]["status"] == "ok" and rows["16"]["knn_top1"], rows
    assert rows["-1"]["status"] == "failed" and "method.batch_size" in rows["-1"]["error"], rows


def job_ids(sweep: Path) -> set[str]:
    """The SLURM job ids of a sweep: submitit's log dirs ``<id>`` and ``<id>_<index>`` (not its ``.submission_*``)."""
    found = (re.fullmatch(r"(\d+)(_\d+)?", p.name) for p in sweep.glob(".submitit/*")) if sweep.exists() else ()
    return {m.group(1) for m in found if m}


def cancel_jobs(*sweeps: Path) -> None:
    ids = set().union(*(job_ids(sweep) for sweep in sweeps))
    if ids:
        subprocess.run(["scancel", *sorted(ids)], check=False)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return ckpt["state_dict"]


def sessions(run_dir: Path) -> int:
    import json

    return len(json.loads((run_dir / "sessions.json").read_text())["sessions_s"])


def job_dirs(sweep: Path) -> list[Path]:
    return sorted(
        (p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: int(p.name.split("_", 1)[0]),
    )


USR2_BIT = 1 << (signal.SIGUSR2 - 1)  # in /proc/<pid>/status's pending-signal masks
SIGNAL_DELAY_S = 60  # the time-limited job's --signal=USR2@60, with --time=2 (minutes)


def job_pythons(job: str) -> list[int]:
    """The Python processes of SLURM job (or array) ``job`` on this machine: its task and the task's
    loader workers (read from their environment; the batch shell and ``srun`` are not Python)."""
    marks = (f"SLURM_JOB_ID={job}".encode(), f"SLURM_ARRAY_JOB_ID={job}".encode())
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or b"python" not in (proc / "cmdline").read_bytes():
                continue
            if set(marks) & set((proc / "environ").read_bytes().split(b"\0")):
                pids.append(int(proc.name))
        except OSError:  # gone, or not ours
            continue
    return pids


def proc_status(pid: int) -> dict[str, str]:
    try:
        text = (Path("/proc") / str(pid) / "status").read_text()
    except OSError:  # exited
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def usr2_pending(pid: int) -> bool:
    status = proc_status(pid)
    return any(int(status.get(k, "0"), 16) & USR2_BIT for k in ("SigPnd", "ShdPnd"))


def stopped(pid: int) -> bool:
    """Stopped, or no longer running at all (exited, zombie, dead): nothing more to wait for."""
    return proc_status(pid).get("State", "X")[0] in "TZX"


def seconds_left(job: str) -> float | None:
    """The job's time left before its limit (``squeue %L``: [days-]hours:minutes:seconds), if known."""
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%L"], capture_output=True, text=True).stdout.split()
    if not out or not re.fullmatch(r"(\d+-)?(\d+:){0,2}\d+", out[0]):
        return None
    days, _, clock = out[0].rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = 60 * seconds + int(part)
    return seconds + 86400 * int(days or 0)


def hold_until_time_limit_signal(sweep: Path, deadline: float, held: list[str], done: threading.Event) -> None:
    """Freeze the time-limited job's training (SIGSTOP) once its first checkpoint is written, until
    slurmctld's time-limit USR2 comes, so that the signal lands in the middle of its training
    whatever this machine's speed (on quiet cores the job could otherwise finish before slurmctld's
    signal, which comes up to ~30 s late). slurmstepd sends SIGCONT before the signal itself, which
    ends the hold; a USR2 pending on a held process ends it too. Not held when the signal is due
    already (a slow start). Notes what happened in ``held``; ``done`` ends it early (test over)."""
    while time.monotonic() < deadline and not done.is_set():
        dirs = job_dirs(sweep) if sweep.exists() else []
        if dirs and (dirs[0] / "checkpoints" / "last.ckpt").exists():
            break
        time.sleep(0.2)
    else:
        held.append("not held: no checkpoint")
        return
    [job] = job_ids(sweep)
    left = seconds_left(job)
    if left is None or left < SIGNAL_DELAY_S + 10:
        held.append(f"not held: the time-limit signal is due already ({left} s left)")
        return
    pids = job_pythons(job)
    if not pids:
        held.append("not held: no task found")
        return
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        settle = time.monotonic() + 5
        while time.monotonic() < settle and not all(stopped(pid) for pid in pids):
            time.sleep(0.05)  # SIGSTOP takes effect asynchronously
        while time.monotonic() < deadline and not done.is_set():
            if any(usr2_pending(pid) for pid in pids):
                held.append("held until the signal was pending")
                return
            if not all(stopped(pid) for pid in pids):
                held.append("held until slurmstepd continued it for the signal")
                return
            time.sleep(0.1)
        held.append("no signal came")
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def test_preempted_and_timed_out_jobs_are_requeued_and_end_as_the_uninterrupted_run(conf_dir, tmp_path):
    """(c) one sweep of two identical jobs: #0 runs through, #1 gets ``scancel --signal=USR2`` mid-epoch
    (what SLURM sends before a pre-emption); beside it, a job whose ``--time`` (2 min) ends before its
    training does: slurmctld's USR2 60 s before the limit reaches it mid-training (held for it, see
    :func:`hold_until_time_limit_signal`). Both are requeued by submitit and end as #0, bit for bit:
    weights, summary and every epoch-level value in their logs. With the default loader's 2 workers
    (on one CPU per task: the test nodes have 2 CPUs, and the default asks workers + 1)."""
    train = [
        "trainer.devices=1",
        "data.train_size=512",
        "trainer.max_epochs=8",
        "data.num_workers=2",
        "hydra.launcher.cpus_per_task=1",
    ]
    pre, limit = tmp_path / "preempt", tmp_path / "timelimit"
    procs = [
        subprocess.Popen(
            command(conf_dir, pre, *train, "seed=0,0"),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
        subprocess.Popen(
            command(
                conf_dir,
                limit,
                *train,
                "seed=0",
                "hydra.launcher.timeout_min=2",
                f"hydra.launcher.signal_delay_s={SIGNAL_DELAY_S}",
            ),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
    ]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    held: list[str] = []
    done = threading.Event()
    holder = threading.Thread(target=hold_until_time_limit_signal, args=(limit, deadline, held, done), daemon=True)
    holder.start()
    try:
        ckpt = None
        while time.monotonic() < deadline:  # #1 past its first epoch: the signal lands inside a later one
            dirs = job_dirs(pre) if pre.exists() else []
            if len(dirs) == 2 and (dirs[1] / "checkpoints" / "last.ckpt").exists():
                ckpt = dirs[1]
                break
            time.sleep(0.5)
        assert ckpt is not None, "job #1 wrote no checkpoint"
        time.sleep(1.0)
        [array] = job_ids(pre)
        subprocess.run(["scancel", "--signal=USR2", f"{array}_1"], check=True)
        outs = [p.communicate(timeout=JOB_TIMEOUT_S)[0] for p in procs]
        holder.join(timeout=60)
    finally:
        done.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
        cancel_jobs(pre, limit)  # a requeued job outlives its killed submitter
    assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outs]
    reference, preempted = job_dirs(pre)
    [timed_out] = job_dirs(limit)
    assert held and held[0] not in ("no signal came", "not held: no checkpoint", "not held: no task found"), held
    assert sessions(reference) == 1 and sessions(preempted) >= 2 and sessions(timed_out) >= 2
    for sweep, job in ((pre, f"{array}_1"), (limit, next(iter(job_ids(limit))))):
        logs = "".join(p.read_text() for p in (sweep / ".submitit").glob(f"{job}*/*_log.out"))
        assert "this job is preempted" in logs or "this job is timed-out" in logs, logs[-2000:]
    want = final_weights(reference)
    for run in (preempted, timed_out):
        got = final_weights(run)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), run
        assert_same_reported_run(run, reference)


def layout_weights(conf_dir: Path, tmp_path: Path, *extra: str) -> tuple[dict, dict]:
    """The final weights of one run laid out as 2 nodes x 1 process and as 1 node x 2 processes,
    submitted side by side, with no thread setting from the user (OMP_NUM_THREADS unset, as in a
    user's shell)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    train = ["data.train_size=128", "trainer.max_epochs=2", "seed=0", *extra]
    layouts = {"2x1": ["trainer.num_nodes=2", "trainer.devices=1"], "1x2": ["trainer.num_nodes=1", "trainer.devices=2"]}
    procs = {
        name: subprocess.Popen(
            command(conf_dir, tmp_path / name, *train, *layout),
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, layout in layouts.items()
    }
    outs = {name: p.communicate(timeout=JOB_TIMEOUT_S)[0] for name, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), {n: o[-3000:] for n, o in outs.items()}
    [two_nodes], [one_node] = job_dirs(tmp_path / "2x1"), job_dirs(tmp_path / "1x2")
    return final_weights(two_nodes), final_weights(one_node)


def test_two_nodes_by_one_process_equal_one_node_by_two(conf_dir, tmp_path):
    """The two layouts end with the same weights, bit for bit: each process computes on
    the CPUs SLURM gave its task (hvp_lightning/cluster/slurm.py), not on Lightning's node CPUs // processes
    on this node, which differs between the layouts."""
    got, want = layout_weights(conf_dir, tmp_path)
    assert got.keys() == want.keys()
    assert [k for k in want if not torch.equal(got[k], want[k])] == []


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: Lightning's default gives 1 thread in both layouts")
def test_without_a_cpu_count_per_task_the_layouts_differ(conf_dir, tmp_path):
    """The converse, which shows the cause: with no CPU count per task (``cpus_per_task=null``: no
    ``SLURM_CPUS_PER_TASK``) Lightning's default applies -- 2 threads per process in 2 x 1, 1 in
    1 x 2 on a 2-core node -- and the same run ends with other weights in the two layouts."""
    got, want = layout_weights(conf_dir, tmp_path, "hydra.launcher.cpus_per_task=null")
    assert got.keys() == want.keys()
    assert [k for k in want if not torch.equal(got[k], want[k])] != []


def test_a_job_larger_than_the_nodes_stops_before_it_is_queued(conf_dir, tmp_path):
    """A job that asks one node for more CPUs than any node of the partition has would sit in the queue
    for ever (reason PartitionConfig) while the submitter waits: the launcher reads sinfo and stops it."""
    cpus = max(
        int(n) for n in subprocess.run(["sinfo", "-h", "-N", "-o", "%c"], capture_output=True, text=True).stdout.split()
    )
    sweep = tmp_path / "sweep"
    proc = submit(conf_dir, sweep, "trainer.devices=2", f"data.num_workers={cpus}", "seed=0")
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "HYDRA_FULL_ERROR" not in line]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert f"cpus_per_task={cpus + 1}" in lines[0] and "does not fit the default partition" in lines[0], lines[0]
    assert not job_ids(sweep)


def test_plain_sbatch_script_runs_a_two_node_job_and_requeues_itself(tmp_path):
    """scripts/slurm_train.sbatch as docs/distributed.md shows it for CPU nodes, sized on sbatch's command
    line: a 2-node job that gets SLURM's warning mid-run (``scancel --signal=USR2``, what its
    ``--signal=USR2@120`` sends before the time limit) checkpoints at its step, requeues itself and
    finishes with every step trained once, in two sessions."""
    import json

    run_dir = tmp_path / "run"
    epochs, steps_per_epoch = 8, 512 // 16 // 2  # 512 images, batches of 16 on each of 2 ranks
    tiny = [o for o in TINY if not o.startswith(("data.train_size=", "trainer.max_epochs="))]
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--gpus-per-node=0",
            "--cpus-per-task=1",
            "--mem=0",
            "--open-mode=append",  # the requeued session's lines after the first's
            f"--output={tmp_path / 'slurm-%j.out'}",
            "scripts/slurm_train.sbatch",
            "trainer.accelerator=cpu",
            "trainer.precision=32-true",
            "logger=csv",
            *tiny,
            "data.train_size=512",
            f"trainer.max_epochs={epochs}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    )
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    try:
        while not (run_dir / "checkpoints" / "last.ckpt").exists():  # past its first epoch
            assert time.monotonic() < deadline, "the job wrote no checkpoint"
            time.sleep(0.5)
        time.sleep(1.0)
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline, "the job did not end"
            time.sleep(1.0)
    finally:
        subprocess.run(["scancel", job], check=False)
    out = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert "requeueing job" in out and sessions(run_dir) == 2, out[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == epochs * steps_per_epoch, summary
    assert summary["images_seen"] == epochs * 512, summary
