"""TensorBoard's event files as payload.data.events writes them without a framework: TFRecords
(the shard format's framing, CRCs checked by the shard reader's rule) of Events that
TensorBoard's own protocol buffers parse, written whole at the first scalar, at most every
FLUSH_S after, at flush, and a new file once one is MAX_FILE_BYTES."""

from __future__ import annotations

import struct

import google_crc32c
import pytest

from payload.data import events
from payload.data.events import EventWriter

# TensorBoard's own protocol buffers (tensorboard comes with TensorFlow; it needs none).
event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")


def records(path) -> list:
    data, out, pos = path.read_bytes(), [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        body = data[pos + 12:pos + 12 + length]
        for part, crc_at in ((data[pos:pos + 8], pos + 8), (body, pos + 12 + length)):
            crc = google_crc32c.value(part)
            masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
            assert struct.unpack("<I", data[crc_at:crc_at + 4])[0] == masked
        out.append(event_pb2.Event.FromString(body))
        pos += 16 + length
    return out


class Clock:
    def __init__(self):
        self.now = 1_795_000_000.25

    def __call__(self):
        return self.now


def test_scalars_are_events_tensorboard_parses(tmp_path):
    clock = Clock()
    writer = EventWriter(str(tmp_path), clock=clock)
    writer.scalars(0, {"eval/loss": 7.5})
    clock.now += 1
    writer.scalars(300, {"train/loss": 6.25, "train/learning_rate": 1e-3})
    writer.flush()
    (path,) = tmp_path.glob("events.out.tfevents.1795000000.*.v2")
    first, *scalars = records(path)
    assert first.file_version == "brain.Event:2" and first.wall_time == 1_795_000_000.25
    assert [(e.step, e.wall_time, [(v.tag, v.simple_value) for v in e.summary.value])
            for e in scalars] == [
        (0, 1_795_000_000.25, [("eval/loss", 7.5)]),
        (300, 1_795_000_001.25, [("train/loss", 6.25),
                                 ("train/learning_rate", pytest.approx(1e-3))])]


def test_written_at_the_first_scalar_then_at_most_every_flush_s(tmp_path):
    clock = Clock()
    writer = EventWriter(str(tmp_path), clock=clock)
    assert not list(tmp_path.iterdir())  # nothing written before training says anything
    writer.scalars(1, {"train/loss": 1.0})
    (path,) = tmp_path.iterdir()
    assert len(records(path)) == 2
    clock.now += events.FLUSH_S - 1
    writer.scalars(2, {"train/loss": 0.5})
    assert len(records(path)) == 2  # held in memory
    clock.now += 1
    writer.scalars(3, {"train/loss": 0.25})
    assert [e.step for e in records(path)] == [0, 1, 2, 3]


def test_a_full_file_gives_way_to_a_new_one(tmp_path, monkeypatch):
    monkeypatch.setattr(events, "MAX_FILE_BYTES", 200)
    clock = Clock()
    writer = EventWriter(str(tmp_path), clock=clock)
    for step in range(1, 11):
        writer.scalars(step, {"train/loss": 1.0 / step})
        writer.flush()
    files = sorted(tmp_path.iterdir(), key=lambda p: int(p.name.split(".")[-2]))
    assert len(files) > 1
    steps = [e.step for path in files for e in records(path) if e.summary.value]
    assert steps == list(range(1, 11))  # every scalar once, in order, across the files
    assert all(records(path)[0].file_version == "brain.Event:2" for path in files)
