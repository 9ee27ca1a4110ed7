"""Run by tests/test_library.py in a process of its own: the library alone, as a researcher uses it.

The application's modules (data, training, runs, cluster, monitors, analysis, evaluation, the
config schema and validation, the command line) and Hydra, OmegaConf, pydantic and W&B cannot be
imported here. Each of the eight methods, with HVP on and off, is built around a backbone of this
script's own and fitted for two steps by a plain ``lightning.Trainer`` on a plain DataLoader of
unlabelled tensors; then saved and loaded back with ``load_from_checkpoint``. Prints one line per
run: ``<method> <hvp|off> <steps> <loaded equal>``.
"""

from __future__ import annotations

import importlib.machinery
import sys
import tempfile
import warnings
from pathlib import Path

APPLICATION = ("data", "training", "run", "cluster", "monitors", "analysis", "evaluation", "schema", "config",
               "cli", "errors", "device", "backbone_checks", "hub_reach", "warning_filters")  # fmt: skip
LIBRARIES = ("hydra", "omegaconf", "pydantic", "wandb")


def refused(name: str) -> bool:
    parts = name.split(".")
    return parts[0] in LIBRARIES or (parts[0] == "hvp_lightning" and len(parts) > 1 and parts[1] in APPLICATION)


# As if they were not installed: the path finder does not find them (an import raises
# ModuleNotFoundError; libraries that probe for them, as Lightning probes for omegaconf, see none).
_find = importlib.machinery.PathFinder.find_spec
importlib.machinery.PathFinder.find_spec = classmethod(  # type: ignore[method-assign,assignment]
    lambda cls, name, path=None, target=None: None if refused(name) else _find(name, path, target)
)

import lightning as L  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from hvp_lightning import HVP, method_class  # noqa: E402


class SmallCNN(nn.Module):
    """The researcher's own network: ``[B, 3, H, W]`` -> ``[B, 16]``, with BatchNorm."""

    num_features = 16

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def small_vit() -> nn.Module:
    """A timm ViT of the script's own making (iBOT reads its patch tokens)."""
    import timm

    return timm.create_model(
        "vit_tiny_patch16_224", num_classes=0, img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
        dynamic_img_size=True,
    )  # fmt: skip


class UnlabelledViews(Dataset):
    """Per image, the views the method asks for (``model.views()``): random tensors, no labels."""

    def __init__(self, sizes: list[int], n: int = 16) -> None:
        self.sizes, self.n = sizes, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, list[torch.Tensor]]:
        g = torch.Generator().manual_seed(i)
        return {"views": [torch.randn(3, s, s, generator=g) for s in self.sizes]}


KEYS = {  # small heads: a test's sizes
    "simsiam": {"proj_hidden_dim": 16, "proj_dim": 8, "pred_hidden_dim": 4},
    "simclr": {"proj_hidden_dim": 16, "proj_dim": 8},
    "byol": {"proj_hidden_dim": 16, "proj_dim": 8, "pred_hidden_dim": 16},
    "mocov3": {"proj_hidden_dim": 16, "proj_dim": 8, "pred_hidden_dim": 16},
    "vicreg": {"proj_hidden_dim": 16, "proj_dim": 16},
    "barlow_twins": {"proj_hidden_dim": 16, "proj_dim": 16},
    "dino": {"out_dim": 32, "head_hidden_dim": 16, "bottleneck_dim": 8, "num_local_crops": 2, "local_crop_size": 16},
    "ibot": {"out_dim": 32, "head_hidden_dim": 16, "bottleneck_dim": 8, "num_local_crops": 2, "local_crop_size": 16},
}


def main() -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    folder = Path(tempfile.mkdtemp())
    for name, keys in KEYS.items():
        cls = method_class(name)
        for hvp in (None, HVP(num_views=3)):
            torch.manual_seed(0)
            backbone = small_vit() if name == "ibot" else SmallCNN()
            model = cls(backbone, hvp=hvp, **keys)
            sizes = [32 if v.size is None else v.size for v in model.views()]
            trainer = L.Trainer(
                max_epochs=1, limit_train_batches=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False,
            )  # fmt: skip
            trainer.fit(model, DataLoader(UnlabelledViews(sizes), batch_size=4))
            path = folder / f"{name}-{'hvp' if hvp else 'off'}.ckpt"
            trainer.save_checkpoint(path)
            loaded = cls.load_from_checkpoint(path, backbone=small_vit() if name == "ibot" else SmallCNN())
            same = loaded.state_dict().keys() == model.state_dict().keys() and all(
                torch.equal(v, model.state_dict()[k]) for k, v in loaded.state_dict().items()
            ) and loaded.settings == model.settings and loaded.hvp == model.hvp  # fmt: skip
            print(name, "hvp" if hvp else "off", trainer.global_step, same, flush=True)
    blocked = [m for m in sys.modules if m.split(".")[0] in LIBRARIES]
    print("imported:", ",".join(blocked) or "none")


if __name__ == "__main__":
    main()
