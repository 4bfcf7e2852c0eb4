"""Runs and folders the data-safety tests share (tests/fast and tests/integration)."""

from __future__ import annotations

from pathlib import Path

from payload.core import folders, layout
from tests.support.configs import base_config, write_config


def run_config(tmp_path: Path, out: Path, corpus, name: str = "run", **sections) -> Path:
    return write_config(tmp_path / f"{name}.yaml", base_config(out, corpus, **sections))


NEW = {"weights.bin": b"new weights.bin", "config.json": b"new config.json",
       "sub/extra.txt": b"new sub/extra.txt"}


OLD = {"weights.bin": b"old weights", "config.json": b"old config", "stale.txt": b"old only"}


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*")
            if p.is_file() and p.name != layout.COMPLETE}


def old_folder(root: Path) -> Path:
    target = root / "model"
    if root.exists():
        import shutil

        shutil.rmtree(root)
    for name, body in OLD.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_bytes(body)
    folders.mark_complete(str(target), {"stage": "old", "files": sorted(OLD)})
    return target
