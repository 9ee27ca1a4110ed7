"""CPU-only guard against tensors made on the wrong device (HVP crashed on its first
GPU step because ``pair_index`` built its index on the CPU while the choice was on the GPU).

The model and the batch go to the ``meta`` device, which stands in for a GPU: a tensor the
code makes without the device of the data it meets lands on the CPU instead. torch alone
does not object to every such mix on meta (a meta index into a CPU tensor passes, unlike a
GPU index into a CPU tensor), so :class:`DeviceMixGuard` checks every op against CUDA's
rules: all tensor operands on one device, except CPU 0-dim scalars and CPU indices into a
tensor on another device; explicit copies (``.to``, ``copy_``) may cross; a random op draws
with a generator of its own device. What meta cannot show (values, autocast dtypes,
collectives, Lightning's device moves) is the GPU layer's job (tests/test_gpu.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hvp_lightning.analysis.callback import head_views, pair_table, step_statistics
from hvp_lightning.data.datamodule import SSLDataModule
from hvp_lightning.evaluation.probe import Classifier, HeadRecipe
from hvp_lightning.monitors.knn import knn_scores
from hvp_lightning.selection import pair_index

from .conftest import augs_of, build, make_cfg, tiered

aten = torch.ops.aten
COPIES = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
FAKE = torch.device("meta")

VIT = [
    "backbone=vit_tiny",
    "backbone.patch_size=8",
    "backbone.img_size=16",
    "backbone.depth=1",
    "method.local_crop_size=8",
    "method.out_dim=32",
    "method.head_hidden_dim=16",
    "method.bottleneck_dim=8",
]
METHOD_OVERRIDES = {
    "simsiam": ["method=simsiam_cifar", "backbone.width=4"],
    "simclr": ["method=simclr_cifar", "backbone.width=4"],
    "dino": ["method=dino_cifar", *VIT],
    "ibot": ["method=ibot_cifar", *VIT],
}
HVP = {
    "off": [],
    "hard": ["+hvp=on", "hvp.num_views=3"],
    "random": ["+hvp=on", "hvp.num_views=3", "hvp.mode=random"],
    "off_step": ["+hvp=on", "hvp.num_views=3", "hvp.every_n_steps=2"],  # a plain step between HVP steps
    # the cheaper selections: downscaled candidates and part of the samples (together), and none
    "cheaper": ["+hvp=on", "hvp.num_views=3", "hvp.selection_scale=0.5", "hvp.selection_fraction=0.5"],
    "min_iou": ["+hvp=on", "hvp.num_views=3", "hvp.mode=min_iou"],
}
HVP["sampled"] = ["+hvp=on", "hvp.num_views=3", "+hvp.max_combinations=2"]  # DINO's max_combinations
# Every selection setting on both view layouts (SimSiam: two views; DINO: multi-crop) and DINO's
# sampled search, all in the slow tier; the default tier: each method's HVP step (its candidate
# table, then its own step on the chosen views), the cheaper selection and DINO's sampled search.
DEFAULT_CASES = {
    *(f"{m}-hard" for m in METHOD_OVERRIDES),
    *("simsiam-cheaper", "dino-sampled"),
}
CASES = tiered(
    [(m, h) for m in METHOD_OVERRIDES for h in HVP if h != "sampled" or m == "dino"],
    DEFAULT_CASES,
    ids=[f"{m}-{h}" for m in METHOD_OVERRIDES for h in HVP if h != "sampled" or m == "dino"],
)


class DeviceMixGuard(TorchDispatchMode):
    """Raises where an op would fail on a GPU because its operands sit on different devices."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves, _ = tree_flatten((args, kwargs))
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        if func not in COPIES:
            if func in INDEXING and args[0].device.type != "cpu":  # CPU indices may index a GPU tensor
                indices = {id(t) for t in tree_flatten(args[1])[0] if isinstance(t, torch.Tensor)}
                tensors = [t for t in tensors if id(t) not in indices or t.device.type != "cpu"]
            devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
            if len(devices) > 1:
                raise RuntimeError(
                    f"{func} mixes devices {sorted(map(str, devices))}: a tensor was made "
                    "without the device of the data it meets"
                )
        for gen in (x for x in leaves if isinstance(x, torch.Generator)):
            device = kwargs.get("device") or (tensors[0].device if tensors else torch.device("cpu"))
            if torch.device(device).type != gen.device.type:
                raise RuntimeError(f"{func} draws {device} numbers from a {gen.device} generator")
        if func is aten._local_scalar_dense.default and args[0].device == FAKE:
            # A host read (``bool(t)``, ``.item()``: a sync on a GPU) of a stand-in tensor: meta
            # has no values, and values are not what this guard checks.
            return args[0].new_ones((), device="cpu").to(args[0].dtype).item()
        return func(*args, **kwargs)


