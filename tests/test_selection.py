"""The HVP selection rules of DESIGN.md: per-sample choice equals brute force, state untouched."""

from __future__ import annotations

import itertools

import pytest
import torch

from hvp_lightning.methods.simsiam import SimSiam, simsiam_loss, simsiam_pair_table
from hvp_lightning.selection import (ambient_autocast_dtype, choose, frozen_state, gather_pairs, pair_index,
                                     resolve_selection_dtype, step_autocast_dtype)


def test_pair_index_order_and_baseline_pair():
    assert pair_index(2).tolist() == [[0, 1]]
    assert pair_index(4).tolist() == [list(p) for p in itertools.combinations(range(4), 2)]


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("mode", ["hard", "easy"])
def test_simsiam_choice_equals_brute_force(n, mode):
    g = torch.Generator().manual_seed(n)
    b, d = 7, 16
    p, z = torch.randn(n, b, d, generator=g), torch.randn(n, b, d, generator=g)
    table = simsiam_pair_table(p, z)
    choice = choose(table, mode)
    pairs = list(itertools.combinations(range(n), 2))
    for s in range(b):  # pair by pair with the official per-sample loss
        losses = torch.stack([simsiam_loss(p[k, s:s + 1], p[l, s:s + 1], z[k, s:s + 1], z[l, s:s + 1])[0] for k, l in pairs])
        assert torch.allclose(table[s], losses, atol=1e-6)
        best = losses.argmax() if mode == "hard" else losses.argmin()
        assert choice[s].item() == best.item()


def test_choice_is_per_sample_not_per_batch():
    table = torch.tensor([[0.0, 1.0, 0.5], [2.0, 0.0, 0.1]])
    assert choose(table, "hard").tolist() == [1, 0]
    assert choose(table, "easy").tolist() == [0, 1]


def test_random_choice_uses_private_generator_and_covers_candidates():
    table = torch.zeros(600, 6)
    state = torch.get_rng_state()
    c1 = choose(table, "random", torch.Generator().manual_seed(3))
    c2 = choose(table, "random", torch.Generator().manual_seed(3))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(c1, c2) and set(c1.tolist()) == set(range(6))


def test_gather_pairs_picks_each_samples_views():
    views = torch.arange(4 * 3).view(4, 3, 1).float()  # value = 3 * view + sample
    a, b = gather_pairs(views, pair_index(4), torch.tensor([0, 5, 2]))  # (0,1), (2,3), (0,3)
    assert a.flatten().tolist() == [0, 7, 2] and b.flatten().tolist() == [3, 10, 11]


def test_cpu_low_precision_selection_falls_back_loudly():
    with pytest.warns(UserWarning, match="selection_precision=bf16"):
        assert resolve_selection_dtype("bf16", "cpu") is None
    assert resolve_selection_dtype("bf16", "cuda") is torch.bfloat16
    assert resolve_selection_dtype("fp16", "cuda") is torch.float16
    with pytest.raises(ValueError, match="allowed"):
        resolve_selection_dtype("int8", "cuda")


@pytest.mark.parametrize(("trainer_precision", "device", "expected"), [
    ("32-true", "cuda", None), ("bf16-mixed", "cuda", torch.bfloat16), ("16-mixed", "cuda", torch.float16),
    ("32-true", "cpu", None), ("bf16-mixed", "cpu", None)])
def test_auto_selection_precision_follows_the_training_step(trainer_precision, device, expected, recwarn):
    """``auto``: the step's autocast dtype on GPU, fp32 on CPU (slow low-precision convs there),
    silently -- it is the default, not a request; ``fp32`` stays fp32 under any step."""
    step = step_autocast_dtype(trainer_precision)
    assert resolve_selection_dtype("auto", device, step) is expected
    assert resolve_selection_dtype("fp32", device, step) is None
    assert not [w for w in recwarn if "selection_precision" in str(w.message)]
    with pytest.raises(ValueError, match="trainer.precision='bf16-true'"):
        step_autocast_dtype("bf16-true")


def test_ambient_autocast_dtype_is_the_step_precision():
    assert ambient_autocast_dtype("cpu") is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert ambient_autocast_dtype("cpu") is torch.bfloat16
        with torch.autocast("cpu", enabled=False):
            assert ambient_autocast_dtype("cpu") is None
    assert ambient_autocast_dtype("meta") is None  # no autocast there at all


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_selection_pass_leaves_buffers_params_and_rng_untouched(cfg_factory):
    model = SimSiam(cfg_factory("+hvp=on", "hvp.num_views=4"))
    model.train()
    batch = {"views": [torch.randn(8, 3, 16, 16) for _ in range(4)], "label": torch.zeros(8, dtype=torch.long)}
    before, rng = _snapshot(model), torch.get_rng_state()
    table = model.score_candidates(batch)
    assert table.shape == (8, 6) and not table.requires_grad
    after = _snapshot(model)
    assert before.keys() == after.keys()
    for key in before:  # running_mean/var, num_batches_tracked and every parameter
        assert torch.equal(before[key], after[key]), key
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(m.track_running_stats for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))


def test_frozen_state_uses_batch_statistics_in_train_mode():
    bn = torch.nn.BatchNorm1d(3).train()
    x = torch.randn(16, 3) * 5 + 2
    with frozen_state(bn, torch.device("cpu")):
        y = bn(x)
    assert torch.allclose(y.mean(0), torch.zeros(3), atol=1e-5)  # normalised by the batch itself
    assert torch.equal(bn.running_mean, torch.zeros(3)) and bn.num_batches_tracked.item() == 0
