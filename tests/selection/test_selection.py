"""The HVP selection rules of docs/DESIGN.md: per-sample choice equals brute force, state untouched."""

from __future__ import annotations

import itertools

import pytest
import torch

from hvp_lightning.losses import simsiam_loss, simsiam_pair_table
from hvp_lightning.selection import (
    ambient_autocast_dtype,
    choose,
    frozen_state,
    gather_pairs,
    global_pair_index,
    pair_index,
    resolve_selection_dtype,
    step_autocast_dtype,
    summarise_totals,
)

from ..conftest import build, official_pairs, precision_flags


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
        losses = torch.stack(
            [simsiam_loss(p[k, s : s + 1], p[l, s : s + 1], z[k, s : s + 1], z[l, s : s + 1])[0] for k, l in pairs]
        )
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


@pytest.mark.parametrize("g", [2, 3, 4, 5, 6, 8])
def test_global_pairs_follow_the_official_rule(g):
    """``cross`` is the official HVP code's pair set, in its order (column 0 = the baseline's
    (0, 1), pipeline-1 crop first); ``all`` is every pair."""
    assert [tuple(p) for p in global_pair_index(g, "cross").tolist()] == official_pairs(g, "cross")
    assert [tuple(p) for p in global_pair_index(g, "all").tolist()] == official_pairs(g, "all")
    with pytest.raises(ValueError, match="global_pairs"):
        global_pair_index(g, "same")


NAN, INF = float("nan"), float("inf")


def test_nonfinite_entries_are_never_chosen():
    """Unmasked, NaN wins both argmax and argmin, and +inf (an fp16 overflow) wins argmax."""
    table = torch.tensor([[0.1, NAN, 0.3, 0.2], [INF, 0.5, -INF, 0.4], [NAN, 2.0, NAN, NAN]])
    assert choose(table, "hard").tolist() == [2, 1, 1]
    assert choose(table, "easy").tolist() == [0, 3, 1]
    rows = table.repeat(200, 1)
    picks = choose(rows, "random", torch.Generator().manual_seed(0)).view(200, 3)
    assert torch.isfinite(rows.view(200, 3, 4).gather(2, picks[..., None])).all()
    assert set(picks[:, 0].tolist()) == {0, 2, 3} and set(picks[:, 1].tolist()) == {1, 3}  # uniform over the finite


@pytest.mark.parametrize("mode", ["hard", "easy", "random"])
def test_a_sample_without_finite_candidates_raises(mode):
    table = torch.tensor([[0.1, 0.2], [NAN, INF]])
    with pytest.raises(FloatingPointError, match="non-finite.*1 of 2 samples"):
        choose(table, mode, torch.Generator().manual_seed(0))


def _logged(model) -> dict:
    """Patch ``model.log`` to collect what a step logs: {name: value}."""
    logged: dict = {}
    model.log = lambda name, value, **kw: logged.__setitem__(name, torch.as_tensor(value).detach().clone())
    return logged


def test_logged_losses_say_which_pass_they_come_from(cfg_factory):
    """``hvp/selection_*`` are the selection pass's values; ``hvp/trained_loss`` is the loss
    the training step returns. With BatchNorm in train mode they differ, so a
    chart of the selection value must not be read as the trained loss."""
    torch.manual_seed(0)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=4")).train()
    batch = {"views": [torch.randn(8, 3, 16, 16) for _ in range(4)], "label": torch.zeros(8, dtype=torch.long)}
    table = model.score_candidates(batch).table
    logged = _logged(model)
    loss = model.training_step(batch, 0)
    selected = table.max(1).values
    torch.testing.assert_close(logged["hvp/selection_selected_loss"], selected.mean())
    torch.testing.assert_close(logged["hvp/selection_candidate_loss"], table.mean())
    torch.testing.assert_close(logged["hvp/trained_loss"], loss.detach())
    torch.testing.assert_close(logged["train/loss"], loss.detach())
    assert not torch.isclose(logged["hvp/trained_loss"], logged["hvp/selection_selected_loss"])  # BatchNorm
    assert logged["hvp/nonfinite_candidates"].item() == 0
    summary = summarise_totals(model.hvp_totals)
    assert summary["selected_samples"] == 8 and summary["nonfinite_candidates"] == 0
    assert summary["trained_loss_mean"] == pytest.approx(loss.item(), rel=1e-6)
    assert summary["selection_selected_loss_mean"] == pytest.approx(selected.mean().item(), rel=1e-6)


