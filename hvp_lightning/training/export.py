"""Export a checkpoint's backbone: a folder timm loads, or a plain ``.pth`` state_dict.

    hvp-export <run_dir or .ckpt> OUT_DIR [--student] [--push REPO_ID] [--overwrite]
    hvp-export <run_dir or .ckpt> out.pth [--student] [--overwrite]    # = python -m hvp_lightning.training.export

The exported backbone is the one evaluation uses: the EMA teacher's for DINO/iBOT (the
student's with ``--student``), the backbone otherwise. Keys are the trunk's own
(``conv1.weight``, ``layer1.0.bn1.running_mean``, ... / ``cls_token``, ``blocks.0.attn.qkv.weight``,
...): timm's and torchvision's names.

``OUT_DIR`` gets ``model.safetensors`` (that state dict), ``config.json`` (timm's hub layout:
architecture, model_args, feature width and the run's evaluation views, plus an ``hvp`` record of
how the weights were made; hvp_lightning/training/model_card.py) and ``README.md``, a model card.
``timm.create_model("local-dir:OUT_DIR", pretrained=True)`` then rebuilds the trunk; once written,
the export loads the folder so, checks the keys and shapes strictly and compares its features with
the run's on a fixed batch (a folder that fails is removed). Narrow and CIFAR-stem ResNets have no
timm architecture: the folder is written all the same (``architecture`` null, ``hvp_builder``
naming ``build_resnet``'s arguments).
``--push REPO_ID`` then uploads the folder to the Hugging Face Hub; nothing else goes online.
An ``OUT_DIR`` that holds files, or an existing ``.pth`` file, is refused unless ``--overwrite``
is given (as ``hvp-make-shards`` refuses an ``OUT`` that holds shards): an earlier export is
never replaced by mistake. With it, the three files are replaced and any others stay.

A ``.pth`` / ``.pt`` output is the plain state_dict only (``torch.load(..., weights_only=True)``),
which loads with ``strict=True`` into

* ``torchvision.models.resnet18()/resnet50()`` once its classifier is gone
  (``model.fc = torch.nn.Identity()``); with ``strict=False`` the only missing keys are
  ``fc.weight`` and ``fc.bias``. CIFAR-stem backbones (3x3 ``conv1``, no max-pool) need the same
  stem change, narrow ones (``backbone.width`` != 64) ``hvp_lightning.nn.backbones.build_resnet``;
* ``timm.models.vision_transformer.VisionTransformer(..., num_classes=0)``; with the default
  1000-class head the only missing keys are ``head.weight`` and ``head.bias``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError
from ..run.atomic import atomic_write, atomic_write_text
from ..run.directory import resolve_checkpoint
from ..schema import TIMM_FAMILY, backbone_family
from ..schema.backbone import ResNetSettings

if TYPE_CHECKING:
    import torch

    from .model_card import TimmTarget

# torch and the model code are imported once the arguments and the checkpoint path passed, so that
# --help and a wrong path answer in a second (as train.py's config check does).

WEIGHTS, CONFIG, CARD = "model.safetensors", "config.json", "README.md"
# timm's features may differ from the run's by float32 noise only (the order of the sums, channels-last
# kernels): at most this fraction of the largest feature (of 1 where all are smaller)
FEATURE_TOLERANCE = 1e-5


def exported_backbone(model: Any, student: bool = False) -> tuple[Any, str]:
    """(the backbone module evaluation uses, or the student's; its name in the method, e.g. ``teacher.backbone``)."""
    backbone = model.backbone if student else model.eval_backbone
    return backbone, next(name for name, m in model.named_modules() if m is backbone)


def backbone_state_dict(ckpt: dict, student: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """(trunk state_dict with the ``<module>.trunk.`` prefix stripped, description)."""
    from .checkpoint import build_method, checkpoint_config

    model, cfg = build_method(ckpt), checkpoint_config(ckpt)
    backbone, name = exported_backbone(model, student)
    prefix = name + ".trunk."
    state = {
        k[len(prefix) :]: v.detach().contiguous().clone() for k, v in ckpt["state_dict"].items() if k.startswith(prefix)
    }
    info = {
        "config": cfg,
        "method": cfg.method.name,
        "backbone": cfg.backbone.name,
        "source_prefix": prefix,
        "family": backbone_family(cfg.backbone),
        "width": cfg.backbone.width if isinstance(cfg.backbone, ResNetSettings) else None,
        "cifar_stem": cfg.backbone.cifar_stem if isinstance(cfg.backbone, ResNetSettings) else None,
        "model": model,
        "module": backbone,
    }
    return state, info


def check_in_timm(folder: Path, state: dict[str, torch.Tensor], backbone: Any, input_size: list[int]) -> float:
    """Load the written ``folder`` as users are told to (``timm.create_model("local-dir:<folder>",
    pretrained=True)``) and return the max abs difference of its features from ``backbone``'s on a
    fixed batch of 2 (eval mode). Keys or shapes that differ from ``state`` (checked on a meta
    build first: timm's loader would resample a position embedding silently), or features further
    apart than float32 noise (:data:`FEATURE_TOLERANCE`), are a :class:`CheckpointError`."""
    import timm
    import torch

    source = f"local-dir:{folder}"
    call = f"timm.create_model({source!r}, pretrained=True)"
    try:
        with torch.device("meta"):
            own = timm.create_model(source, pretrained=False).state_dict()
    except (RuntimeError, TypeError, ValueError, AssertionError) as err:
        raise CheckpointError(f"{call} fails: {err}") from None
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and v.shape != state[k].shape
    ]
    if missing or unexpected or shapes:
        raise CheckpointError(
            f"{call} does not take the trunk's weights: missing {missing[:3]}, unexpected {unexpected[:3]}, "
            f"shapes (ours vs timm's) {shapes[:3]}"
        )
    model = timm.create_model(source, pretrained=True)
    x = torch.randn((2, *input_size), generator=torch.Generator().manual_seed(0))
    was_training = backbone.training
    with torch.no_grad():
        ours = backbone.eval()(x)
        diff = (model.eval()(x) - ours).abs().max().item()
    backbone.train(was_training)
    scale = max(1.0, ours.abs().max().item())
    if not diff <= FEATURE_TOLERANCE * scale:
        raise CheckpointError(
            f"{call} loads the weights but its features differ from the run's by up to {diff:.3g} "
            f"(features up to {scale:.3g}; allowed {FEATURE_TOLERANCE:g} of that)"
        )
    return diff


def write_folder(out: Path, state: dict[str, torch.Tensor], config: dict, card: str) -> None:
    """model.safetensors, config.json and README.md, each written atomically."""
    from safetensors.torch import save

    data = save(state, metadata={"format": "pt"})
    atomic_write(out / WEIGHTS, lambda f: f.write(data))
    atomic_write_text(out / CONFIG, json.dumps(config, indent=2) + "\n")
    atomic_write_text(out / CARD, card)


def push_folder(out: Path, repo_id: str) -> str:
    """Upload ``out`` to the Hugging Face Hub model repo ``repo_id`` (created if missing); its URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(repo_id=repo_id, folder_path=str(out), commit_message="hvp-export: weights, config, model card")
    return str(repo)


def _read_summary(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def export_folder(
    ckpt: dict, out: Path, student: bool, summary: dict | None, license_id: str, repo_id: str | None
) -> tuple[dict, dict, dict, TimmTarget, float | None]:
    """Write OUT_DIR; returns (state, config, info, timm target, feature difference in timm or None)."""
    from . import model_card as mc

    state, info = backbone_state_dict(ckpt, student)
    backbone = info["module"]
    weights = info["source_prefix"].removesuffix(".trunk.")
    cfg = info["config"]
    target = mc.timm_target(cfg.backbone, backbone.trunk)
    record = mc.run_record(cfg, ckpt, summary, weights)
    config = mc.export_config(target, backbone.feature_dim, cfg.data, record)
    # written beside OUT_DIR and checked there first: a folder that loads into other features is
    # never left behind, and a failed check leaves an earlier export in OUT_DIR as it was
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_folder(staging, state, config, mc.model_card(config, out.name, license_id, repo_id))
        diff = None
        if target.architecture is not None:
            diff = check_in_timm(staging, state, backbone, config["pretrained_cfg"]["input_size"])
        out.mkdir(parents=True, exist_ok=True)
        for name in (WEIGHTS, CONFIG, CARD):
            os.replace(staging / name, out / name)  # same file system: each file whole, old or new
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return state, config, info, target, diff


def main(argv: list[str] | None = None, prog: str = "hvp-export") -> int:
    """The ``hvp-export`` console command; ``prog``: the command name its usage line shows."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    ap.add_argument("ckpt", help="a run dir (its checkpoints/last.ckpt) or a .ckpt file")
    ap.add_argument(
        "out",
        help="OUT_DIR: a folder for model.safetensors, config.json and README.md; "
        "or a .pth / .pt file: the plain state_dict only",
    )
    ap.add_argument("--student", action="store_true", help="DINO/iBOT: export the student backbone, not the teacher")
    ap.add_argument(
        "--push", metavar="REPO_ID", help="then upload OUT_DIR to this Hugging Face Hub model repo (created if missing)"
    )
    ap.add_argument(
        "--license", default="mit", help="the model card's license id (default: mit, hvp-lightning's; set your data's)"
    )
    ap.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier export: the three files of a non-empty OUT_DIR (others stay), or the .pth file",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    plain = out.suffix in (".pth", ".pt")
    if plain and args.push:
        print(f"config error: --push uploads an OUT_DIR folder, not the file {args.out!r}", file=sys.stderr)
        return 2
    if not plain and out.is_file():
        print(f"config error: OUT_DIR={args.out!r} is a file; name a folder, or a .pth / .pt file", file=sys.stderr)
        return 2
    if (held := already_there(out)) and not args.overwrite:
        print(f"config error: {held}, or pass --overwrite", file=sys.stderr)
        return 2
    try:
        path, run_dir = resolve_checkpoint(args.ckpt)
        from .checkpoint import atomic_save, load_checkpoint

        ckpt = load_checkpoint(path)
        if not plain:
            last = path.resolve() == Path(run_dir.last_checkpoint).resolve()
            summary = _read_summary(run_dir.summary) if last else None  # else it describes other weights
            exported = export_folder(ckpt, out, args.student, summary, args.license, args.push)
            _report_folder(out, *exported)
            return _push(out, args.push) if args.push else 0
        state, info = backbone_state_dict(ckpt, args.student)
    except CheckpointError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    atomic_save(state, out)
    print(_wrote(args.out, state, info))
    name, width, cifar = info["backbone"], info["width"], info["cifar_stem"]
    if info["family"] == TIMM_FAMILY:
        hint = f"timm.create_model({name!r}, num_classes=0, <backbone.model_args>).load_state_dict(sd)  (strict)"
    elif info["family"] != "resnet":
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


def already_there(out: Path) -> str | None:
    """What an export to ``out`` would replace, and what to do (hvp-make-shards' words), or None
    for a new file or an empty or missing folder."""
    if out.suffix in (".pth", ".pt"):
        return f"OUT={str(out)!r} already exists: pick another name or remove it" if out.exists() else None
    found = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not found:
        return None
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    return f"OUT_DIR={str(out)!r} already holds files ({shown}): pick an empty folder or remove them"


def _wrote(out: str, state: dict, info: dict) -> str:
    n = sum(
        v.numel() for k, v in state.items() if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    )
    which = info["source_prefix"].removesuffix(".trunk.")
    return (
        f"wrote {out}: {len(state)} tensors, {n / 1e6:.2f}M parameters, from {which} "
        f"({info['method']}, {info['backbone']})"
    )


def _report_folder(out: Path, state: dict, config: dict, info: dict, target: TimmTarget, diff: float | None) -> None:
    from . import model_card as mc

    print(_wrote(str(out / WEIGHTS), state, info) + f"; {config['num_features']} features")
    print(f"wrote {out / CONFIG} (timm architecture {target.architecture or 'null'}, the run's record), {out / CARD}")
    weights = str(out / WEIGHTS)
    if target.architecture is None:
        print(f"timm: {mc.no_timm_reason(target)}; load with hvp_lightning: {mc.builder_line(target, weights)}")
        return
    size = "x".join(str(v) for v in config["pretrained_cfg"]["input_size"])
    print(
        f'checked: timm.create_model("local-dir:{out}", pretrained=True) loads it strictly; features equal '
        f"the run's (max abs diff {diff:.2g} on 2 images {size})"
    )
    print(f'load: timm.create_model("local-dir:{out}", pretrained=True)')
    print(f"  or: {mc.create_model_line(target, weights)}")


def _push(out: Path, repo_id: str) -> int:
    try:
        url = push_folder(out, repo_id)
    except Exception as err:  # network, token, permissions: huggingface_hub's errors share no base class
        print(f"push error: {repo_id}: {type(err).__name__}: {err}".splitlines()[0], file=sys.stderr)
        return 1
    print(f'pushed {out}/ to {url}; load: timm.create_model("hf-hub:{repo_id}", pretrained=True)')
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m hvp_lightning.training.export"))
