"""The training input as a function of the step: which records form global batch s, read from
their offsets, with no framework.

    reader = Reader.of(manifest, data_dir, "train")     # the shards, by record offset
    ids = reader.rows("", np.array([7, 3]))             # [2, record_len] int32
    order = Permutation(n=1000, key=key_of(0, "", 0))   # epoch 0's order of 1,000 records
    batch_digest(ids)                                   # metrics.json's data_digests value

payload.data.stream builds each step's global batch from these.

Global batch s depends only on the prepared data (its manifest), `train.seed` and s: example e of
the run is record `Permutation(n, key(seed, source, epoch))[e mod n]` of its source, so nothing
of size n is held and each epoch is a new order (Levanter's loader draws the same way). A host
reads only the rows of the batch its devices hold (rows h*B/H .. (h+1)*B/H, the order in which
the engines place them), from the shards' record offsets: every record of a shard has one byte
size (payload.data.shards), so record i is at i * size. A resume at step s reads batch s first:
nothing before it is read again, whatever the worker count.

Sources: a weighted mixture (data.corpus entries with weights) draws each global batch's rows
from its sources by weight (`mix_counts`, exact to within one example per source at every
offset); an unweighted run is one source.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import numpy as np

from payload.core import storage
from payload.data import shards as records

_M64 = (1 << 64) - 1
FEISTEL_ROUNDS = 4


def mix64(x):
    """splitmix64's finaliser on uint64 numpy arrays (or a Python int): a bijective hash."""
    if isinstance(x, int):
        x &= _M64
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & _M64
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & _M64
        return x ^ (x >> 31)
    x = np.asarray(x, dtype=np.uint64)
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def key_of(*parts: int | str) -> int:
    """A 64-bit key from ints and strings, the same on every host and Python."""
    key = 0x9E3779B97F4A7C15
    for part in parts:
        if isinstance(part, str):
            part = int.from_bytes(hashlib.blake2b(part.encode(), digest_size=8).digest(), "little")
        key = mix64(key ^ mix64(part & _M64))
    return key


