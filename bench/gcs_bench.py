"""Benchmark of the pipeline on gs:// against the same run on local disk, in one run.

Figures (both sides in the same sandbox, same corpus, tokenizer and cores):
- prepare: shards written per second with output_dir on local disk and on gs://;
- checkpoint save: seconds per TensorFlow CheckpointManager save of a ~40 MB model state.

The gs:// side is a LOCAL FAKE of Cloud Storage (testbed/fakes/gcs.py: fake-gcs-server behind a
TLS front, TensorFlow's own GCS filesystem and google-cloud-storage talking to it over
loopback), not Google Cloud Storage: the ratio shows what tpuctl's gs:// code paths cost
(requests, uploads, no rename), not the network to Google.
"""

from __future__ import annotations

import json
import shutil
import sys
import time

import yaml

from bench import runner
from bench.corpora import WORK, corpus_of_size

REPO = runner.REPO
BUCKET = "bench-bucket"
RECORDS_PER_SHARD = 500
CHECKPOINT_MB = 40

SAVE_SCRIPT = """\
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
folder, saves, megabytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
values = [tf.Variable(tf.random.uniform([256, 1024])) for _ in range(megabytes)]
manager = tf.train.CheckpointManager(tf.train.Checkpoint(values=values), folder, max_to_keep=2)
times = []
for step in range(saves):
    began = time.perf_counter()
    manager.save(checkpoint_number=step)
    times.append(time.perf_counter() - began)
print(json.dumps({"save_s": sorted(times)[len(times) // 2]}))
"""


def _prepare_config(out: str, corpus: str, tokenizer: str, path) -> str:
    path.write_text(yaml.safe_dump({
        "name": "gcsbench", "output_dir": out,
        "data": {"corpus": [corpus], "seq_len": 128, "validation_fraction": 0.0,
                 "records_per_shard": RECORDS_PER_SHARD},
        "tokenizer": {"path": tokenizer}, "model": {"family": "roberta"},
        "train": {"steps": 1, "batch_size": 1, "learning_rate": 1e-3}}))
    return str(path)


def _timed(sandbox, argv: list[str]) -> float:
    began = time.perf_counter()
    sandbox.run(argv, env=runner.env(), cwd=str(REPO), check=True, timeout=1800)
    return time.perf_counter() - began


def _shards(sandbox, out: str) -> int:
    listing = sandbox.run([sys.executable, "-c", (
        "import json, sys; from payload.data import shards as records; "
        "print(len(records.load_manifest(sys.argv[1]).splits['train'].shards))"), out],
        env=runner.env(), cwd=str(REPO), check=True, timeout=300)
    return int(listing.stdout.strip().splitlines()[-1])


def run(results: dict, quick: bool) -> None:
    from testbed.fakes.gcs import GcsSandbox, SandboxUnavailable

    figures: dict = {"note": "gs:// is a local fake of Cloud Storage, not Google's"}
    try:
        sandbox = GcsSandbox().__enter__()
    except SandboxUnavailable as exc:
        figures["skipped"] = str(exc)
        results["gcs"] = figures
        print(f"\ngs:// pipeline: skipped ({exc})")
        return
    try:
        sandbox.make_bucket(BUCKET)
        work = WORK / "gcs"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        corpus = corpus_of_size(3 if quick else 10)
        (work / "t.yaml").write_text(yaml.safe_dump({
            "name": "gcsbench", "output_dir": str(work / "tok"),
            "data": {"corpus": [str(corpus)], "seq_len": 128},
            "tokenizer": {"kind": "bpe", "vocab_size": 8000}, "model": {"family": "roberta"},
            "train": {"steps": 1, "batch_size": 1, "learning_rate": 1e-3}}))
        runner.run_python(["-m", "payload", "tokenizer", "--config", str(work / "t.yaml")])
        tokenizer = str(work / "tok" / "tokenizer")
        for side, out in (("local", str(work / "local-run")), ("gcs", f"gs://{BUCKET}/run")):
            config = _prepare_config(out, str(corpus), tokenizer, work / f"{side}.yaml")
            seconds = _timed(sandbox, [sys.executable, "-m", "payload", "prepare", "--config",
                                       config])
            shards = _shards(sandbox, out)
            figures[f"prepare_{side}"] = {"seconds": seconds, "shards": shards,
                                          "shards_per_s": shards / seconds}
            saves = sandbox.run([sys.executable, "-c", SAVE_SCRIPT,
                                 out.rstrip("/") + "/bench-checkpoints", "3" if quick else "5",
                                 str(CHECKPOINT_MB)], env=runner.env(), cwd=str(REPO),
                                check=True, timeout=1800)
            figures[f"checkpoint_{side}_s"] = json.loads(
                saves.stdout.strip().splitlines()[-1])["save_s"]
        figures["prepare_gcs_over_local"] = (figures["prepare_gcs"]["shards_per_s"]
                                             / figures["prepare_local"]["shards_per_s"])
        figures["checkpoint_gcs_over_local"] = (figures["checkpoint_gcs_s"]
                                                / figures["checkpoint_local_s"])
    finally:
        sandbox.__exit__(None, None, None)
    results["gcs"] = figures
    _print(figures)


def _print(figures: dict) -> None:
    print(f"\npipeline on gs:// vs local disk ({figures['note']})")
    for side in ("local", "gcs"):
        p = figures[f"prepare_{side}"]
        print(f"  prepare, {side:<5} {p['shards']:4d} shards in {p['seconds']:6.1f} s: "
              f"{p['shards_per_s']:6.2f} shards/s")
    print(f"  prepare shards/s, gs:// / local: {figures['prepare_gcs_over_local']:.2f}x")
    print(f"  checkpoint save ({CHECKPOINT_MB} MB): local {figures['checkpoint_local_s']:.2f} s, "
          f"gs:// {figures['checkpoint_gcs_s']:.2f} s "
          f"({figures['checkpoint_gcs_over_local']:.2f}x)")
