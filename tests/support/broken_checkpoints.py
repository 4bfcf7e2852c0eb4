"""Checkpoints damaged as a full disk or a cut-short copy leaves them, and what a folder holds.

    for data in array_files(out / "checkpoints" / "4"):   # a JAX (Orbax) step's array files
        truncate(data)                                    # each cut to half its size
    before = tree(out)                                    # {relative path: bytes}
"""

from __future__ import annotations

from pathlib import Path


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def array_files(step: Path) -> list[Path]:
    """The files that hold a step's array data (Orbax's OCDBT `d/` folders)."""
    return [p for p in step.rglob("*") if p.is_file() and p.parent.name == "d"]
