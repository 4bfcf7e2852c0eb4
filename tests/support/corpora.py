"""Corpora cut from the bundled text (payload/data/corpus.txt.gz).

    documents = bundled_documents()
    path = one_paragraph_per_line(folder / "small.txt", documents[:1200])
"""

from __future__ import annotations

import gzip
from functools import cache
from pathlib import Path

from tests.support.paths import BUNDLED


@cache
def _bundled() -> tuple[str, ...]:
    text = gzip.decompress(BUNDLED.read_bytes()).decode("utf-8")
    return tuple(d for d in text.split("\n\n") if d.strip())


def bundled_documents() -> list[str]:
    return list(_bundled())


def one_paragraph_per_line(path: Path, documents: list[str]) -> Path:
    """Each document on one line, whitespace collapsed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(" ".join(d.split()) for d in documents) + "\n", encoding="utf-8")
    return path
