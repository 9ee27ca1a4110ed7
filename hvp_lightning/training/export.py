"""Export a checkpoint's backbone as a plain state_dict with torchvision / timm key names.

    hvp-export <run_dir or .ckpt> out.pth [--student]       # = python -m hvp_lightning.training.export ...

The exported backbone is the one evaluation uses: the EMA teacher's for DINO/iBOT (the
student's with ``--student``), the backbone otherwise. Keys are the trunk's own
(``conv1.weight``, ``layer1.0.bn1.running_mean``, ... / ``cls_token``, ``blocks.0.attn.qkv.weight``,
...), so the file loads with ``strict=True`` into

* ``torchvision.models.resnet18()/resnet50()`` once its classifier is gone
  (``model.fc = torch.nn.Identity()``); with ``strict=False`` the only missing keys are
  ``fc.weight`` and ``fc.bias``. CIFAR-stem backbones (3x3 ``conv1``, no max-pool) need the same
  stem change, narrow ones (``backbone.width`` != 64) ``hvp_lightning.nn.backbones.build_resnet``;
* ``timm.models.vision_transformer.VisionTransformer(..., num_classes=0)``; with the default
  1000-class head the only missing keys are ``head.weight`` and ``head.bias``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import CheckpointError
from ..run.directory import resolve_checkpoint

if TYPE_CHECKING:
    import torch

# torch and the model code are imported once the arguments and the checkpoint path passed, so that
# --help and a wrong path answer in a second (as train.py's config check does).


def backbone_state_dict(ckpt: dict, student: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """(trunk state_dict with the ``<module>.trunk.`` prefix stripped, description)."""
    from .checkpoint import build_method

    model = build_method(ckpt)
    backbone = model.backbone if student else model.eval_backbone
    prefix = next(name for name, m in model.named_modules() if m is backbone) + ".trunk."
    state = {
        k[len(prefix) :]: v.detach().contiguous().clone() for k, v in ckpt["state_dict"].items() if k.startswith(prefix)
    }
    cfg = model.cfg
    info = {
        "method": cfg.method.name,
        "backbone": cfg.backbone.name,
        "source_prefix": prefix,
        "family": "vit" if hasattr(backbone.trunk, "blocks") else "resnet",
        "width": cfg.backbone.get("width"),
        "cifar_stem": cfg.backbone.get("cifar_stem"),
    }
    return state, info


def main(argv: list[str] | None = None, prog: str = "hvp-export") -> int:
    """The ``hvp-export`` console command; ``prog``: the command name its usage line shows."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", help="a run dir (its checkpoints/last.ckpt) or a .ckpt file")
    ap.add_argument("out", help="output .pth file (a plain state_dict)")
    ap.add_argument("--student", action="store_true", help="DINO/iBOT: export the student backbone, not the teacher")
    args = ap.parse_args(argv)
    try:
        path, _ = resolve_checkpoint(args.ckpt)
        from .checkpoint import atomic_save, load_checkpoint

        state, info = backbone_state_dict(load_checkpoint(path), args.student)
    except CheckpointError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    atomic_save(state, Path(args.out))
    n = sum(
        v.numel() for k, v in state.items() if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    )
    which = info["source_prefix"].removesuffix(".trunk.")
    print(
        f"wrote {args.out}: {len(state)} tensors, {n / 1e6:.2f}M parameters, from {which} "
        f"({info['method']}, {info['backbone']})"
    )
    name, width, cifar = info["backbone"], info["width"], info["cifar_stem"]
    if info["family"] != "resnet":
        hint = (
            "timm.models.vision_transformer.VisionTransformer(<same size>, num_classes=0)"
            ".load_state_dict(sd)  (strict; with a classification head only head.weight, head.bias are missing)"
        )
    elif width != 64:
        hint = (
            f"hvp_lightning.nn.backbones.build_resnet({name!r}, width={width}, cifar_stem={cifar}).trunk"
            ".load_state_dict(sd)  (strict; torchvision's ResNets have width 64)"
        )
    else:
        stem = "model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False); model.maxpool = nn.Identity(); " if cifar else ""
        hint = (
            f"model = torchvision.models.{name}(); {stem}model.fc = nn.Identity(); model.load_state_dict(sd)  "
            "(strict; with the fc layer kept, strict=False misses only fc.weight, fc.bias)"
        )
    print(f"load: sd = torch.load({str(args.out)!r}, weights_only=True); {hint}")
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m hvp_lightning.training.export"))
