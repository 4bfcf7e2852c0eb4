"""The shard format: file names, the record layout, its writer and its reader, the manifest.

    writer = ShardWriter(open(path, "wb"), dtype="uint16"); writer.write_rows(rows)  # prepare
    ids = decode_batch(serialized_batch, record_len=128, dtype="uint16")  # train, in tf.data

A record is a `tf.train.Example` with one bytes feature, `ids`: the row's token ids as
little-endian uint16 (vocabularies up to 65,536) or int32. One bytes feature is ~5x faster to
write than an int64 list and makes smaller files, and batch-then-parse reads it several times
faster than parse-then-batch. The writer frames TFRecords itself (no TensorFlow import on
the preparing side); the decoder runs in tf.data (payload/data/pipeline.py reads the files). This module
is the only writer and the only decoder.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import asdict, dataclass, field
from typing import IO

import google_crc32c
import numpy as np

from payload.core import layout, reading, storage
from payload.core.errors import UserError

FEATURE = "ids"
FORMAT = "tpuctl-shards/1"
SPLITS = ("train", "validation")
MANIFEST = layout.MANIFEST


def dtype_for_vocab(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "int32"


def worker_tag(worker_index: int, num_workers: int) -> str:
    """`w00001of00003`: marks the shards and receipts one worker of one worker count writes."""
    return f"w{worker_index:05d}of{num_workers:05d}"


def shard_name(split: str, worker_index: int, num_workers: int, shard_index: int) -> str:
    """`train/train-w00001of00003-00042.tfrecord`, relative to `output_dir/data`."""
    return f"{split}/{split}-{worker_tag(worker_index, num_workers)}-{shard_index:05d}.tfrecord"


def shard_receipt_name(split: str, worker_index: int, num_workers: int, shard_index: int) -> str:
    """The sentinel written after a shard is in place: its manifest entry and resume point."""
    return f"parts/{split}-{worker_tag(worker_index, num_workers)}-{shard_index:05d}.json"


def worker_part_name(worker_index: int, num_workers: int) -> str:
    return f"parts/worker-{worker_index:05d}of{num_workers:05d}.json"


_PREPARED = re.compile(
    r"^(?:(?P<split>train|validation)/(?P=split)-w\d{5}of\d{5}-\d{5}\.tfrecord"
    r"|parts/(?:train|validation)-w\d{5}of\d{5}-\d{5}\.json"
    r"|parts/worker-\d{5}of\d{5}\.json)\Z"
)


def written_by_prepare(relative: str) -> bool:
    """Whether a path under data/ is one prepare writes (a shard, receipt or part): the only
    files `prepare --overwrite` may delete there."""
    return bool(_PREPARED.match(relative.replace("\\", "/")))


def prepared_words(names: list[str], *, manifest: bool = False) -> str:
    """Files prepare wrote (names under data/, written_by_prepare), counted by kind for a line.

    >>> prepared_words(["train/train-w00000of00002-00000.tfrecord",
    ...                 "parts/train-w00000of00002-00000.json", "parts/worker-00000of00002.json"],
    ...                manifest=True)
    'manifest.json, 1 shard, 1 receipt, 1 part'
    """
    counts = {"shard": 0, "receipt": 0, "part": 0}
    for name in names:
        kind = ("shard" if name.endswith(".tfrecord") else
                "part" if name.removeprefix("parts/").startswith("worker-") else "receipt")
        counts[kind] += 1
    words = [MANIFEST] if manifest else []
    words += [f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in counts.items() if n]
    return ", ".join(words) or "nothing"


def owned_by(name: str, worker_index: int, num_workers: int) -> bool:
    """Whether a file under data/ (shard, receipt, part, or a temporary of one) is written by
    that worker of that worker count."""
    part = worker_part_name(worker_index, num_workers).removeprefix("parts/")
    return worker_tag(worker_index, num_workers) in name or name.endswith(part)


def written_for(name: str, num_workers: int) -> bool:
    """Whether a file under data/ belongs to a run with `num_workers` workers."""
    return f"of{num_workers:05d}" in name


# --- the record layout -------------------------------------------------------------------


def varint(n: int) -> bytes:
    """n as a protocol buffer varint."""
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def example_prefix(payload_len: int) -> bytes:
    """Serialized `Example{features{feature{key:"ids" value{bytes_list{value: <payload>}}}}}`
    up to the payload; every row of a shard has the same length, so this is computed once."""
    bytes_list = b"\x0a" + varint(payload_len)  # BytesList.value
    feature_len = len(bytes_list) + payload_len
    feature = b"\x0a" + varint(feature_len)  # Feature.bytes_list
    key = b"\x0a" + varint(len(FEATURE)) + FEATURE.encode()
    entry_len = len(key) + 1 + len(varint(len(feature) + feature_len)) + len(feature) + feature_len
    entry = key + b"\x12" + varint(len(feature) + feature_len)  # map entry: key, value
    features_len = 1 + len(varint(entry_len)) + entry_len
    return (
        b"\x0a" + varint(features_len)  # Example.features
        + b"\x0a" + varint(entry_len)  # Features.feature (map entry)
        + entry + feature + bytes_list
    )


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def framed(record: bytes) -> bytes:
    """One TFRecord: its length, the length's masked CRC, the record, the record's masked CRC
    (TensorBoard's event files are TFRecords too: payload.data.events frames them here)."""
    header = struct.pack("<Q", len(record))
    return header + struct.pack("<I", _masked_crc(header)) + record + struct.pack(
        "<I", _masked_crc(record))


@dataclass
class ShardStats:
    records: int = 0
    tokens: int = 0
    bytes: int = 0
    sha256: str = ""


class ShardWriter:
    """Writes rows as TFRecords to an open binary file, hashing as it goes."""

    def __init__(self, file: IO[bytes], *, dtype: str):
        self._file = file
        self._dtype = np.dtype(dtype).newbyteorder("<")
        self._hash = hashlib.sha256()
        self._prefix: bytes | None = None
        self.stats = ShardStats()

    def write_rows(self, rows: np.ndarray) -> None:
        if rows.ndim != 2:
            raise ValueError("rows must be a 2-D array")
        data = np.ascontiguousarray(rows, dtype=self._dtype)
        row_bytes = data.shape[1] * data.itemsize
        if self._prefix is None:
            self._prefix = example_prefix(row_bytes)
        record_len = len(self._prefix) + row_bytes
        header = struct.pack("<Q", record_len)
        header += struct.pack("<I", _masked_crc(header))
        raw = data.tobytes()
        chunks = []
        for i in range(data.shape[0]):
            record = self._prefix + raw[i * row_bytes:(i + 1) * row_bytes]
            chunks.append(header + record + struct.pack("<I", _masked_crc(record)))
        blob = b"".join(chunks)
        self._file.write(blob)
        self._hash.update(blob)
        self.stats.records += data.shape[0]
        self.stats.tokens += data.size
        self.stats.bytes += len(blob)

    def finish(self) -> ShardStats:
        self._file.flush()
        self.stats.sha256 = self._hash.hexdigest()
        return self.stats


def iter_rows(data: bytes, *, dtype: str) -> np.ndarray:
    """All rows of a shard's bytes, checking every frame; for verification and tests."""
    rows = []
    view = memoryview(data)
    pos = 0
    np_dtype = np.dtype(dtype).newbyteorder("<")
    prefix: bytes | None = None
    while pos < len(view):
        if pos + 12 > len(view):
            raise ValueError(f"truncated record header at byte {pos}")
        header = bytes(view[pos:pos + 8])
        (length,) = struct.unpack("<Q", header)
        if struct.unpack("<I", view[pos + 8:pos + 12])[0] != _masked_crc(header):
            raise ValueError(f"bad length checksum at byte {pos}")
        body = bytes(view[pos + 12:pos + 12 + length])
        if len(body) != length or pos + 16 + length > len(view):
            raise ValueError(f"truncated record at byte {pos}")
        (crc,) = struct.unpack("<I", view[pos + 12 + length:pos + 16 + length])
        if crc != _masked_crc(body):
            raise ValueError(f"bad record checksum at byte {pos}")
        if prefix is None:
            payload_len = _payload_len(body)
            prefix = example_prefix(payload_len)
        if not body.startswith(prefix):
            raise ValueError(f"record at byte {pos} is not a tpuctl row")
        rows.append(np.frombuffer(body[len(prefix):], dtype=np_dtype))
        pos += 16 + length
    if not rows:
        return np.zeros((0, 0), dtype=np_dtype)
    return np.stack(rows)


def _payload_len(body: bytes) -> int:
    # The payload is the tail of the record; find the length that reproduces the record size.
    for payload_len in range(len(body), 0, -1):
        if len(example_prefix(payload_len)) + payload_len == len(body):
            return payload_len
    raise ValueError("record is not a tpuctl row")


def decode_batch(serialized, *, record_len: int, dtype: str):
    """[B] serialized Examples -> [B, record_len] int32 token ids (`dtype` as in the manifest).
    Read batch first, then decode: parsing a whole batch at once is several times faster."""
    import tensorflow as tf

    parsed = tf.io.parse_example(serialized, {FEATURE: tf.io.FixedLenFeature([], tf.string)})
    stored = {"uint16": tf.uint16, "int32": tf.int32}[dtype]
    ids = tf.io.decode_raw(parsed[FEATURE], stored, little_endian=True)
    ids = tf.reshape(ids, [-1, record_len])
    return tf.cast(ids, tf.int32)


# --- the manifest --------------------------------------------------------------------------


@dataclass
class ShardEntry:
    name: str  # relative to output_dir/data
    records: int
    tokens: int
    bytes: int
    sha256: str
    # The data.corpus entry the shard's rows come from, as the config names it, when the
    # corpus is a weighted mixture (each entry kept apart); "" when the corpus is one pool.
    source: str = ""


@dataclass
class SplitSummary:
    shards: list[ShardEntry] = field(default_factory=list)
    records: int = 0
    tokens: int = 0


@dataclass
class Manifest:
    format: str
    seq_len: int
    record_len: int
    dtype: str
    family: str
    vocab_size: int
    tokenizer_fingerprint: str
    data_fingerprint: str
    num_workers: int
    documents: int
    invalid_utf8_lines: int
    splits: dict[str, SplitSummary]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        raw = json.loads(text)
        if raw.get("format") != FORMAT:
            raise ValueError(f"unknown shard format {raw.get('format')!r}")
        raw["splits"] = {
            name: SplitSummary(
                shards=[ShardEntry(**s) for s in split["shards"]],
                records=split["records"], tokens=split["tokens"],
            )
            for name, split in raw["splits"].items()
        }
        return cls(**raw)


def split_sources(manifest: Manifest, split: str) -> dict[str, list[ShardEntry]]:
    """A split's shards by source, each in manifest order, sources in order of first mention.

    >>> m = Manifest(format=FORMAT, seq_len=8, record_len=8, dtype="uint16", family="gpt2",
    ...              vocab_size=9, tokenizer_fingerprint="", data_fingerprint="", num_workers=1,
    ...              documents=1, invalid_utf8_lines=0, splits={"train": SplitSummary(shards=[
    ...                  ShardEntry("a", 1, 8, 9, "", "x"), ShardEntry("b", 1, 8, 9, "", "y"),
    ...                  ShardEntry("c", 1, 8, 9, "", "x")])})
    >>> {k: [e.name for e in v] for k, v in split_sources(m, "train").items()}
    {'x': ['a', 'c'], 'y': ['b']}
    """
    groups: dict[str, list[ShardEntry]] = {}
    for entry in manifest.splits[split].shards:
        groups.setdefault(entry.source, []).append(entry)
    return groups


def manifest_path(output_dir: str) -> str:
    return layout.manifest_path(output_dir)


def load_manifest(output_dir: str) -> Manifest:
    path = manifest_path(output_dir)
    if not storage.exists(path):
        raise UserError(f"no shard manifest at {path}",
                        hint="run the prepare stage first (`--stages prepare`)")
    hint = "rerun prepare with --overwrite"
    raw = reading.read_file(path, limit=reading.JSON_LIMIT, hint=hint)
    try:
        return Manifest.from_json(raw)
    except RecursionError:
        raise UserError(f"{path} is not a valid manifest (nested too deep)", hint=hint) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path} is not a valid manifest ({exc})",
                        hint="rerun prepare with --overwrite") from None


