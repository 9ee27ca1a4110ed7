"""What a run's steps cost in model FLOPs (hvp_lightning/training/flops.py, training/cost.py) and how the
perf callback turns batches into rates and run totals (run/perf.py). Whole runs: test_train.py
(perf/* and summary.json's cost), test_resume.py and conftest.assert_same_reported_run (the counts
over a resume)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hvp_lightning.data.datamodule import SSLDataModule
from hvp_lightning.run.perf import PHASES, PerfMonitor, StepFlops, Timeline, batch_images, peak_flops
from hvp_lightning.training.cost import count_step_flops, run_step_flops
from hvp_lightning.training.flops import FlopMeter, model_flops

from .conftest import build, make_settings, tiered
from .test_device_guard import VIT


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))  # nested: counted once
        self.conv = nn.Conv2d(3, 4, 3)


def test_flop_meter_counts_by_hand_forward_once_trained_three_times() -> None:
    """B=3 through Linear(8,16) and Linear(16,4): 2*3*(8*16 + 16*4) = 1152 FLOPs forward;
    Conv2d(3,4,3) on 8x8 (6x6 out): 2*(3*3*3)*4*36 = 7776. A forward whose output needs a gradient
    counts 3x (forward + backward as two forwards), one without (no_grad: a teacher, the selection)
    once; what runs outside the submodules (a loss's matmul) is not model FLOPs."""
    torch.manual_seed(0)
    net, x, img = MLP(), torch.randn(3, 8), torch.randn(1, 3, 8, 8)
    meter = FlopMeter(net)
    with meter.count():
        with torch.no_grad(), meter.phase("selection"):
            net.body(x)
        out = net.body(x)
        (out @ out.T).sum()  # the "loss": not counted
        net.conv(img)
    assert dict(meter.flops) == {"selection": 1152, "step": 3 * 1152 + 3 * 7776}
    meta = MLP().to("meta")  # the meta device: shapes only
    assert model_flops(meta, lambda: meta.body(x.to("meta"))) == 3 * 1152
    # The convention against torch's own count of the backward: 2x the forward, except the first
    # layer's input gradient, which nothing needs (x has no gradient) and torch does not compute.
    with FlopCounterMode(display=False) as torch_count:
        net.body(x).sum().backward()
    assert torch_count.get_total_flops() == 3 * 1152 - 2 * 3 * 8 * 16


def test_simsiam_step_flops_follow_the_views() -> None:
    """SimSiam: one forward f per view of backbone + projector + predictor. The training step
    trains 2 views (2 x 3f), HVP's selection forwards N candidates (N f): with N=3 the selection
    is half the training step's FLOPs, and the baseline step is HVP's training step."""
    counted = count_step_flops(make_settings("+hvp=on", "hvp.num_views=3"))
    baseline = count_step_flops(make_settings())
    assert counted.baseline == counted.train == baseline.train == baseline.baseline
    assert baseline.selection == 0 and counted.selection > 0
    assert 2 * counted.selection == counted.train
    assert counted.total(10, 4) == 4 * (counted.train + counted.selection) + 6 * counted.baseline


def test_dino_step_flops_by_hand() -> None:
    """DINO with HVP on a tiny ViT, against its definition from per-view forwards (backbone +
    head, per image: g for a global view, l for a local one; student and teacher alike):
    baseline = student 3 x (2g + L l) + teacher 2g; HVP's training step reuses the selection's
    teacher outputs (no BatchNorm), so 3 x (2g + L l); the selection forwards the teacher on the G
    global candidates and the student on them and the Lc local candidates: 2 G g + Lc l."""
    cfg = make_settings("method=dino_cifar", *VIT, "+hvp=on", "hvp.num_views=4")
    counted = count_step_flops(cfg)

    with torch.device("meta"):
        dino = build(cfg)
    per_view = {}
    for name, size in (("global", 16), ("local", 8)):
        x = torch.zeros(2, 3, size, size, device="meta")
        with torch.no_grad():
            per_view[name] = model_flops(dino, lambda: dino.head(dino.backbone(x))) // 2  # noqa: B023
    g, l = per_view["global"], per_view["local"]  # noqa: E741
    L, G, Lc = dino.num_local, dino.num_globals, dino.num_locals_cand
    assert (L, G, Lc) == (2, 4, 4)
    assert counted.baseline == 3 * (2 * g + L * l) + 2 * g
    assert counted.train == 3 * (2 * g + L * l)
    assert counted.selection == 2 * G * g + Lc * l


@pytest.mark.parametrize(
    ("settings", "reused"),
    tiered(
        [
            (["trainer.accelerator=cpu", "hvp.selection_precision=bf16"], True),  # bf16 falls back to fp32 on the CPU
            (["trainer.accelerator=gpu", "trainer.precision=bf16-mixed", "hvp.selection_precision=bf16"], True),
            (["trainer.accelerator=gpu", "trainer.precision=bf16-mixed", "hvp.selection_precision=fp16"], False),
            (["trainer.accelerator=gpu", "trainer.precision=32-true", "hvp.selection_precision=bf16"], False),
            (["trainer.accelerator=cpu", "hvp.selection_scale=0.5"], False),
            (
                ["trainer.accelerator=cpu", "trainer.precision=auto", "hvp.selection_precision=bf16"],
                True,
            ),  # auto: 32-true
        ],
        3,
    ),
)
def test_dino_teacher_reuse_is_counted_as_the_runs_device_and_precision_give_it(settings, reused) -> None:
    """The meta device has no autocast: the count answers ``selection_outputs_reusable`` as the run
    will on its accelerator and precision (a teacher forward of the 2 globals more where it does not reuse)."""
    from hvp_lightning.training.cost import outputs_reusable

    cfg = make_settings("method=dino_cifar", *VIT, "+hvp=on", "hvp.num_views=4", *settings)
    assert outputs_reusable(cfg) is reused
    if not any("selection_scale" in o for o in settings):
        counted = count_step_flops(cfg)
        extra = (
            counted.train
            - count_step_flops(make_settings("method=dino_cifar", *VIT, "+hvp=on", "hvp.num_views=4")).train
        )
        assert (extra == 0) is reused and extra >= 0


def test_batch_images_and_step_flops_totals() -> None:
    batch = {"views": [torch.zeros(5, 3, 2, 2)], "params": {"x": torch.zeros(5, 2)}, "bad_file": ["", ""]}
    assert batch_images(batch) == 5 and batch_images([torch.zeros(()), torch.zeros(7)]) == 1
    flops = StepFlops(train=6, selection=4, baseline=7)
    assert flops.total(images=10, selected=10) == 100 and flops.total(images=10, selected=0) == 70


class FakeTrainer:
    log_every_n_steps = 2
    global_step = 0
    world_size = 2


class Logged:
    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def log(self, name: str, value: float, **kwargs) -> None:
        self.values[name] = value


def test_perf_monitor_splits_time_counts_images_and_carries_the_counts() -> None:
    """Batches of 4 images on 2 ranks (8 a step): the phases between the hooks' marks add up to
    the training time, the selecting steps' images are counted, perf/* is logged at the log steps
    only, and the run totals travel in the state dict (times do not)."""
    flops = StepFlops(train=6, selection=4, baseline=7)
    perf, trainer, module = PerfMonitor(flops), FakeTrainer(), Logged()
    perf._world = 2  # noqa: SLF001 -- as setup() sets it from the trainer
    batch = {"views": [torch.zeros(4, 1)]}
    perf.on_train_epoch_start(trainer, module)
    for step in range(4):
        with perf.augment_phase():  # the data module's colour step on the device, after the copy
            pass
        perf.on_train_batch_start(trainer, module, batch, step)
        if step % 2 == 0:
            with perf.selection_phase():
                pass
        perf.on_before_optimizer_step(trainer, module, None)
        trainer.global_step = step + 1
        perf.on_train_batch_end(trainer, module, None, batch, step)
        assert ("perf/images_per_s" in module.values) is (trainer.global_step % 2 == 0)
        module.values.clear()
    perf.on_train_epoch_end(trainer, module)
    perf.on_train_end(trainer, module)
    cost = perf.summary()
    assert (cost["images"], cost["selected_images"], cost["session_images"]) == (32, 16, 32)
    assert cost["total_flops"] == 16 * (6 + 4) + 16 * 7 == flops.total(32, 16)
    assert cost["selection_flops_share"] == 16 * 4 / cost["total_flops"]
    assert set(cost["time_split"]) == set(PHASES) and sum(cost["time_split"].values()) == pytest.approx(1)
    assert cost["images_per_s"] > 0 and cost["mfu"] is None  # no GPU peak on the CPU
    assert perf.summary(images=100, selected=0)["total_flops"] == 700  # the caller's counts (the driver's)
    perf.peak_flops = cost["model_flops_per_s"] * 4  # a GPU's, for the arithmetic
    assert perf.summary()["mfu"] == pytest.approx(0.25)
    resumed = PerfMonitor(flops)
    resumed.load_state_dict(perf.state_dict())
    assert (resumed.images, resumed.selected) == (32, 16) and resumed.summary()["images_per_s"] is None


class FakeEvent:
    """``torch.cuda.Event`` stand-in: a time on a fake device clock (ms), and who waited on it."""

    clock = 0.0
    waited: list[FakeEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at: float | None = None

    def record(self) -> None:
        FakeEvent.clock += 250.0
        self.at = FakeEvent.clock

    def synchronize(self) -> None:
        FakeEvent.waited.append(self)

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.at - self.at


def test_timeline_on_a_gpu_reads_events_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA device a mark records an event (no host sync); a read waits once, for the last
    event, and turns the events' milliseconds into seconds by phase."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(FakeEvent, "waited", [])
    line = Timeline(torch.device("cuda", 0))
    for phase in ("data", "step", "selection", "step", None):
        line.mark(phase)
    last = line.done[-1][2]
    assert FakeEvent.waited == []
    assert dict(line.read()) == {"data": 0.25, "step": 0.5, "selection": 0.25}
    assert FakeEvent.waited == [last]


def test_validation_inside_the_fit_is_in_no_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning runs the epoch-end k-NN (validation) before ``on_train_epoch_end``: its time is in
    no phase, so images/s and the split are those of training alone. Each fake event is 250 ms on;
    the validation takes 10 s of device time between its marks."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    trainer, module = FakeTrainer(), Logged()
    trainer.strategy = type("Strategy", (), {"root_device": torch.device("cuda", 0)})()
    trainer.precision, trainer.world_size = "bf16-mixed", 1
    trainer.datamodule = SSLDataModule.__new__(SSLDataModule)  # only its augment_phase is used
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    perf, batch = PerfMonitor(StepFlops(train=6, selection=0, baseline=6)), {"views": [torch.zeros(4, 1)]}
    perf.setup(trainer, module, "fit")
    perf.on_train_epoch_start(trainer, module)
    with trainer.datamodule.augment_phase():  # set by setup: the colour step's own phase
        pass
    perf.on_train_batch_start(trainer, module, batch, 0)
    perf.on_before_optimizer_step(trainer, module, None)
    perf.on_train_batch_end(trainer, module, None, batch, 0)
    perf.on_validation_start(trainer, module)
    FakeEvent.clock += 10_000.0  # the k-NN pass
    perf.on_train_epoch_end(trainer, module)
    perf.on_train_end(trainer, module)
    cost = perf.summary()
    assert perf.seconds == {"data": 0.75, "augment": 0.25, "step": 0.25, "optimizer": 0.25}
    assert cost["images_per_s"] == 4 / 1.5 and cost["mfu"] == pytest.approx(24 / 1.5 / 989.4e12)
    perf.teardown(trainer, module, "fit")
    assert trainer.datamodule.augment_phase is nullcontext  # back to the class's no-op


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H200", torch.bfloat16, 989.4e12),  # Lightning 2.6 finds no peak for this name
        ("NVIDIA H200 NVL", torch.bfloat16, 835.5e12),
        ("NVIDIA GH200 480GB", torch.float16, 989.4e12),
        ("NVIDIA H100 NVL", torch.bfloat16, 835.5e12),  # Lightning lists the sparse 1978.8e12
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.4e12),  # Lightning's table
        ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312e12),  # Lightning's table
        ("NVIDIA H200", torch.float32, 494.7e12),  # TF32 unless the matmul precision is "highest"
    ],
)
def test_peak_flops_are_dense_and_know_the_h200(monkeypatch, name, dtype, peak) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert peak_flops(torch.device("cuda", 0), dtype) == peak
    assert peak_flops(torch.device("cpu"), dtype) is None