@pytest.fixture
def fake_gpu(meta_autocast: None) -> DeviceMixGuard:
    """The guard, with ``torch.autocast`` accepting the meta device (as a no-op, like CPU)."""
    return DeviceMixGuard()


def test_guard_applies_cuda_rules(fake_gpu: DeviceMixGuard) -> None:
    """The guard is no tautology: it fails what CUDA fails and passes what CUDA allows."""
    data, cpu_pairs = torch.zeros(4, 3, device=FAKE), pair_index(4)
    choice = torch.zeros(3, dtype=torch.long, device=FAKE)
    with fake_gpu:
        data[pair_index(4)[:, 0]]  # CPU index into a "GPU" tensor: allowed
        data * torch.tensor(2.0)  # CPU scalar: allowed
        data[:3] + torch.zeros(3, 3).to(FAKE)  # explicit copy: allowed
        with pytest.raises(RuntimeError, match="mixes devices"):
            cpu_pairs[choice]  # the gather of commit 2f6e9e3
        with pytest.raises(RuntimeError, match="mixes devices"):
            data[:3] + torch.zeros(3, 3)
        with pytest.raises(RuntimeError, match="generator"):
            torch.rand(3, device=FAKE, generator=torch.Generator())


def one_batch(cfg) -> dict[str, Any]:
    """A real training batch (views, augmentation params, labels, indices) from the data module."""
    dm = SSLDataModule(cfg.data, augs_of(cfg), cfg.method.batch_size, 0, cfg.seed)
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


@pytest.mark.parametrize(("method", "hvp"), CASES)
def test_training_step_keeps_tensors_on_the_data_device(
    method: str, hvp: str, fake_gpu: DeviceMixGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One training step (selection, gather, loss, backward) and the analysis statistics of
    each method, HVP off / hard / random / an off-step of ``every_n_steps`` / the cheaper
    selections (``selection_scale`` with ``selection_fraction``, ``mode=min_iou``), with model
    and batch on the stand-in device."""
    cfg = make_cfg(
        *METHOD_OVERRIDES[method], *HVP[hvp], "method.batch_size=4", "data.train_size=8", "data.crop_size=16"
    )
    model = build(cfg).to(FAKE).train()
    batch = move_data_to_device(one_batch(cfg), FAKE)
    if hvp == "off_step":  # global_step is 0 without a Trainer: force the step between HVP steps
        monkeypatch.setattr(model, "hvp_active", lambda: False)
    model.last_selection = None
    with fake_gpu:
        loss = model.training_step(batch, 0)
        loss.backward()
        n, pairs, _ = pair_table(model, batch["params"])
        sel = model.last_selection or {}
        stats = step_statistics(head_views(batch["params"], n), sel.get("table"), sel.get("choice"), pairs)
    assert loss.device == FAKE and all(v.device == FAKE for v in stats.values())
    assert (sel != {}) == (hvp not in ("off", "off_step"))
    assert all(p.grad is None or p.grad.device == FAKE for p in model.parameters())


def test_evaluation_keeps_tensors_on_the_data_device(fake_gpu: DeviceMixGuard) -> None:
    """k-NN votes and the classifier's test counts live where the features are."""
    feats, labels = torch.randn(6, 4, device=FAKE), torch.zeros(6, dtype=torch.long, device=FAKE)
    clf = Classifier(None, 4, 3, HeadRecipe("sgd", 0.1, 0.0, 0.9, 0, 1)).to(FAKE)
    with fake_gpu:
        scores = knn_scores(feats, labels, feats, 3, k=2)
        clf.on_validation_epoch_start()
        clf.validation_step((feats, labels), 0)
    assert scores.device == FAKE and clf.test_counts.device == FAKE
