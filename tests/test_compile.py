"""``method.compile``: the compiled backbone gives the eager HVP step, without recompiling;
iBOT's global crops, which bypass the backbone's forward, run compiled too (its token path);
compiled DINO/iBOT runs stay under Dynamo's recompile limit."""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from hvp_lightning.config import ConfigError, validate

from .conftest import augs_of, build

VIT_TINY = [
    "backbone=vit_tiny",
    "backbone.patch_size=8",
    "backbone.img_size=32",
    "backbone.depth=1",
    "backbone.drop_path_rate=0.0",
    "method.out_dim=64",
    "method.head_hidden_dim=32",
    "method.bottleneck_dim=16",
    "logger=csv",
    "data.num_workers=0",
    "method.compile=true",
]  # DINO/iBOT presets: add method=<name>_cifar


def random_batch(model: torch.nn.Module, cfg, n: int = 4) -> dict:
    """A seeded batch of random views at ``model``'s crop sizes."""
    gen = torch.Generator().manual_seed(0)
    views = [torch.randn(n, 3, a.size, a.size, generator=gen) for a in augs_of(cfg)]
    return {"views": views, "label": torch.zeros(n, dtype=torch.long)}


def test_compile_flag_is_validated(cfg_factory) -> None:
    with pytest.raises(ConfigError, match="method.compile='yes' is not allowed: true or false"):
        validate(cfg_factory("method.compile=yes"))


