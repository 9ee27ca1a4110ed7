"""Released weights as a backbone's start (``backbone.init``): read, unwrap, fit -- no Lightning.

Why strict: a weights file that only half fits (another depth, another width, a ViT into a
ResNet) loads "successfully" with ``strict=False`` and trains from a half-random network, with
no sign of it. So every key of the trunk must come from the file with its shape, and the
file may hold nothing else except what no trunk has:

* classifier and projection heads (``fc.*``, ``head.*``, ``classifier.*``, DINO/iBOT's
  ``head.mlp.*``): the trunk is built without one (``num_classes=0``), heads start fresh;
* iBOT's ``masked_embed`` (its mask token lives in its backbone; the method's starts at 0);
* BatchNorm's ``num_batches_tracked`` may be absent (torchvision's older files): it counts
  steps and is not a weight.

A ViT's absolute position embedding is resized (timm's ``resample_abs_pos_embed``, bicubic,
prefix tokens kept) to the trunk's own patch grid, so 224 px weights start a 64 px run.
Another patch size is another patch-embedding kernel: reported as wrongly shaped, not
resampled. What is accepted (:func:`read_state`): torchvision / timm state dicts (``.pth``,
``.pt``, ``.bin``, ``.safetensors``), official DINO / iBOT checkpoints (``teacher`` /
``student`` entries, ``module.`` / ``backbone.`` prefixes stripped as their
``utils.load_pretrained_weights`` does; the teacher unless asked), their backbone-only
releases, an ``hvp-export`` folder or file, and ``timm:<name>`` / ``torchvision:<name>`` from
the hubs (offline or out of reach: one line naming the cache path, in seconds). A run dir of this project is read one
layer up (hvp_lightning/training/backbone_init.py), where its checkpoint's method is known.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from ..errors import ConfigError
from ..hub_reach import first_words, offline, unreachable
from ..schema import is_hub_init

# Unexpected keys under these prefixes are heads the trunk does not have: dropped, said so.
HEAD_PREFIXES = ("fc.", "head.", "classifier.")
EXTRA_KEYS = ("masked_embed",)  # iBOT's mask token, saved in its backbone
# DDP (``module.``), DINO/iBOT's multi-crop wrapper (``backbone.``), this project's Backbone
# (``trunk.``) and torch.compile (``_orig_mod.``) prefix the trunk's keys.
WRAPPER_PREFIXES = ("module.", "backbone.", "trunk.", "_orig_mod.")
SHOWN = 3  # keys shown per kind of mismatch


def read_state(source: str, student: bool = False) -> tuple[dict[str, torch.Tensor], str]:
    """(the trunk's state dict as the source holds it, a description for the log) for a file,
    an ``hvp-export`` folder or a hub name. ``student``: a DINO/iBOT checkpoint's student."""
    if is_hub_init(source):
        obj, what = hub_state(source), source
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            if not (path / "model.safetensors").is_file():
                raise ConfigError(
                    f"backbone.init={source!r} is not allowed: a folder must hold model.safetensors "
                    "(an hvp-export folder) or checkpoints/last.ckpt (a run dir)"
                )
            path = path / "model.safetensors"
        obj, what = load_file(path, source), str(path)
    return unwrap(obj, source, student, what)


def load_file(path: Path, source: str) -> object:
    """A ``.safetensors`` file, or anything ``torch.load(weights_only=True)`` reads (plus the
    ``argparse.Namespace`` that DINO/iBOT checkpoints keep their arguments in)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file as load_safetensors

            return load_safetensors(str(path))
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 -- every unreadable file gets a one-line answer
        raise ConfigError(f"backbone.init={source!r} is not allowed: {unreadable(path, err)}") from None


def unreadable(path: Path, err: Exception) -> str:
    """Why ``path`` gives no weights, in one line, from what the file is (never from the text of
    torch's error, which runs over many lines with terminal colour codes): a pickled object a
    weights-only load refuses (a whole model), not a weights file at all, or cut off."""
    from .checkpoint import unsafe_globals

    unsafe = [g for g in unsafe_globals(path) or [] if g != "argparse.Namespace"]  # Namespace: DINO's args
    if unsafe and _is_module_class(unsafe[0]):
        return f"a whole pickled model ({unsafe[0]}): save model.state_dict()"
    if unsafe:
        return f"it pickles {unsafe[0]}, which a weights-only load refuses: save a state_dict of tensors"
    if path.suffix != ".safetensors" and not _torch_saved(path):
        return "not a weights file: neither torch.save's format nor .safetensors"
    return f"cannot be read as weights ({type(err).__name__})"


def _is_module_class(name: str) -> bool:
    """``name`` (``module.Class``) is an ``nn.Module`` class of a module already imported (none is
    imported here: the file is not trusted)."""
    module, _, attr = name.rpartition(".")
    cls = getattr(sys.modules.get(module), attr, None)
    return isinstance(cls, type) and issubclass(cls, nn.Module)


def _torch_saved(path: Path) -> bool:
    """A zip archive (torch.save's format since 1.6) or a pickle (the legacy one starts with protocol 2's opcode)."""
    with open(path, "rb") as f:
        return f.read(1) == b"\x80" or zipfile.is_zipfile(f)


def unwrap(obj: object, source: str, student: bool, what: str) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors of ``obj`` with wrapper prefixes stripped: a DINO/iBOT checkpoint's
    ``teacher`` (or ``student``), a ``state_dict`` / ``model`` entry, or the dict itself."""
    if not isinstance(obj, Mapping):
        raise ConfigError(f"backbone.init={source!r} is not allowed: holds a {type(obj).__name__}, not a state dict")
    if "teacher" in obj or "student" in obj:
        key = "student" if student else "teacher"
        if key not in obj:
            raise ConfigError(f"backbone.init={source!r} is not allowed: the checkpoint has no {key!r} entry")
        obj, what = obj[key], f"the {key} of the DINO/iBOT checkpoint {what}"
    elif student:
        raise ConfigError(
            f"backbone.init_student=True is not allowed for backbone.init={source!r}: it holds no student "
            "(not a DINO/iBOT checkpoint with teacher/student entries); set backbone.init_student=false"
        )
    for key in ("state_dict", "model"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
    state = {strip_prefixes(k): v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not state:
        raise ConfigError(f"backbone.init={source!r} is not allowed: it holds no tensors")
    return state, what


def strip_prefixes(key: str) -> str:
    while key.startswith(WRAPPER_PREFIXES):
        key = key.split(".", 1)[1]
    return key


def fit_state(
    trunk: nn.Module, state: Mapping[str, torch.Tensor], source: str, name: str
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``state`` made to load strictly into ``trunk`` (heads dropped, position embedding
    resized), and what was done; a :class:`ConfigError` with the first missing, unexpected and
    wrongly shaped keys (both shapes) when it does not fit. ``name``: the backbone, for the message."""
    own = trunk.state_dict()
    dropped = sorted(k for k in state if k not in own and (k.startswith(HEAD_PREFIXES) or k in EXTRA_KEYS))
    fitted = {k: v for k, v in state.items() if k not in dropped}
    notes = [f"dropped {len(dropped)} head keys ({', '.join(sorted({k.split('.')[0] for k in dropped}))}.*)"] * bool(
        dropped
    )
    if "pos_embed" in fitted and "pos_embed" in own and fitted["pos_embed"].shape != own["pos_embed"].shape:
        resized = resize_pos_embed(trunk, fitted["pos_embed"])
        if resized is not None:
            fitted["pos_embed"], note = resized
            notes.append(note)
    for k, v in own.items():  # BatchNorm's step counter: absent from older torchvision files
        if k.endswith("num_batches_tracked") and k not in fitted:
            fitted[k] = torch.zeros_like(v)
    missing = [k for k in own if k not in fitted]
    unexpected = [k for k in fitted if k not in own]
    wrong = [k for k in own if k in fitted and fitted[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        parts = [
            _listed("missing", missing, lambda k: f"{k} {list(own[k].shape)}"),
            _listed("unexpected", unexpected, lambda k: f"{k} {list(fitted[k].shape)}"),
            _listed(
                "wrongly shaped", wrong, lambda k: f"{k} file {list(fitted[k].shape)} vs model {list(own[k].shape)}"
            ),
        ]
        raise ConfigError(
            f"backbone.init={source!r} is not allowed: its weights do not fit backbone.name={name!r} "
            f"({'; '.join(p for p in parts if p)})"
        )
    return fitted, notes


def _listed(kind: str, keys: list[str], show: Callable[[str], str]) -> str:
    if not keys:
        return ""
    more = f", ... {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return f"{len(keys)} {kind}: {', '.join(show(k) for k in keys[:SHOWN])}{more}"


def resize_pos_embed(trunk: nn.Module, pos: torch.Tensor) -> tuple[torch.Tensor, str] | None:
    """A ViT's ``pos_embed`` ``[1, prefix + h*w, D]`` resampled to the trunk's patch grid (its
    class/register positions kept as they are), or None when ``pos`` is no square grid of the
    trunk's width (then the shape mismatch is reported)."""
    from timm.layers import resample_abs_pos_embed

    grid = getattr(getattr(trunk, "patch_embed", None), "grid_size", None)
    if grid is None or pos.ndim != 3 or pos.shape[-1] != trunk.pos_embed.shape[-1]:
        return None
    prefix = 0 if getattr(trunk, "no_embed_class", False) else int(getattr(trunk, "num_prefix_tokens", 1))
    side = math.isqrt(pos.shape[1] - prefix)
    if side * side != pos.shape[1] - prefix:
        return None
    out = resample_abs_pos_embed(pos.float(), list(grid), old_size=[side, side], num_prefix_tokens=prefix)
    return out.to(pos.dtype), f"pos_embed resized from a {side}x{side} to a {grid[0]}x{grid[1]} patch grid"


# --- hubs -------------------------------------------------------------------------------------
def hub_state(source: str) -> dict[str, torch.Tensor]:
    """``timm:<name>`` (a pretrained tag allowed: ``timm:vit_small_patch16_224.dino``) or
    ``torchvision:<model>[.<WEIGHTS>]`` from the local cache, else downloaded; when that is
    impossible -- ``HF_HUB_OFFLINE``, or the hub out of reach (:func:`unreachable`: seconds,
    not the clients' minute of retries) -- one line naming the file and where to put it."""
    scheme, _, name = source.partition(":")
    if scheme == "torchvision":
        url, cached = _torchvision_url(source, name)
        where = f"download {url} to {cached}"

        def fetch() -> dict[str, torch.Tensor]:
            return torch.hub.load_state_dict_from_url(url, map_location="cpu", weights_only=True)

    else:
        url, where, cached, fetch = _timm_source(source, name)
    if cached is None or not cached.is_file():
        if offline():
            raise ConfigError(
                f"backbone.init={source!r} is not in the local cache and HF_HUB_OFFLINE is set: {where}, "
                "or pass the file as backbone.init=<path>"
            )
        if (why := unreachable(url)) is not None:
            raise ConfigError(
                f"backbone.init={source!r} is not in the local cache and the hub cannot be reached ({why}): "
                f"{where}, or pass the file as backbone.init=<path>"
            )
    try:
        return fetch()
    except Exception as err:  # noqa: BLE001 -- hub down, bad tag: one line
        said = f"{type(err).__name__}: {first_words(str(err))}".rstrip(": ")
        raise ConfigError(
            f"backbone.init={source!r} could not be fetched ({said}): {where}, or pass the file as backbone.init=<path>"
        ) from None


def _torchvision_url(source: str, name: str) -> tuple[str, Path]:
    from torchvision.models import get_model_weights

    model, _, tag = name.partition(".")
    try:
        weights = get_model_weights(model)
        chosen = weights[tag] if tag else weights.DEFAULT
    except (ValueError, KeyError):
        raise ConfigError(
            f"backbone.init={source!r} is not allowed: torchvision:<model>[.<weights>], e.g. "
            "torchvision:resnet50 or torchvision:resnet50.IMAGENET1K_V1"
        ) from None
    url = chosen.url
    return url, Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


def _timm_source(source: str, name: str) -> tuple[str, str, Path | None, Callable[[], dict[str, torch.Tensor]]]:
    """(the URL it comes from, where to put the file, the cached file or None, the download)."""
    import timm
    from timm.models import get_pretrained_cfg

    try:
        cfg = get_pretrained_cfg(name) if timm.is_model(name) else None
    except RuntimeError:  # a tag timm does not know
        cfg = None
    if cfg is None or not (cfg.hf_hub_id or cfg.url):
        raise ConfigError(
            f"backbone.init={source!r} is not allowed: timm has no released weights of that name "
            "(timm.list_pretrained() lists them, e.g. timm:vit_small_patch16_224.dino)"
        )

    def fetch() -> dict[str, torch.Tensor]:  # timm's own download and key conversion
        return timm.create_model(name, pretrained=True, num_classes=0).state_dict()

    if cfg.hf_hub_id:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import ENDPOINT, HF_HUB_CACHE

        repo = cfg.hf_hub_id.split("@")[0]
        found = next(
            (
                p
                for f in ("model.safetensors", "pytorch_model.bin")
                if isinstance(p := try_to_load_from_cache(repo, f), str)
            ),
            None,
        )
        where = f"run `hf download {repo} model.safetensors` where there is a network (cache: {HF_HUB_CACHE})"
        return f"{ENDPOINT}/{repo}", where, Path(found) if found else None, fetch
    cached = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(cfg.url)
    return cfg.url, f"download {cfg.url} to {cached}", cached, fetch
