"""Augmentation randomness is not process state: a view is a function of
(seed, epoch, image index, slot) on every path, so a run ends with the same weights whatever
``data.num_workers``, and a run killed (SIGKILL) mid-epoch and resumed from its step checkpoint
ends bit for bit where the uninterrupted run does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hvp_lightning.data.augment import MultiViewTransform, ViewAug, draw_view_params, sample_params
from hvp_lightning.data.resident import ResidentImages
from hvp_lightning.data.seeds import key_uniform, key_uniforms, view_key, view_keys
from hvp_lightning.training.driver import run

from .conftest import (
    REPO,
    SUBPROCESS_TIMEOUT_S,
    assert_same_reported_run,
    images_run,
    make_cfg,
    write_images,
    write_plain_shards,
)

pytestmark = (
    pytest.mark.serial
)  # its slow tests start processes of their own and time them: run one at a time (.ci/run)

# 96 images, batch 16: 6 steps an epoch; SimSiam + HVP (its selection draws from torch's RNG,
# which the checkpoint carries).
BASE = [
    "logger=csv",
    "method=simsiam_cifar",
    "data.train_size=96",
    "data.test_size=32",
    "data.crop_size=16",
    "method.batch_size=16",
    "method.proj_hidden_dim=64",
    "method.proj_dim=32",
    "backbone.width=8",
    "trainer.max_epochs=2",
    "eval.at_start=false",
    "eval.every_n_epochs=2",
    "checkpoint.every_n_epochs=null",
    "+hvp=on",
    "hvp.num_views=3",
    "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false",
    "+trainer.deterministic=true",
]
RUN = [*BASE, "trainer=cpu"]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different


def _photos(n: int, h: int, w: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=g)


def test_tensor_keys_and_uniforms_are_the_python_ones() -> None:
    """The device path (int64 tensors, whole batches) draws the numbers a loader worker draws
    (Python ints, one view at a time), bit for bit."""
    index = torch.tensor([0, 1, 7, 12345, 2**40])
    keys = view_keys(9, 3, index, 4)
    for r, i in enumerate(index.tolist()):
        for s in range(4):
            want = view_key(9, 3, i, s)
            assert keys[r, s].item() & ((1 << 64) - 1) == want
            assert key_uniforms(keys[r, s][None], 5)[0].tolist() == [key_uniform(want, j) for j in range(5)]


def test_worker_views_equal_resident_views_in_any_batch() -> None:
    """A view of image i in epoch e has the same parameters whether a loader worker draws it
    (any worker, any order) or the resident-images path draws it on the device for a batch,
    whichever batch and position it lands in; the colour parameters (the batched colour ops'
    input) included."""
    imgs = _photos(12, 24, 24)
    augs = (ViewAug(size=16), ViewAug(size=16, blur_p=1.0, solarize_p=0.5), ViewAug(size=8, scale=(0.05, 0.4)))
    worker = MultiViewTransform(augs, seed=4)
    resident = ResidentImages(imgs, torch.arange(12), augs, seed=4)
    for epoch in (0, 3):
        for batch in (torch.arange(12), torch.tensor([11, 2, 7])):
            drawn = resident.views(batch, epoch=epoch)
            for pos, i in enumerate(batch.tolist()):
                views, params = worker(imgs[i], epoch, i)
                for name, value in params.items():
                    assert torch.equal(drawn["params"][name][pos].to(value.dtype), value), (epoch, i, name)
                for v in range(len(augs)):  # crops: antialiased resize of the same box, batched or not
                    assert (drawn["views"][v][pos].int() - views[v].int()).abs().max() <= 1
    # per-view sampler on the same keys, out of order: no state between views
    keys = view_keys(4, 3, torch.tensor([5]), 3)[0]
    for s in reversed(range(3)):
        p = sample_params(imgs[5], augs[s], view_key(4, 3, 5, s))
        d = draw_view_params(augs, 24, 24, keys[None])
        assert all(torch.equal(d[k][0, s].to(p[k].dtype), p[k]) for k in p)
    assert not torch.equal(worker(imgs[0], 0, 0)[1]["crop_x"], worker(imgs[0], 1, 0)[1]["crop_x"])


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Callable[[int], Path]:
    """The uninterrupted run with ``data.num_workers`` 0, 1 or 2, each made once for the tests here."""
    made: dict[int, Path] = {}

    def with_workers(workers: int) -> Path:
        if workers not in made:
            made[workers] = tmp_path_factory.mktemp(f"straight_{workers}_workers")
            run(make_cfg(*RUN, f"data.num_workers={workers}", tiny=False), made[workers])
        return made[workers]

    return with_workers


@pytest.mark.slow  # three runs
def test_same_weights_with_0_1_and_2_workers(straight_run) -> None:
    """The same run with data.num_workers 0, 1 and 2 ends with the same weights, bit for bit."""
    weights = [_weights(straight_run(workers)) for workers in (0, 1, 2)]
    _assert_same_weights(weights[0], weights[1])
    _assert_same_weights(weights[0], weights[2])


def _killed(run_dir: Path, kill_at: int, *overrides: str) -> dict:
    """Run train.py ``overrides`` in a subprocess that SIGKILLs its process group (ranks and loader
    workers) when step ``kill_at`` ends, before that step's own checkpoint; return the last
    checkpoint's loop state."""
    env = dict(os.environ, KILL_AT_STEP=str(kill_at))
    proc = subprocess.run(
        [sys.executable, "-m", "tests._killed_train", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        start_new_session=True,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not (run_dir / "summary.json").exists()
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


# 2 loader workers each. BYOL: its EMA teacher is updated in the module's batch-end hook, after the
# callbacks' (the step checkpoint waits for the next batch's start). images: SimSiam on data=images,
# 103 generated JPEGs of which 7 are held out for the monitors (the same 6 steps an epoch).
CASES = {"simsiam": [], "byol": ["method=byol_cifar", "method.pred_hidden_dim=16"], "images": []}


@pytest.mark.slow  # a train.py subprocess killed with SIGKILL, and two runs in this process
@pytest.mark.parametrize("case", list(CASES))
def test_killed_mid_epoch_resumes_bit_for_bit_with_workers(tmp_path, straight_run, case: str) -> None:
    """checkpoint.every_n_steps=4, SIGKILL after step 9 (epoch 1, batch 3 of 6): the last
    checkpoint is step 8's, in the middle of epoch 1; the resumed run trains the 4 batches of
    epoch 1 not yet trained and ends with the uninterrupted run's weights (and monitors)."""
    base = [*RUN, "data.num_workers=2"]
    if case == "images":
        write_images(tmp_path / "images", 103)
        base = images_run(base, tmp_path / "images", 7)
    overrides = [*base, *CASES[case], "checkpoint.every_n_steps=4"]
    straight = tmp_path / "straight"
    if case == "simsiam":  # the 2-worker run of test_same_weights_with_0_1_and_2_workers
        straight = straight_run(2)
    else:
        run(make_cfg(*base, *CASES[case], tiny=False), straight)
    ckpt = _killed(tmp_path / "resumed", 9, *overrides)
    assert ckpt["global_step"] == 8
    assert ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["processed"] == 2  # epoch 1, mid
    summary = run(make_cfg(*overrides, tiny=False), tmp_path / "resumed")
    assert summary["steps"] == 12
    _assert_same_weights(_weights(straight), _weights(tmp_path / "resumed"))
    assert_same_reported_run(tmp_path / "resumed", straight)


# shards: 157 generated JPEGs in 3 shards of 50, 7 and 100 written without a manifest (read by
# header scan), 29 held out: 128 to train, 4 batches of 16 per rank, 2 loader workers per rank.
DDP_CASES = {
    "textures": ([], 5, 4, 1),  # extra overrides, kill after step, checkpoint step, batches of epoch 1 trained
    "shards": (["data=shards", "data.monitor_size=29", "data.num_workers=2"], 7, 6, 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DDP_CASES))
def test_ddp_killed_mid_epoch_resumes_bit_for_bit(tmp_path, case: str) -> None:
    """The same with trainer=ddp on 2 CPU processes (3 steps an epoch of 2 x 16 on the textures):
    killed after step 5, resumed from step 4's checkpoint (epoch 1, batch 1 of 3). From uneven
    shards (4 steps an epoch): both ranks get equal batches (no hang at an epoch's end), killed
    after step 7, resumed from step 6's (epoch 1, batch 2 of 4)."""
    extra, kill_at, saved_at, processed = DDP_CASES[case]
    ddp = [*BASE, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "checkpoint.every_n_steps=2"]
    if case == "shards":
        paths = write_images(tmp_path / "images", 157)
        write_plain_shards(tmp_path / "shards", paths, (50, 7, 100))
        kept = [o for o in ddp if not o.startswith(("data.train_size=", "data.test_size="))]
        ddp = [*kept, *extra, f'data.urls="{tmp_path / "shards"}/part-{{0..2}}.tar"']
    straight = subprocess.run(
        [sys.executable, "train.py", *ddp, f"hydra.run.dir={tmp_path / 'straight'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert straight.returncode == 0, straight.stderr[-3000:]
    ckpt = _killed(tmp_path / "resumed", kill_at, *ddp)
    assert ckpt["global_step"] == saved_at
    assert ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["processed"] == processed
    resumed = subprocess.run(
        [sys.executable, "train.py", *ddp, f"hydra.run.dir={tmp_path / 'resumed'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_same_weights(_weights(tmp_path / "straight"), _weights(tmp_path / "resumed"))
    assert_same_reported_run(tmp_path / "resumed", tmp_path / "straight")
