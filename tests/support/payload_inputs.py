"""Configs and trees the payload's bad-input tests share (tests/fast and tests/integration)."""

from __future__ import annotations

from pathlib import Path

from tests.support.configs import base_config, line_corpus, write_config


def config(root: Path, *, raw_text: str | None = None, out: str | None = None,
            **sections) -> Path:
    path = root / "run.yaml"
    if raw_text is not None:
        path.write_text(raw_text)
        return path
    return write_config(path, base_config(out or root / "out", line_corpus(root), **sections))


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
            for p in sorted(root.rglob("*"))}
