"""Benchmark of the neutral reader (payload.data.stream) on a large synthetic manifest, in one run:
resume time at step 0, 10k and 100k (the first batch of a resumed run: flat, nothing replayed),
and batches/s of one host against tpuctl's former tf.data pipeline (bench/tfdata_pipeline.py)
over the same shards, both giving raw ids (no objective) and the reader also with masking.

    python -m bench --only reader [--quick]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from payload.data import shards
from payload.data.objectives import CausalLM, MaskedLM
from payload.data.reader import Reader
from payload.data.stream import Segment, TrainStream

WORK = Path(__file__).resolve().parent / ".work" / "reader"
RECORD_LEN, BATCH, VOCAB = 128, 256, 32000


def synthetic_manifest(folder: Path, num_shards: int, records: int) -> shards.Manifest:
    """`num_shards` shards of `records` random rows each (written once, kept in bench/.work)."""
    folder.joinpath("train").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    entries = []
    for k in range(num_shards):
        name = f"train/train-w00000of00001-{k:05d}.tfrecord"
        path = folder / name
        if not path.exists():
            rows = rng.integers(5, VOCAB, size=(records, RECORD_LEN), dtype=np.int64)
            with open(path, "wb") as out:
                shards.ShardWriter(out, dtype="uint16").write_rows(rows)
        entries.append(shards.ShardEntry(name, records, records * RECORD_LEN,
                                         path.stat().st_size, ""))
    return shards.Manifest(
        format=shards.FORMAT, seq_len=RECORD_LEN, record_len=RECORD_LEN, dtype="uint16",
        family="gpt2", vocab_size=VOCAB, tokenizer_fingerprint="", data_fingerprint="bench",
        num_workers=1, documents=0, invalid_utf8_lines=0,
        splits={"train": shards.SplitSummary(shards=entries, records=num_shards * records)})


def _stream(manifest, folder: Path, objective) -> TrainStream:
    segment = Segment(step=0, consumed={"": 0}, batch_size=BATCH, weights={"": 1.0}, seed=0,
                      data="bench")
    return TrainStream(Reader.of(manifest, str(folder), "train"), [segment], objective, 0)


def resume_seconds(manifest, folder: Path, step: int) -> float:
    """From nothing to the first batch of a run resumed at `step` (best of three)."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        stream = _stream(manifest, folder, CausalLM(pad_id=0))
        next(stream.host_batches(step, 0, 1))
        times.append(time.perf_counter() - started)
    return min(times)


def reader_rate(manifest, folder: Path, objective, batches: int) -> float:
    stream = _stream(manifest, folder, objective)
    it = stream.host_batches(1000, 0, 1)
    next(it)
    started = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches / (time.perf_counter() - started)


def tfdata_rate(manifest, folder: Path, batches: int, start_batch: int = 0) -> tuple[float, float]:
    """(batches/s, seconds to the first batch at `start_batch`) of the former pipeline."""
    from bench.tfdata_pipeline import input_pipeline

    files = [str(folder / e.name) for e in manifest.splits["train"].shards]
    started = time.perf_counter()
    ds = input_pipeline(files, record_len=RECORD_LEN, dtype="uint16", batch_size=BATCH,
                        objective=lambda ids, seed: {"input_ids": ids}, seed=0,
                        start_batch=start_batch)
    it = iter(ds)
    next(it)
    first = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches / (time.perf_counter() - started), first


def run(results: dict, quick: bool = False) -> dict:
    num_shards, records = (8, 20_000) if quick else (64, 50_000)
    folder = WORK / f"{num_shards}x{records}"
    manifest = synthetic_manifest(folder, num_shards, records)
    batches = 50 if quick else 300
    masker = MaskedLM(seq_len=RECORD_LEN, vocab_size=VOCAB, special_ids=(0, 1, 2, 3, 4),
                      mask_id=4, pad_id=1)
    figures = {
        "records": num_shards * records, "record_len": RECORD_LEN, "global_batch": BATCH,
        "resume_s": {str(step): resume_seconds(manifest, folder, step)
                     for step in (0, 10_000, 100_000)},
        "reader_batches_per_s": reader_rate(manifest, folder, CausalLM(pad_id=0), batches),
        "reader_masked_batches_per_s": reader_rate(manifest, folder, masker, batches),
    }
    try:
        rate, first = tfdata_rate(manifest, folder, batches)
        _, first_at_1k = tfdata_rate(manifest, folder, 1, start_batch=1000)
        figures.update(tfdata_batches_per_s=rate, tfdata_first_batch_s=first,
                       tfdata_resume_at_1k_s=first_at_1k)
    except ImportError:
        figures["tfdata_batches_per_s"] = None
    resume = figures["resume_s"]
    figures["resume_100k_vs_0"] = resume["100000"] / resume["0"]
    results["reader"] = figures
    print(f"\nreader on {figures['records']:,} records of {RECORD_LEN} tokens, batch {BATCH}")
    for step, seconds in resume.items():
        print(f"  resume at step {int(step):>7,}: first batch in {seconds * 1000:.1f} ms")
    print(f"  resume 100k / resume 0: {figures['resume_100k_vs_0']:.2f}x (target <= 2x)")
    print(f"  batches/s, one host: reader {figures['reader_batches_per_s']:.0f} raw, "
          f"{figures['reader_masked_batches_per_s']:.0f} masked (MLM)")
    if figures.get("tfdata_batches_per_s"):
        print(f"  former tf.data pipeline: {figures['tfdata_batches_per_s']:.0f} raw batches/s; "
              f"resume at step 1,000: {figures['tfdata_resume_at_1k_s']:.1f} s "
              f"(step 0: {figures['tfdata_first_batch_s']:.1f} s)")
    return figures
