"""TensorFlow's own gs:// filesystem, for real, inside the Cloud Storage sandbox (testbed/fakes/gcs.py),
and google-cloud-storage seeing the same bucket from outside it."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import time

import pytest

from tests.support.runners import payload_env

BUCKET = "tf-checks"
BIG = hashlib.sha256(b"seed").digest() * (3 * 1024 * 1024 // 32)  # 3 MiB, not one upload chunk

# Everything runs in one process: TensorFlow takes seconds to import.
TF_CHECKS = r"""
import json, sys
import numpy as np
import tensorflow as tf

B = sys.argv[1]
gfile = tf.io.gfile
out = {}
out["client_read"] = gfile.GFile(f"{B}/from-client/a.txt").read()
out["client_glob"] = gfile.glob(f"{B}/from-client/*.txt")
with gfile.GFile(f"{B}/tf/hello.txt", "w") as f:
    f.write("hello from tensorflow\n")
with gfile.GFile(f"{B}/tf/big.bin", "wb") as f:
    f.write(open(sys.argv[2], "rb").read())
gfile.makedirs(f"{B}/tf/empty/sub")
out["exists"] = [gfile.exists(f"{B}/tf/hello.txt"), gfile.exists(f"{B}/tf/missing.txt"),
                 gfile.exists(f"{B}/tf/empty/sub")]
out["isdir"] = [gfile.isdir(f"{B}/tf/empty"), gfile.isdir(f"{B}/tf/hello.txt")]
out["size"] = gfile.stat(f"{B}/tf/hello.txt").length
with gfile.GFile(f"{B}/tf/old.txt", "w") as f:
    f.write("renamed")
gfile.rename(f"{B}/tf/old.txt", f"{B}/tf/new.txt")
out["renamed"] = [gfile.exists(f"{B}/tf/old.txt"), gfile.GFile(f"{B}/tf/new.txt").read()]
gfile.rename(f"{B}/tf/new.txt", f"{B}/tf/hello.txt", overwrite=True)
out["overwritten"] = gfile.GFile(f"{B}/tf/hello.txt").read()
with gfile.GFile(f"{B}/tf/hello.txt", "w") as f:
    f.write("hello from tensorflow\n")
with gfile.GFile(f"{B}/tf/gone.txt", "w") as f:
    f.write("x")
gfile.remove(f"{B}/tf/gone.txt")
out["listdir"] = sorted(gfile.listdir(f"{B}/tf"))
out["walk"] = [(top, sorted(dirs), sorted(files)) for top, dirs, files in gfile.walk(f"{B}/tf")]
f = gfile.GFile(f"{B}/tf/big.bin", "rb")
f.seek(1_000_000)
out["seek_read"] = f.read(64).hex()

with tf.io.TFRecordWriter(f"{B}/records/r.tfrecord") as w:
    for i in range(500):
        w.write(f"record {i}".encode())
got = [r.numpy().decode() for r in tf.data.TFRecordDataset([f"{B}/records/r.tfrecord"])]
out["records"] = got == [f"record {i}" for i in range(500)]
out["records_interleaved"] = sorted(
    r.numpy().decode() for r in tf.data.Dataset.from_tensor_slices(
        gfile.glob(f"{B}/from-client/*.tfrecord")).interleave(
        tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE))

v, step = tf.Variable(np.zeros(8, np.float32)), tf.Variable(0, dtype=tf.int64)
manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v, step=step), f"{B}/ckpt",
                                     max_to_keep=2, checkpoint_name="ckpt")
for s in range(1, 5):
    v.assign(np.full(8, s, np.float32))
    step.assign(s)
    manager.save(checkpoint_number=s)
out["ckpt_kept"] = manager.checkpoints
out["ckpt_latest"] = tf.train.latest_checkpoint(f"{B}/ckpt")
fresh = tf.train.Checkpoint(v=tf.Variable(np.zeros(8, np.float32)),
                            step=tf.Variable(0, dtype=tf.int64))
fresh.restore(out["ckpt_latest"]).assert_existing_objects_matched()
out["restored"] = [fresh.v.numpy().tolist(), int(fresh.step.numpy())]
again = tf.train.CheckpointManager(tf.train.Checkpoint(v=v, step=step), f"{B}/ckpt",
                                   max_to_keep=2, checkpoint_name="ckpt")
out["ckpt_reopened"] = again.checkpoints

writer = tf.summary.create_file_writer(f"{B}/logs/run")
with writer.as_default():
    for s in range(3):
        tf.summary.scalar("loss", 1.0 / (s + 1), step=s)
writer.flush()
writer.close()
scalars = []
for raw in tf.data.TFRecordDataset(gfile.glob(f"{B}/logs/run/events.out.tfevents.*")):
    event = tf.compat.v1.Event.FromString(raw.numpy())
    for value in event.summary.value:
        scalars.append([int(event.step), value.tag, float(tf.make_ndarray(value.tensor))])
