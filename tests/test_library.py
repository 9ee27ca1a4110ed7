"""The library without the application: what a researcher with a Lightning script, a loader and a
network of their own gets from ``import hvp_lightning``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from hvp_lightning import HVP, SimCLR, SimCLRSettings
from hvp_lightning.settings import SettingError, method_settings

from .conftest import REPO, SUBPROCESS_TIMEOUT_S


def test_every_method_fits_and_reloads_with_a_plain_trainer_and_no_application() -> None:
    """In a process where data/, training/, run/, cluster/, monitors/, analysis/, evaluation/,
    schema/, config, cli and Hydra, OmegaConf, pydantic and W&B cannot be imported: each of the
    eight methods, HVP on and off, built around the test's own backbone, fits two steps with a plain
    ``lightning.Trainer`` on a plain DataLoader of unlabelled tensors, and ``load_from_checkpoint``
    (given a backbone of the same architecture) gives back its weights, settings and HVP's."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "_library_only.py")],
        cwd=REPO, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    runs = [line.split() for line in lines if not line.startswith("imported:")]
    assert {(name, hvp) for name, hvp, *_ in runs} == {(m, h) for m in method_settings() for h in ("hvp", "off")}
    assert all(steps == "2" and same == "True" for _, _, steps, same in runs), runs
    assert lines[-1] == "imported: none"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean((2, 3))


def test_a_method_takes_its_settings_as_keywords_or_one_object_and_refuses_a_bad_one_in_one_line() -> None:
    a = SimCLR(Net(), feature_dim=8, temperature=0.2, hvp=HVP(num_views=3))
    b = SimCLR(Net(), SimCLRSettings(temperature=0.2), feature_dim=8, hvp={"num_views": 3})
    assert a.settings == b.settings and a.settings.temperature == 0.2 and a.hvp == b.hvp
    assert a.hparams["settings"]["temperature"] == 0.2 and a.hparams["hvp"]["num_views"] == 3
    assert [v.size for v in a.views()] == [None, None, None]  # N candidates at the data's crop size
    for keys, said in (
        ({"temperature": 0}, "temperature=0 is not allowed: a number > 0"),
        ({"temperatur": 0.2}, "temperatur=0.2 is not allowed: not a key of SimCLRSettings (did you mean temperature? "),
        ({"hvp": HVP(global_pairs="all")}, "hvp.global_pairs='all' is not allowed: cross for method simclr"),
        ({"optimizer": {"name": "lars"}}, "optimizer.base_lr is not set"),
    ):
        with pytest.raises(SettingError) as err:
            SimCLR(Net(), feature_dim=8, **keys)
        assert str(err.value).startswith(said) and "\n" not in str(err.value)
    with pytest.raises(SettingError, match=r"^feature_dim=None is not allowed: the width of Net's features"):
        SimCLR(Net())


def test_the_dino_example_pretrains_a_timm_vit_with_hard_views_and_a_plain_trainer() -> None:
    """examples/dino_timm.py: DINO with HVP around a timm ViT, the user's own loader making the
    views ``model.views()`` asks for, a plain ``lightning.Trainer``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dino_timm", REPO / "examples" / "dino_timm.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # type: ignore[union-attr]
    model = example.main(max_steps=2, batch_size=4)
    assert model.global_step == 2 and model.hvp.enabled and model.hvp.max_combinations == 128
    assert model.last_selection["table"].shape[0] == 4  # the last step scored every sample's combinations
    assert [v.size for v in model.views()].count(None) == 4  # 4 global candidates at the loader's crop size


@pytest.mark.slow  # a copy of the package, and a process that imports it
def test_a_ninth_method_is_its_own_files_and_every_registry_takes_it(tmp_path) -> None:
    """A method added as the guide in docs/methods.md says -- its settings file, its method file,
    its preset, nothing else edited (the loss is written in the method file here) -- is a method
    everywhere: the config group and its schema, validation, the builder, a training step, the
    public API, the linear-probe recipes and the fine-tuning tables."""
    import shutil
    import textwrap

    copy = tmp_path / "pkg"
    shutil.copytree(REPO / "hvp_lightning", copy / "hvp_lightning", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "conf", copy / "conf")
    (copy / "hvp_lightning" / "settings" / "toy.py").write_text(
        textwrap.dedent('''
        from __future__ import annotations
        from typing import ClassVar
        from .declare import declared, setting
        from .method import LinearRecipe, PairHeadSettings
        from .optim import Optimizer

        @declared
        class ToySettings(PairHeadSettings):
            """A toy method: negative cosine between the two views' projections."""
            name: ClassVar[str] = "toy"
            linear_recipe: ClassVar[LinearRecipe] = LinearRecipe(optimizer="sgd", base_lr=0.5, batch_size=64, epochs=7)
            scale: float = setting(1.0, "the loss's scale", gt=0)
            optimizer: Optimizer = setting(
                Optimizer(name="sgd", base_lr=0.05, weight_decay=0.0, warmup_epochs=0, final_lr_ratio=0.0),
                "the optimiser",
            )
    ''')
    )
    (copy / "hvp_lightning" / "methods" / "toy.py").write_text(
        textwrap.dedent('''
        from __future__ import annotations
        import torch
        import torch.nn.functional as F
        from ..nn.heads import mlp
        from ..selection import HardViewMixin, pair_index
        from ..settings.toy import ToySettings
        from .base import SSLMethod

        def toy_loss(z1, z2, scale):
            return -scale * F.cosine_similarity(z1, z2, dim=-1)

        class Toy(HardViewMixin, SSLMethod):
            """The toy method."""
            settings_type = ToySettings
            def build(self):
                s = self.settings
                self.projector = mlp(self.backbone.feature_dim, s.proj_hidden_dim, s.proj_dim, s.proj_layers)
            def ssl_step(self, batch, batch_idx):
                z1, z2 = (self.projector(self.backbone(v)) for v in batch["views"])
                return toy_loss(z1, z2, self.settings.scale).mean()
            def candidate_scores(self, batch):
                z = [self.projector(self.backbone(v)) for v in batch["views"]]
                pairs = pair_index(len(z), device=z[0].device).tolist()
                return torch.stack([toy_loss(z[k], z[l], self.settings.scale) for k, l in pairs], 1)
    ''')
    )
    (copy / "conf" / "method" / "toy.yaml").write_text("defaults:\n  - _toy\n  - _self_\nbatch_size: 16\nscale: 2.0\n")
    code = textwrap.dedent("""
        import torch
        import hvp_lightning
        from hvp_lightning import schema
        from hvp_lightning.config import check_options
        from hvp_lightning.evaluation.protocols import FINETUNE_TABLE
        from hvp_lightning.training.build import build_method, run_view_augs
        cfg = check_options(schema.compose("config", ["method=toy", "+hvp=on", "logger=csv", "trainer=cpu",
                                                      "data.train_size=64", "data.test_size=16", "data.num_workers=0"]))
        model = build_method(cfg)
        views = [torch.randn(4, 3, a.size, a.size) for a in run_view_augs(cfg)]
        loss = model.training_step({"views": views}, 0)
        linear = schema.compose("eval", ["protocol=linear", "ckpt=x"]).protocol.recipes.toy
        print(type(model).__name__, model.settings.scale, len(views), loss.ndim, "toy" in schema.METHOD_NAMES)
        print(hvp_lightning.Toy is type(model), hvp_lightning.ToySettings.name, FINETUNE_TABLE["toy"], linear.epochs)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, env={"PYTHONPATH": str(copy), "PATH": "/usr/bin"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["Toy 2.0 4 0 True", "True toy simsiam 7"]