def test_nonfinite_candidates_are_masked_counted_and_fatal_when_all(cfg_factory):
    torch.manual_seed(0)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=3")).train()
    batch = {"views": [torch.randn(4, 3, 16, 16) for _ in range(3)], "label": torch.zeros(4, dtype=torch.long)}
    clean = model.score_candidates(batch).table
    poisoned = clean.clone()
    poisoned[0, clean[0].argmax()] = NAN  # the hardest pair of sample 0 overflows
    poisoned[2, 1] = INF
    model.candidate_scores = lambda b: poisoned.clone()  # type: ignore[method-assign]
    logged = _logged(model)
    model.training_step(batch, 0)
    assert model.last_selection["choice"][0] != clean[0].argmax()
    assert torch.isfinite(poisoned.gather(1, model.last_selection["choice"][:, None])).all()
    assert logged["hvp/nonfinite_candidates"].item() == 2
    assert torch.isfinite(logged["hvp/selection_candidate_loss"])  # masked entries left out of the mean
    assert summarise_totals(model.hvp_totals)["nonfinite_candidates"] == 2
    poisoned[1] = NAN  # no finite candidate for sample 1: no step on NaN
    model.ssl_step = lambda *a: pytest.fail("trained on a batch without finite candidates")  # type: ignore[method-assign]
    with pytest.raises(FloatingPointError, match="non-finite"):
        model.training_step(batch, 1)


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


@pytest.mark.parametrize(
    ("trainer_precision", "device", "expected"),
    [
        ("32-true", "cuda", None),
        ("bf16-mixed", "cuda", torch.bfloat16),
        ("16-mixed", "cuda", torch.float16),
        ("32-true", "cpu", None),
        ("bf16-mixed", "cpu", None),
    ],
)
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
    model = build(cfg_factory("+hvp=on", "hvp.num_views=4"))
    model.train()
    batch = {"views": [torch.randn(8, 3, 16, 16) for _ in range(4)], "label": torch.zeros(8, dtype=torch.long)}
    before, rng = _snapshot(model), torch.get_rng_state()
    table = model.score_candidates(batch).table
    assert table.shape == (8, 6) and not table.requires_grad
    after = _snapshot(model)
    assert before.keys() == after.keys()
    for key in before:  # running_mean/var, num_batches_tracked and every parameter
        assert torch.equal(before[key], after[key]), key
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(m.track_running_stats for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))