@pytest.mark.parametrize(
    ("overrides", "warned"),
    tiered(
        [
            (("method=vicreg_cifar", "+hvp=on", "hvp.num_views=3"), True),  # the leave-one-out table
            (("method=barlow_twins_cifar", "+hvp=on", "hvp.num_views=3", "hvp.mode=random"), True),
            (("method=vicreg_cifar", "+hvp=on", "hvp.num_views=3", "hvp.mode=min_iou"), False),  # no table
            (("method=vicreg_cifar",), False),
            (("+hvp=on", "hvp.num_views=3"), False),  # SimCLR's per-sample losses: small
        ],
        2,
    ),
)
def test_a_run_says_when_its_flops_leave_out_heavy_selection_work(caplog, overrides, warned) -> None:
    """VICReg's and Barlow Twins' selection computes a leave-one-out loss table outside the
    networks (model FLOPs leave it out): the run's FLOP count says so, where a table is made."""
    with caplog.at_level("WARNING", logger="hvp_lightning.training.cost"):
        assert run_step_flops(make_settings(*overrides)) is not None
    assert ("leave-one-out table" in caplog.text) is warned, caplog.text


def test_timeline_phases_on_the_host_clock() -> None:
    line = Timeline(torch.device("cpu"))
    line.mark("data")
    line.mark("step")
    line.mark(None)
    line.mark("step")  # nothing open before it: no phase
    seconds = line.read()
    assert set(seconds) == {"data", "step"} and all(s >= 0 for s in seconds.values())
    assert line.read() == {}