VERIFIED = layout.VERIFIED


def check_shards(output_dir: str, manifest: Manifest, splits=SPLITS) -> bool:
    """The shards the manifest lists are there and whole: in full (every sha256) the first
    time, recorded in data/verified.json; after that by their sizes alone (one listing per
    split), so a training start or a resume does not read every shard again. True when the
    full check ran."""
    digest = hashlib.sha256(manifest.to_json().encode()).hexdigest()
    record = storage.join(layout.data_dir(output_dir), VERIFIED)
    if storage.exists(record) and json.loads(storage.read_text(record)).get("manifest") == digest:
        listings: dict[str, dict[str, int]] = {}
        for split in splits:
            for entry in manifest.splits[split].shards:
                folder, _, file = entry.name.rpartition("/")
                if folder not in listings:
                    listings[folder] = storage.sizes(storage.join(layout.data_dir(output_dir), folder))
                have = listings[folder].get(file)
                if have is None:
                    raise UserError(f"shard {entry.name} listed in the manifest is missing",
                                    hint="rerun prepare to rebuild it")
                if have != entry.bytes:
                    raise UserError(f"shard {entry.name} is {have} bytes, the manifest says "
                                    f"{entry.bytes}", hint="it is corrupt; delete it and rerun "
                                    "prepare")
        return False
    verify_shards(output_dir, manifest, splits)
    storage.write_text(record, json.dumps({"manifest": digest}) + "\n")
    return True


def verify_shards(output_dir: str, manifest: Manifest, splits=SPLITS) -> None:
    """Check every listed shard's size and sha256; name the first one that does not match."""
    for split in splits:
        for entry in manifest.splits[split].shards:
            path = storage.join(layout.data_dir(output_dir), entry.name)
            if not storage.exists(path):
                raise UserError(f"shard {entry.name} listed in the manifest is missing",
                                hint="rerun prepare to rebuild it")
            digest = hashlib.sha256(storage.read_bytes(path)).hexdigest()
            if digest != entry.sha256:
                raise UserError(f"shard {entry.name} does not match its checksum in the manifest",
                                hint="it is corrupt; delete it and rerun prepare")