out["scalars"] = scalars
gfile.rmtree(f"{B}/tf/empty")
out["rmtree"] = gfile.exists(f"{B}/tf/empty")
print("RESULT " + json.dumps(out))
"""


def _tfrecord(payloads: list[bytes]) -> bytes:
    """TFRecord framing, written by hand: length, its CRC, the data, its CRC."""
    from payload.data.shards import _masked_crc

    out = b""
    for data in payloads:
        header = struct.pack("<Q", len(data))
        out += header + struct.pack("<I", _masked_crc(header)) + data
        out += struct.pack("<I", _masked_crc(data))
    return out


@pytest.fixture(scope="module")
def tf_results(gcs_sandbox, tmp_path_factory):
    sandbox = gcs_sandbox
    sandbox.make_bucket(BUCKET)
    sandbox.write_bytes(f"gs://{BUCKET}/from-client/a.txt", b"written by google-cloud-storage")
    sandbox.write_bytes(f"gs://{BUCKET}/from-client/b.txt", b"b")
    sandbox.write_bytes(f"gs://{BUCKET}/from-client/c.bin", b"not a match")
    for i in range(2):
        sandbox.write_bytes(f"gs://{BUCKET}/from-client/part-{i}.tfrecord",
                            _tfrecord([f"client {i} {j}".encode() for j in range(3)]))
    big = tmp_path_factory.mktemp("tf") / "big.bin"
    big.write_bytes(BIG)
    began = time.monotonic()
    proc = sandbox.run([sys.executable, "-c", TF_CHECKS, f"gs://{BUCKET}", str(big)],
                       env=payload_env(), timeout=240, check=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    print(f"TensorFlow checks in the sandbox: {time.monotonic() - began:.1f}s")
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_tensorflow_reads_what_google_cloud_storage_wrote(tf_results):
    assert tf_results["client_read"] == "written by google-cloud-storage"
    assert sorted(tf_results["client_glob"]) == [
        f"gs://{BUCKET}/from-client/a.txt", f"gs://{BUCKET}/from-client/b.txt"]
    assert tf_results["records_interleaved"] == sorted(
        f"client {i} {j}" for i in range(2) for j in range(3))


def test_gfile_operations(tf_results, gcs_sandbox):
    r = tf_results
    assert r["exists"] == [True, False, True]
    assert r["isdir"] == [True, False]
    assert r["size"] == len("hello from tensorflow\n")
    assert r["renamed"] == [False, "renamed"]
    assert r["overwritten"] == "renamed"
    assert r["listdir"] == ["big.bin", "empty/", "hello.txt"]  # before the rmtree
    assert r["seek_read"] == BIG[1_000_000:1_000_064].hex()
    assert r["rmtree"] is False
    assert r["walk"] == [[f"gs://{BUCKET}/tf", ["empty/"], ["big.bin", "hello.txt"]],
                         [f"gs://{BUCKET}/tf/empty/", ["sub/"], []],
                         [f"gs://{BUCKET}/tf/empty/sub/", [], []]]
    # google-cloud-storage sees TensorFlow's objects, byte for byte.
    assert gcs_sandbox.read_bytes(f"gs://{BUCKET}/tf/hello.txt") == b"hello from tensorflow\n"
    assert hashlib.sha256(gcs_sandbox.read_bytes(f"gs://{BUCKET}/tf/big.bin")).digest() == \
        hashlib.sha256(BIG).digest()
    names = gcs_sandbox.list(f"gs://{BUCKET}/tf/")
    assert f"gs://{BUCKET}/tf/old.txt" not in names and f"gs://{BUCKET}/tf/gone.txt" not in names
    assert not [n for n in names if n.startswith(f"gs://{BUCKET}/tf/empty")]


def test_tfrecords_written_by_tensorflow_read_back(tf_results, gcs_sandbox):
    assert tf_results["records"] is True
    raw = gcs_sandbox.read_bytes(f"gs://{BUCKET}/records/r.tfrecord")
    assert raw == _tfrecord([f"record {i}".encode() for i in range(500)])


def test_checkpoint_manager_keeps_deletes_and_restores(tf_results, gcs_sandbox):
    r = tf_results
    ckpt = f"gs://{BUCKET}/ckpt"
    assert r["ckpt_kept"] == [f"{ckpt}/ckpt-3", f"{ckpt}/ckpt-4"]
    assert r["ckpt_reopened"] == r["ckpt_kept"]
    assert r["ckpt_latest"] == f"{ckpt}/ckpt-4"
    assert r["restored"] == [[4.0] * 8, 4]
    names = [os.path.basename(n) for n in gcs_sandbox.list(f"{ckpt}/")]
    assert not [n for n in names if n.startswith(("ckpt-1.", "ckpt-2."))], names
    assert {"ckpt-3.index", "ckpt-4.index", "checkpoint"} <= set(names)
    index = gcs_sandbox.read_bytes(f"{ckpt}/checkpoint").decode()
    assert 'model_checkpoint_path: "ckpt-4"' in index


def test_summary_writer_events(tf_results, gcs_sandbox):
    assert tf_results["scalars"] == [[0, "loss", 1.0], [1, "loss", 0.5],
                                     [2, "loss", pytest.approx(1 / 3)]]
    events = gcs_sandbox.list(f"gs://{BUCKET}/logs/run/events.out.tfevents.")
    assert len(events) == 1