class Permutation:
    """A keyed bijection of [0, n): a balanced Feistel network over the smallest even number of
    bits that holds n, walked until it lands inside [0, n) (under 4 rounds of walking on average).

    >>> p = Permutation(10, key=7)
    >>> sorted(p(np.arange(10)).tolist()) == list(range(10))
    True
    """

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError("a permutation of nothing")
        self.n = n
        half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
        self.half = np.uint64(half)
        self.mask = np.uint64((1 << half) - 1)
        self.keys = [np.uint64(key_of(key, r)) for r in range(FEISTEL_ROUNDS)]

    def _once(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self.half, x & self.mask
        for k in self.keys:
            left, right = right, left ^ (mix64(right ^ k) & self.mask)
        return (left << self.half) | right

    def __call__(self, index) -> np.ndarray:
        x = self._once(np.asarray(index, dtype=np.uint64))
        outside = x >= np.uint64(self.n)
        while outside.any():
            x[outside] = self._once(x[outside])
            outside = x >= np.uint64(self.n)
        return x.astype(np.int64)


def uniform(key: int, rows: np.ndarray, count: int) -> np.ndarray:
    """[len(rows), count] float32 in [0, 1), a function of (key, row, column) alone: a row's
    draws are the same whichever host computes it and with whichever neighbours."""
    rows = np.asarray(rows, dtype=np.uint64)[:, None]
    cols = np.arange(count, dtype=np.uint64)[None, :]
    bits = mix64(mix64(rows ^ np.uint64(key)) + cols * np.uint64(0x9E3779B97F4A7C15))
    return ((bits >> np.uint64(40)).astype(np.float32)) * np.float32(1.0 / (1 << 24))


def mix_counts(examples: int, weights: list[float]) -> list[int]:
    """How many of the first `examples` examples each source gives: exact in total, each within
    one example per source of its share, and never fewer for more examples (source j takes its
    share of what the sources before it left, rounded down; the last takes the rest).

    >>> mix_counts(10, [0.8, 0.2]), mix_counts(11, [0.8, 0.2]), mix_counts(7, [1.0])
    ([8, 2], [8, 3], [7])
    >>> mix_counts(10, [0.8, 0.2, 0.0])
    [8, 2, 0]
    """
    live = [j for j, w in enumerate(weights) if w > 0]  # a source of weight 0 gives nothing
    counts = [0] * len(weights)
    left, rest = examples, sum(weights[j] for j in live)
    for j in live[:-1]:
        counts[j] = int(left * weights[j] / rest)
        left, rest = left - counts[j], rest - weights[j]
    if live:
        counts[live[-1]] = left
    return counts


def batch_digest(ids: np.ndarray) -> str:
    """metrics.json's `data_digests` value: sha256 of the global batch's ids, int32
    little-endian, row-major, first 16 hex."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<i4").tobytes()).hexdigest()[:16]


# --- reading rows ------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Records of one source of one split, in manifest order: shard paths and where each begins."""

    name: str
    paths: tuple[str, ...]
    starts: np.ndarray  # first global record of each shard, then the total
    frame: tuple[int, ...]  # bytes per record, per shard

    @property
    def records(self) -> int:
        return int(self.starts[-1])


class Reader:
    """Rows of the prepared shards by record index, from their offsets (local files by pread,
    gs:// by ranged reads, several at once)."""

    def __init__(self, sources: list[Source], *, record_len: int, dtype: str):
        self.sources = {s.name: s for s in sources}
        self.record_len, self.dtype = record_len, np.dtype(dtype).newbyteorder("<")
        self.payload = record_len * self.dtype.itemsize
        self.skip = 12 + len(records.example_prefix(self.payload))  # header, then Example
        self._files: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, manifest: records.Manifest, data_dir: str, split: str) -> Reader:
        groups = records.split_sources(manifest, split)
        sources = []
        for name, entries in groups.items():
            entries = [e for e in entries if e.records]
            for e in entries:
                if e.bytes % e.records:
                    raise ValueError(f"shard {e.name} does not hold records of one size")
            sources.append(Source(
                name=name, paths=tuple(storage.join(data_dir, e.name) for e in entries),
                starts=np.cumsum([0] + [e.records for e in entries], dtype=np.int64),
                frame=tuple(e.bytes // e.records for e in entries)))
        return cls(sources, record_len=manifest.record_len, dtype=manifest.dtype)

    def rows(self, source: str, index: np.ndarray) -> np.ndarray:
        """[len(index), record_len] int32: records `index` of `source`, in that order."""
        src = self.sources[source]
        index = np.asarray(index, dtype=np.int64)
        shard = np.searchsorted(src.starts, index, side="right") - 1
        ranges = [(src.paths[s], (i - int(src.starts[s])) * src.frame[s] + self.skip)
                  for s, i in zip(shard.tolist(), index.tolist(), strict=True)]
        out = np.empty((len(index), self.record_len), dtype=np.int32)
        for row, data in enumerate(self._read(ranges)):
            if len(data) != self.payload:
                raise OSError(f"short read in {ranges[row][0]}: the shard is shorter than "
                              "the manifest says")
            out[row] = np.frombuffer(data, dtype=self.dtype)
        return out

    def _read(self, ranges: list[tuple[str, int]]) -> list[bytes]:
        if ranges and storage.is_gcs(ranges[0][0]):
            return storage.read_ranges([(p, o, self.payload) for p, o in ranges])
        import os

        return [os.pread(self._fd(path), self.payload, offset) for path, offset in ranges]

    def _fd(self, path: str) -> int:
        import os

        with self._lock:
            if path not in self._files:
                self._files[path] = os.open(path, os.O_RDONLY)
            return self._files[path]

    def close(self) -> None:
        import os

        with self._lock:
            for fd in self._files.values():
                os.close(fd)
            self._files.clear()
