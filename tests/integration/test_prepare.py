"""Stage `prepare`: shards that are complete, disjoint, resumable and checked."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from payload.core.errors import UserError
from payload.data import shards as records
from payload.data.prepare import encode_stream, in_validation
from tests.support.configs import base_config, write_config
from tests.support.prepared_shards import manifest_of, rows_of
from tests.support.runners import assert_user_error, payload_env, payload_main

FRACTION = 0.2


@pytest.fixture(scope="module")
def marked_corpus(tmp_path_factory, documents) -> Path:
    """Documents that each start with a unique marker word, so rows show where text came from."""
    path = tmp_path_factory.mktemp("marked") / "marked.txt"
    lines = [f"zq{i:04d}x " + " ".join(d.split()) for i, d in enumerate(documents[:700])]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, marked_corpus) -> Path:
    out = tmp_path_factory.mktemp("tok")
    config = base_config(out / "run", marked_corpus, tokenizer={"kind": "bpe", "vocab_size": 800})
    payload_main("tokenizer", "--config", str(write_config(out / "run.yaml", config)), check=True)
    return out / "run" / "tokenizer"


def prepared(tmp_path: Path, corpus, tokenizer_dir: Path, num_workers: int, *, name="run",
             **sections) -> Path:
    overrides = {"tokenizer": {"path": str(tokenizer_dir)},
                 "data": {"validation_fraction": FRACTION, "records_per_shard": 50}}
    for key, value in sections.items():
        overrides[key] = {**overrides.get(key, {}), **value}
    config = base_config(tmp_path / name, corpus, **overrides)
    config_path = write_config(tmp_path / f"{name}.yaml", config)
    payload_main("tokenizer", "--config", str(config_path), check=True)
    procs = [subprocess.Popen(
        [sys.executable, "-m", "payload", "prepare", "--config", str(config_path),
         "--worker-index", str(i), "--num-workers", str(num_workers)],
        env=payload_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(num_workers)]
    for proc in procs:
        _out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    return tmp_path / name






def test_one_and_three_workers_agree_up_to_the_tails(tmp_path, marked_corpus, tokenizer_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    docs = marked_corpus.read_text().splitlines()
    sep = tok.token_to_id("</s>")
    runs = {n: prepared(tmp_path, marked_corpus, tokenizer_dir, n, name=f"w{n}") for n in (1, 3)}
    for split in records.SPLITS:
        wanted = [d for d in docs if in_validation(d, FRACTION) == (split == "validation")]
        stream = Counter(encode_stream(tok, wanted, sep).tolist())
        for n, run in runs.items():
            rows = rows_of(run, split)
            assert rows.shape[1] == 32
            assert (rows[:, 0] == tok.token_to_id("<s>")).all()  # RoBERTa rows start with <s>
            got = Counter(rows[:, 1:].ravel().tolist())
            assert not got - stream, "rows hold tokens that are not in the corpus"
            dropped = sum((stream - got).values())
            assert dropped < n * 31, (split, n, dropped)  # under one row per worker
    m1, m3 = manifest_of(runs[1]), manifest_of(runs[3])
    assert m1.documents == m3.documents == len(docs)
    assert m3.num_workers == 3 and len({e.name.split("-")[1] for e in
                                        m3.splits["train"].shards}) == 3


def test_validation_and_train_are_disjoint(tmp_path, marked_corpus, tokenizer_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    run = prepared(tmp_path, marked_corpus, tokenizer_dir, 2)
    found = {}
    for split in records.SPLITS:
        text = tok.decode(rows_of(run, split).ravel().tolist(), skip_special_tokens=False)
        found[split] = set(re.findall(r"zq\d{4}x", text))
    assert found["validation"] and found["train"]
    assert not found["validation"] & found["train"]
    share = len(found["validation"]) / (len(found["validation"]) + len(found["train"]))
    assert 0.1 < share < 0.3


def test_manifest_matches_the_files(tmp_path, marked_corpus, tokenizer_dir):
    run = prepared(tmp_path, marked_corpus, tokenizer_dir, 2)
    manifest = manifest_of(run)
    records.verify_shards(str(run), manifest)
    on_disk = sorted(str(p.relative_to(run / "data")) for p in (run / "data").rglob("*.tfrecord"))
    listed = sorted(e.name for s in records.SPLITS for e in manifest.splits[s].shards)
    assert on_disk == listed
    for split in records.SPLITS:
        summary = manifest.splits[split]
        assert summary.records == sum(e.records for e in summary.shards)
        assert all(e.records <= 50 for e in summary.shards)
    assert manifest.tokenizer_fingerprint and manifest.seq_len == 32
    assert not list(run.rglob(".tmp-*"))
    assert (run / "config.yaml").is_file()
    # A rerun of a finished prepare changes nothing.
    before = (run / "data" / "manifest.json").read_bytes()
    proc = payload_main("prepare", "--config", str(tmp_path / "run.yaml"), "--worker-index", "0",
                       "--num-workers", "2", check=True)
    assert "nothing to do" in proc.stdout
    assert (run / "data" / "manifest.json").read_bytes() == before


def test_a_corrupted_shard_is_caught(tmp_path, marked_corpus, tokenizer_dir):
    run = prepared(tmp_path, marked_corpus, tokenizer_dir, 1)
    manifest = manifest_of(run)
    victim = run / "data" / manifest.splits["train"].shards[1].name
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(UserError, match=manifest.splits["train"].shards[1].name):
        records.verify_shards(str(run), manifest)
    with pytest.raises(ValueError, match="checksum"):
        records.iter_rows(bytes(data), dtype=manifest.dtype)


def test_sigkilled_prepare_recovers_on_rerun(tmp_path, documents, tokenizer_dir):
    big = tmp_path / "big.txt"
    lines = [" ".join(d.split()) for d in documents]
    with big.open("w") as f:
        for copy in range(8):
            f.write("\n".join(f"c{copy} {line}" for line in lines) + "\n")
    sections = {"data": {"records_per_shard": 40}}
    clean = prepared(tmp_path, big, tokenizer_dir, 1, name="clean", **sections)
    config = base_config(tmp_path / "killed", big, tokenizer={"path": str(tokenizer_dir)},
                         data={"validation_fraction": FRACTION, "records_per_shard": 40})
    config_path = write_config(tmp_path / "killed.yaml", config)
    payload_main("tokenizer", "--config", str(config_path), check=True)
    parts = tmp_path / "killed" / "data" / "parts"
    for _attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-m", "payload", "prepare", "--config",
                                 str(config_path)], env=payload_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if parts.is_dir() and len(list(parts.glob("train-*.json"))) >= 5 + 10 * _attempt:
                break
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (tmp_path / "killed" / "data" / "manifest.json").exists(), "killed too late"
    payload_main("prepare", "--config", str(config_path), check=True)
    assert (tmp_path / "killed" / "data" / "manifest.json").is_file()
    got, want = manifest_of(tmp_path / "killed"), manifest_of(clean)
    assert [(e.name, e.sha256) for e in got.splits["train"].shards] == [
        (e.name, e.sha256) for e in want.splits["train"].shards]
    assert got.splits == want.splits and got.documents == want.documents
    assert not list((tmp_path / "killed").rglob(".tmp-*"))


def test_a_different_tokenizer_or_seq_len_is_refused(tmp_path, marked_corpus, tokenizer_dir):
    run = prepared(tmp_path, marked_corpus, tokenizer_dir, 1)
    config = base_config(run, marked_corpus, tokenizer={"kind": "wordpiece", "vocab_size": 500},
                         data={"validation_fraction": FRACTION, "records_per_shard": 50})
    path = write_config(tmp_path / "other.yaml", config)
    # The tokenizer the shards were made with is replaced only when asked (issue 8).
    assert_user_error(payload_main("tokenizer", "--config", path),
                      "would be replaced", "shards", "--overwrite")
    payload_main("tokenizer", "--config", path, "--overwrite", check=True)
    proc = payload_main("prepare", "--config", path)
    assert_user_error(proc, "different tokenizer", "--overwrite")
    payload_main("prepare", "--config", path, "--overwrite", check=True)
    manifest = manifest_of(run)
    on_disk = sorted(str(p.relative_to(run / "data")) for p in (run / "data").rglob("*.tfrecord"))
    assert on_disk == sorted(e.name for s in records.SPLITS for e in manifest.splits[s].shards)
    config["data"]["seq_len"] = 48
    path = write_config(tmp_path / "longer.yaml", config)
    assert_user_error(payload_main("prepare", "--config", path), "seq_len 32")
    config["data"]["seq_len"] = 32
    path = write_config(tmp_path / "more-workers.yaml", config)
    # Prepared data serves any worker count (payload.data.reader): nothing is prepared again.
    proc = payload_main("prepare", "--config", path, "--worker-index", "0", "--num-workers",
                       "2")
    assert proc.returncode == 0 and "serves any worker count" in proc.stdout, proc.stdout
    assert manifest_of(run) == manifest


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_disk_that_fills_leaves_no_partial_shard(tmp_path, documents, tokenizer_dir):
    big = tmp_path / "big.txt"
    big.write_text("\n".join(" ".join(d.split()) for d in documents) + "\n")
    disk = tmp_path / "disk"
    mounted = _mount_tmpfs(disk, "400k")
    try:
        config = base_config(disk / "run", big, tokenizer={"path": str(tokenizer_dir)},
                             data={"records_per_shard": 100_000})
        path = write_config(tmp_path / "run.yaml", config)
        payload_main("tokenizer", "--config", path, check=True)
        if mounted:
            proc = payload_main("prepare", "--config", path)
        else:  # no mount rights: a file-size limit gives the same EFBIG/ENOSPC path
            def limit():
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
            proc = subprocess.run([sys.executable, "-m", "payload", "prepare", "--config",
                                   str(path)], env=payload_env(), capture_output=True, text=True,
                                  preexec_fn=limit)
        assert_user_error(proc, "no space left", "free space")
        data = disk / "run" / "data"
        assert not list(data.rglob("*.tfrecord")), "a partial shard is visible"
        assert not list(data.rglob(".tmp-*")), "a temporary file was left behind"
        assert not (data / "manifest.json").exists()
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=False)


def test_records_parse_in_tensorflow(tmp_path, marked_corpus, tokenizer_dir):
    import tensorflow as tf

    run = prepared(tmp_path, marked_corpus, tokenizer_dir, 1)
    manifest = manifest_of(run)
    files = [str(run / "data" / e.name) for e in manifest.splits["train"].shards]
    ds = tf.data.TFRecordDataset(files).batch(16).map(
        lambda serialized: records.decode_batch(serialized, record_len=manifest.record_len,
                                                dtype=manifest.dtype))
    got = np.concatenate([b.numpy() for b in ds])
    want = rows_of(run, "train")
    assert got.dtype == np.int32 and got.shape[1] == manifest.record_len
    np.testing.assert_array_equal(got, want[:len(got)])
    for raw in tf.data.TFRecordDataset(files[:1]).take(1):
        example = tf.train.Example.FromString(raw.numpy())
        assert list(example.features.feature) == [records.FEATURE]
    assert json.loads((run / "data" / "manifest.json").read_text())["format"] == records.FORMAT
