"""Measurements that run in their own process, so peak memory and imports are their own.

    python -m bench.measure prepare CONFIG WORKER_INDEX NUM_WORKERS
    python -m bench.measure ceiling TOKENIZER_JSON TEXT_FILE
Each prints one JSON line.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prepare(config_path: str, worker_index: int, num_workers: int) -> dict:
    from payload.config import load_config
    from payload.data import shards as records
    from payload.data.prepare import run_prepare

    config = load_config(config_path)
    started = time.perf_counter()
    run_prepare(config, worker_index=worker_index, num_workers=num_workers)
    elapsed = time.perf_counter() - started
    tokens = 0
    manifest_path = records.manifest_path(config.output_dir)
    import os

    if os.path.exists(manifest_path):
        manifest = records.load_manifest(config.output_dir)
        tokens = sum(s.tokens for s in manifest.splits.values())
    return {"seconds": elapsed, "tokens": tokens, "peak_rss_mb": _peak_mb()}


def ceiling(tokenizer_json: str, text_file: str) -> dict:
    """Raw batch-encoding throughput of the tokenizer over text already in memory."""
    from tokenizers import Tokenizer

    from payload.data.corpus import _BATCH_BYTES, _BATCH_DOCS

    tok = Tokenizer.from_file(tokenizer_json)
    with open(text_file, encoding="utf-8") as f:
        docs = [line.rstrip("\n") for line in f if line.strip()]
    batches, batch, size = [], [], 0
    for doc in docs:  # the same batch sizes prepare uses
        batch.append(doc)
        size += len(doc)
        if size >= _BATCH_BYTES or len(batch) >= _BATCH_DOCS:
            batches.append(batch)
            batch, size = [], 0
    if batch:
        batches.append(batch)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    started = time.perf_counter()
    tokens = 0
    for b in batches:
        tokens += sum(len(e.ids) for e in encode(b, add_special_tokens=False))
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "tokens": tokens, "peak_rss_mb": _peak_mb()}


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "prepare":
        out = prepare(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif what == "ceiling":
        out = ceiling(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown measurement {what}")
    print(json.dumps(out))
