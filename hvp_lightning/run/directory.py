"""Where a run's checkpoint is: a run dir's ``checkpoints/last.ckpt`` or a ``.ckpt`` file.
Torch-free, so the command-line entry points check a ``ckpt=`` or ``resume=`` path before
the heavy imports (hvp_lightning/cli.py, config.py)."""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError

LAST = "last.ckpt"


def resolve_checkpoint(path: str | Path, key: str = "ckpt") -> tuple[Path, Path]:
    """``(checkpoint file, run dir)`` for a run dir (its ``checkpoints/last.ckpt``) or a
    ``.ckpt`` file (its run dir is the folder above ``checkpoints/``)."""
    p = Path(str(path)).expanduser()
    if p.is_dir():
        last = p / "checkpoints" / LAST
        if last.is_file():
            return last, p
        if (p / LAST).is_file():  # the checkpoints/ folder itself
            return p / LAST, p.parent if p.name == "checkpoints" else p
        raise CheckpointError(
            f"{key}={str(path)!r} is not allowed: a run dir with checkpoints/{LAST} or a .ckpt file "
            f"(no checkpoints/{LAST} in that folder)"
        )
    if not p.is_file():
        raise CheckpointError(f"{key}={str(path)!r} is not allowed: a run dir or a .ckpt file (nothing at that path)")
    return p, run_dir_of(p)


def run_dir_of(ckpt_file: Path) -> Path:
    """The run dir a checkpoint file belongs to: the folder above ``checkpoints/`` (a file
    elsewhere: its own folder)."""
    return ckpt_file.parent.parent if ckpt_file.parent.name == "checkpoints" else ckpt_file.parent
