"""``backbone.init``: the run's backbone starts from released weights, once, before training.

Here, above the methods, because a run dir (or a ``.ckpt``) of this project is a source too:
its evaluation backbone (the EMA teacher for DINO/iBOT, the student with
``backbone.init_student=true``) is read as ``hvp-export`` reads it. Every other source --
files, export folders, hub names -- is hvp_lightning/training/weights.py's. A resumed run never
loads ``backbone.init``: its checkpoint holds the trained weights (resume wins), and says so.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ..methods import SSLMethod
from ..run.directory import RunDir, resolve_checkpoint
from ..schema import is_hub_init
from .checkpoint import load_checkpoint
from .export import backbone_state_dict
from .weights import fit_state, read_state

log = logging.getLogger(__name__)


def source_state(source: str, student: bool = False) -> tuple[dict[str, torch.Tensor], str]:
    """(trunk state dict, description) of any ``backbone.init`` source."""
    path = Path(source).expanduser()
    if not is_hub_init(source) and (path.suffix == ".ckpt" or (path.is_dir() and RunDir(path).has_run())):
        ckpt_path, _ = resolve_checkpoint(path, key="backbone.init")
        state, info = backbone_state_dict(load_checkpoint(ckpt_path, key="backbone.init"), student)
        which = info["source_prefix"].removesuffix(".trunk.")
        return state, f"the {which} of {ckpt_path} ({info['method']}, {info['backbone']})"
    return read_state(source, student)


def init_backbone(model: SSLMethod, b: Any, resuming: bool) -> str | None:
    """Load ``backbone.init`` (of ``b``, the run's backbone section) into ``model`` (strict; its
    momentum target follows) unless the run resumes; the line to log, or None without ``backbone.init``."""
    source = b.init
    if not source:
        return None
    if resuming:
        return f"backbone.init={source!r} is not loaded: the run resumes from its checkpoint (resume wins)"
    state, what = source_state(str(source), bool(b.init_student))
    fitted, notes = fit_state(model.backbone.trunk, state, str(source), str(b.name))
    model.start_backbone_from(fitted)
    done = "; ".join(notes)
    return f"backbone.init: {len(fitted)} tensors from {what}" + (f" ({done})" if done else "")
