"""Reading what prepare wrote: the manifest and the rows (tests/fast and tests/integration)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from payload.data import shards as records


def manifest_of(run: Path) -> records.Manifest:
    return records.Manifest.from_json((run / "data" / "manifest.json").read_text())


def rows_of(run: Path, split: str) -> np.ndarray:
    manifest = manifest_of(run)
    parts = [records.iter_rows((run / "data" / e.name).read_bytes(), dtype=manifest.dtype)
             for e in manifest.splits[split].shards]
    return np.concatenate(parts) if parts else np.zeros((0, manifest.record_len))
