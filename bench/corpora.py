"""Benchmark corpora built from the bundled text, one document per line.

The bundled corpus is ~2 MB; larger inputs are made by repeating its documents in a different
shuffled order per copy, with a copy number word in front so no two documents are identical.
Both sides of every comparison read the same files.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

BUNDLED = Path(__file__).resolve().parent.parent / "payload" / "data" / "corpus.txt.gz"
WORK = Path(__file__).resolve().parent / ".work"


def documents() -> list[str]:
    text = gzip.decompress(BUNDLED.read_bytes()).decode("utf-8")
    return [" ".join(d.split()) for d in text.split("\n\n") if d.strip()]


def corpus_of_size(megabytes: float) -> Path:
    """A file of about `megabytes` MB (cached under bench/.work)."""
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"corpus-{megabytes:g}mb.txt"
    if path.exists():
        return path
    docs = documents()
    rng = random.Random(0)
    target = int(megabytes * 1e6)
    written = 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        copy = 0
        while written < target:
            order = list(range(len(docs)))
            rng.shuffle(order)
            for i in order:
                line = f"c{copy} {docs[i]}\n"
                f.write(line)
                written += len(line.encode("utf-8"))
                if written >= target:
                    break
            copy += 1
    tmp.rename(path)
    return path


def held_out_split(fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """(train documents, held-out documents) of the bundled corpus, for tokenizer quality."""
    docs = documents()
    cut = int(len(docs) * (1 - fraction))
    return docs[:cut], docs[cut:]
