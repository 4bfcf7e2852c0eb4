"""TensorBoard's event files, written without a framework: each event a TFRecord (framed by
payload.data.shards.framed) holding an `Event` protocol buffer encoded here.

    writer = EventWriter(layout.join(out, layout.LOGS_DIR, layout.TENSORBOARD_DIR))
    writer.scalars(50, {"train/loss": 7.6, "train/learning_rate": 8.4e-4})
    writer.flush()

The training core's metrics sink owns one, whichever engine trains, so a host needs neither
TensorFlow nor tensorboard to write them. A scalar is an `Event{wall_time, step,
summary{value{tag, simple_value}}}`; the file starts with `Event{wall_time,
file_version: "brain.Event:2"}`, as TensorBoard expects. The file is kept whole in memory and
written whole through payload.core.storage (local or gs://, where an object cannot be appended
to) at most every FLUSH_S seconds and at `flush`; past MAX_FILE_BYTES the next events go to a
new file, which TensorBoard reads beside the first.
"""

from __future__ import annotations

import os
import socket
import struct
import time

from payload.core import layout, storage
from payload.data.shards import framed, varint

FLUSH_S = 60.0
MAX_FILE_BYTES = 4 << 20
FILE_VERSION = b"brain.Event:2"


def _field(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2) + varint(len(data)) + data


def event_record(*, wall_time: float, step: int = 0, scalars: dict[str, float] | None = None,
                 file_version: bytes | None = None) -> bytes:
    """An `Event` as TensorBoard's proto serializes it (tensorboard/compat/proto/event.proto:
    wall_time 1 double, step 2 int64, file_version 3 string, summary 5; summary.proto's Summary:
    value 1; Summary.Value: tag 1 string, simple_value 2 float)."""
    out = _field(1, 1) + struct.pack("<d", wall_time)
    if step:
        out += _field(2, 0) + varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version)
    if scalars:
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5)
                         + struct.pack("<f", float(value)))
            for tag, value in scalars.items())
        out += _bytes_field(5, values)
    return out


class EventWriter:
    """Scalars into event files under `folder`, local or gs://."""

    def __init__(self, folder: str, *, clock=time.time):
        self._folder, self._clock = folder, clock
        self._files = 0
        self._start_file()

    def _start_file(self) -> None:
        now = self._clock()
        self._path = layout.join(
            self._folder, f"events.out.tfevents.{int(now)}.{socket.gethostname()}."
                          f"{os.getpid()}.{self._files}.v2")
        self._files += 1
        self._data = bytearray(framed(event_record(wall_time=now, file_version=FILE_VERSION)))
        self._written_at = None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        now = self._clock()
        self._data += framed(event_record(wall_time=now, step=step, scalars=values))
        if self._written_at is None or now - self._written_at >= FLUSH_S:
            self.flush()

    def flush(self) -> None:
        storage.write_bytes(self._path, bytes(self._data))
        self._written_at = self._clock()
        if len(self._data) >= MAX_FILE_BYTES:
            self._start_file()
