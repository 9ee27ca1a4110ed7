"""``method.compile``: the compiled backbone gives the eager HVP step, without recompiling."""

from __future__ import annotations

import copy

import pytest
import torch

from hvp_lightning.config import ConfigError, validate
from hvp_lightning.methods import METHODS


def test_compile_flag_is_validated(cfg_factory) -> None:
    with pytest.raises(ConfigError, match="method.compile='yes' is not allowed: true or false"):
        validate(cfg_factory("method.compile=yes"))


@pytest.mark.slow  # inductor compiles two graphs: ~100 s of CPU (9 min wall on a busy 2-core box)
def test_compiled_hvp_step_equals_eager_and_compiles_two_graphs(cfg_factory) -> None:
    """Selection pass (no grad, BatchNorm buffers restored after it) and training pass are one
    graph each, reused step after step (no recompiles)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    cfg = cfg_factory("+hvp=on", "hvp.num_views=4", "method.compile=true", "method.batch_size=8")
    torch.manual_seed(0)
    eager = METHODS["simsiam"](cfg)
    compiled = copy.deepcopy(eager)
    compiled.configure_model()
    assert compiled.compiled_backbones == ["backbone"]
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