@pytest.mark.slow  # inductor compiles two graphs: ~100 s of CPU (9 min wall on a busy 2-core box)
def test_compiled_hvp_step_equals_eager_and_compiles_two_graphs(cfg_factory) -> None:
    """Selection pass (no grad, BatchNorm on copies of its buffers) and training pass are one
    graph each, reused step after step (no recompiles)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = cfg_factory("+hvp=on", "hvp.num_views=4", "method.compile=true", "method.batch_size=8")
    torch.manual_seed(0)
    eager = build(cfg)
    compiled = copy.deepcopy(eager)
    compiled.configure_model()
    assert compiled.compiled_modules == ["backbone"]
    assert compiled.state_dict().keys() == eager.state_dict().keys()  # checkpoints unchanged
    for step in range(3):
        compiled.load_state_dict(eager.state_dict())  # same weights and BN statistics each step
        views = [torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(10 * step + v)) for v in range(4)]
        losses = []
        for model in (eager, compiled):
            model.zero_grad()
            loss = model.training_step({"views": views, "label": torch.zeros(8, dtype=torch.long)}, 0)
            loss.backward()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(compiled.last_selection["choice"], eager.last_selection["choice"])
        # The whole gradient (fused kernels reorder float sums; single small tensors such as
        # BatchNorm biases can differ by more, relative to their own tiny norms).
        g_eager = torch.cat([p.grad.flatten() for p in eager.parameters() if p.grad is not None])
        g_comp = torch.cat([p.grad.flatten() for p in compiled.parameters() if p.grad is not None])
        rel = float((g_comp - g_eager).norm() / g_eager.norm())
        assert rel < 1e-3, f"step {step}: compiled gradient differs from eager by {rel:.2e} of its norm"
        for (name, a), b in zip(eager.named_buffers(), compiled.buffers()):  # BN stats: training pass only
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)
        with torch.no_grad():  # one SGD step, so the next step selects with other weights
            for p in eager.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
    assert counters["stats"]["unique_graphs"] == 2


@pytest.mark.slow  # 20-35 s on 2 cores; .ci/run runs it
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_ibot_global_crops_run_compiled_blocks(cfg_factory, monkeypatch, backend: str) -> None:
    """iBOT's global crops call the trunk's parts directly (``vit_tokens``), past the backbone's
    forward: with ``method.compile`` every block of the student and the teacher still runs
    compiled, in the HVP selection pass and the training pass, step after step (blocks with
    their own drop-path rates included: no recompile limit reached, no eager fallback), and
    the step equals the eager one. ``aot_eager`` traces as inductor does (dynamo, AOT
    autograd) without its C++ builds on CPU."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    torch._dynamo.reset()
    eager_calls: set[tuple[str, str, int, bool]] = set()  # (model, network, tokens, grad) of eager block calls

    def record_if_eager(model: str, net: str, args: tuple[torch.Tensor, ...]) -> None:
        # Under compilation the branch is dead, so the hook adds no side effect or guard.
        if not torch.compiler.is_compiling():
            eager_calls.add((model, net, args[0].shape[1], torch.is_grad_enabled()))

    def models(*extra: str) -> tuple[torch.nn.Module, torch.nn.Module, dict]:
        cfg = cfg_factory("method=ibot_cifar", *VIT_TINY, "+hvp=on", "backbone.depth=2", *extra, tiny=False)
        torch.manual_seed(0)
        eager = build(cfg)
        compiled = copy.deepcopy(eager)
        compiled.configure_model()
        for model, m in (("eager", eager), ("compiled", compiled)):
            for net, backbone in (("student", m.backbone), ("teacher", m.teacher.backbone)):
                for block in backbone.trunk.blocks:
                    block.register_forward_pre_hook(
                        lambda _m, args, model=model, net=net: record_if_eager(model, net, args)
                    )
        return eager, compiled, random_batch(eager, cfg)

    eager, compiled, batch = models()
    assert compiled.state_dict().keys() == eager.state_dict().keys()  # checkpoints unchanged
    assert compiled.compiled_modules == ["backbone", "teacher.backbone", "vit_tokens"]
    losses = [model.training_step(batch, 0) for model in (eager, compiled)]
    global_tokens = (32 // 8) ** 2 + 1
    # The eager model shows the calls exist: selection (no grad) and training pass, both networks.
    assert {
        ("eager", "student", global_tokens, False),
        ("eager", "student", global_tokens, True),
        ("eager", "teacher", global_tokens, False),
    } <= eager_calls
    assert not {c for c in eager_calls if c[0] == "compiled"}  # every compiled block call, locals too
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(compiled.last_selection["choice"], eager.last_selection["choice"])
    # A drop-path rate per block, as the presets have, and a recompile limit scaled to this
    # 3-block net: the token path needs 3 graphs at any depth (student with and without grad,
    # teacher), where compiling block by block needs a graph per rate and grad mode (past the
    # default limit of 8 at depth 12, and past 3 here), after which Dynamo runs blocks eagerly
    # inside the compiled call, where no hook sees it: here reaching the limit raises instead.
    torch._dynamo.reset()  # a run has one model: no graphs of the one above
    _, compiled, batch = models("backbone.depth=3", "backbone.drop_path_rate=0.3")
    with torch._dynamo.config.patch(recompile_limit=3, fail_on_recompile_limit_hit=True):
        for step in range(3):
            compiled.training_step(batch, step).backward()
    assert not {c for c in eager_calls if c[0] == "compiled"}


@pytest.mark.slow  # ~20 s each on 2 cores; .ci/run runs it
@pytest.mark.parametrize("method", ["dino", "ibot"])
def test_multicrop_compiles_stay_under_the_recompile_limit(cfg_factory, monkeypatch, method: str) -> None:
    """Everything a compiled DINO/iBOT run traces (HVP selection and training passes over
    global and local crops, backward, the teacher, evaluation forwards of two batch sizes,
    a drop-path rate per block) fits Dynamo's default recompile limit: past it Dynamo would
    run the backbone eagerly for the rest of the run (here it raises instead)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    cfg = cfg_factory(
        f"method={method}_cifar", *VIT_TINY, "+hvp=on", "backbone.depth=3", "backbone.drop_path_rate=0.3", tiny=False
    )
    model = build(cfg)
    model.configure_model()
    batch = random_batch(model, cfg)
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for step in range(3):
            model.training_step(batch, step).backward()
        model.eval()
        with torch.inference_mode():
            for n in (4, 3):  # the k-NN's full and last batches
                model.eval_backbone(batch["views"][0][:n])