def test_bf16_selection_runs_sync_batchnorm_as_cuda_allows(cfg_factory, monkeypatch):
    """DDP converts BatchNorm to torch's SyncBatchNorm; on CUDA its statistics-gather kernel
    takes its type from the running stats, or, without them, from the input, and rejects the
    fp32 sample counts when that is bf16 (torch/nn/modules/_functions.py, pytorch#96203). The
    first bf16 HVP step of a DDP run crashed that way while the selection switched
    ``track_running_stats`` off. On CPU the kernel's rule stands in for it, and the selection
    must still leave every buffer as it was."""

    def cuda_rule(self, x):
        running_stats = not self.training or self.track_running_stats  # as SyncBatchNorm.forward passes them
        if self.training and not running_stats and x.dtype != torch.float32:
            raise RuntimeError(f"Expected counts to have type {x.dtype} but got Float")
        return super(torch.nn.SyncBatchNorm, self).forward(x)  # then plain BatchNorm (one process)

    monkeypatch.setattr(torch.nn.SyncBatchNorm, "forward", cuda_rule)
    model = build(cfg_factory("+hvp=on", "hvp.num_views=3", "hvp.selection_precision=bf16")).train()
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    monkeypatch.setattr(model, "_selection_dtype", lambda device_type: torch.bfloat16)  # CPU would select in fp32
    batch = {"views": [torch.randn(4, 3, 16, 16) for _ in range(3)], "label": torch.zeros(4, dtype=torch.long)}
    before = _snapshot(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        table = model.score_candidates(batch).table
    assert table.shape == (4, 3) and torch.isfinite(table).all()
    after = _snapshot(model)
    for key in before:
        assert torch.equal(before[key], after[key]), key


def test_frozen_state_uses_batch_statistics_in_train_mode():
    bn = torch.nn.BatchNorm1d(3).train()
    x = torch.randn(16, 3) * 5 + 2
    with frozen_state(bn, torch.device("cpu")):
        y = bn(x)
    assert torch.allclose(y.mean(0), torch.zeros(3), atol=1e-5)  # normalised by the batch itself
    assert torch.equal(bn.running_mean, torch.zeros(3)) and bn.num_batches_tracked.item() == 0


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to TF32 (10 mantissa bits), as a GPU's tensor cores read fp32 inputs."""
    if x.dtype != torch.float32:
        return x
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


@pytest.fixture(params=["legacy", "new"])
def tf32_matmuls(request, monkeypatch, matmul_precision_restored):
    """CPU stand-in for a GPU that may use TF32: einsum and ``@`` read TF32-rounded inputs
    while CUDA's matmul flag says "tf32" (and the stand-in is on). Where it says otherwise,
    what cuBLAS is told (``allow_tf32``, torch's check that the legacy and the new API agree)
    must be readable and agree. TF32 is allowed the two ways torch offers: the legacy
    ``set_float32_matmul_precision("high")`` (train.py's) and the ``fp32_precision`` API
    (``torch.backends.cuda.matmul.fp32_precision = "tf32"``, after which the legacy getter
    raises)."""
    einsum, matmul = torch.einsum, torch.Tensor.__matmul__
    stand_in = {"on": True}

    def rounded() -> bool:
        if not stand_in["on"]:
            return False
        if torch.backends.cuda.matmul.fp32_precision == "tf32":
            return True
        assert not torch.backends.cuda.matmul.allow_tf32  # raises on a mix of the two APIs
        return False

    monkeypatch.setattr(torch, "einsum", lambda eq, *ops: einsum(eq, *(_tf32(o) if rounded() else o for o in ops)))
    monkeypatch.setattr(
        torch.Tensor, "__matmul__", lambda a, b: matmul(_tf32(a), _tf32(b)) if rounded() else matmul(a, b)
    )
    if request.param == "legacy":
        torch.set_float32_matmul_precision("high")
    else:  # from torch's default, as in a fresh process
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            torch.get_float32_matmul_precision()
    yield stand_in


def test_candidate_tables_are_exact_fp32_where_tf32_is_allowed(tf32_matmuls):
    """The tables rank the loss each method computes, in fp32, even where the networks' matmuls
    may use TF32 (whose rounding moves DINO's cross-entropies by ~1e-3 of their size), and
    leave both precision APIs as they found them."""
    from hvp_lightning.losses import dino_ce_table, simclr_pair_table, student_log_probs, teacher_probs

    g = torch.Generator().manual_seed(0)
    t, s, center = torch.randn(2, 8, 4096, generator=g), torch.randn(5, 8, 4096, generator=g), torch.zeros(4096)
    p, z = torch.randn(4, 8, 256, generator=g), torch.randn(4, 8, 256, generator=g)
    tables = {
        "dino": lambda: dino_ce_table(t, s, center, 0.04, 0.1),
        "simsiam": lambda: simsiam_pair_table(p, z),
        "simclr": lambda: simclr_pair_table(z, 0.1),
    }
    tf32_matmuls["on"] = False  # the references: plain fp32
    want = {name: table() for name, table in tables.items()}
    q, logp = teacher_probs(t, center, 0.04), student_log_probs(s, 0.1)
    tf32_matmuls["on"] = True
    assert (-torch.einsum("gbk,vbk->bgv", q, logp) - want["dino"]).abs().max() > 1e-3  # the stand-in rounds
    allowed = precision_flags()
    try:
        legacy = torch.get_float32_matmul_precision()
    except RuntimeError:  # the new API was used: the legacy getter cannot name the state
        legacy = None
    for name, table in tables.items():
        torch.testing.assert_close(table(), want[name], rtol=0, atol=0, msg=name)
        assert precision_flags() == allowed, name  # both APIs restored after the table
        if legacy is not None:
            assert torch.get_float32_matmul_precision() == legacy, name
