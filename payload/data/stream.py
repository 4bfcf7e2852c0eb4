"""The run's input order over its steps: segments of steps with one batch size and one mixture,
recorded beside the checkpoints; the global batch of any step; each host's rows of it, masked.

    segments = resume_segments(saved, want, start=30, allow_change=False)  # or [want] at 0
    stream = TrainStream(reader, segments, objective, seed=0)
    batches = stream.host_batches(start=30, host=0, num_hosts=2)   # host 0's features, numpy
    stream.consumed(60)                       # {source: examples drawn before step 60}

A segment starts at a step with the number of examples each source had given by then; from there
batch s draws its rows by `mix_counts` of the examples since the segment began. A resume with
the same settings adds nothing, so the batches are those of an uninterrupted run whatever the
worker count; a resume with another batch size or other weights starts a segment at the resumed
step, from the same example offsets (the steps already taken stay as they were); another seed or
other prepared data is refused unless asked for (`--new-data-order`), since the steps before
would then not be what the new order says.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from payload.core import layout, storage
from payload.core.errors import UserError
from payload.data.reader import Permutation, Reader, batch_digest, key_of, mix_counts, uniform

FORMAT = "tpuctl-data-order/1"
NEW_ORDER_FLAG = "--new-data-order"


@dataclass(frozen=True, kw_only=True)
class Segment:
    """From `step` on (until the next segment): batches of `batch_size` drawn from the sources by
    `weights`, each source having given `consumed[source]` examples before `step`."""

    step: int
    consumed: dict[str, int]
    batch_size: int
    weights: dict[str, float]
    seed: int
    data: str  # the manifest's data fingerprint

    def consumed_at(self, step: int) -> dict[str, int]:
        names = list(self.weights)
        counts = mix_counts((step - self.step) * self.batch_size, [self.weights[n] for n in names])
        return {n: self.consumed.get(n, 0) + c for n, c in zip(names, counts, strict=True)}


def data_order_path(output_dir: str) -> str:
    return storage.join(layout.checkpoints_dir(output_dir), layout.DATA_STREAM)


def read_segments(output_dir: str) -> list[Segment] | None:
    """The input order recorded beside the checkpoints; None for checkpoints of a tpuctl before
    it (or of none)."""
    path = data_order_path(output_dir)
    if not storage.exists(path):
        return None
    raw = json.loads(storage.read_text(path))
    if raw.get("format") != FORMAT:
        raise UserError(f"{path} is in an unknown format ({raw.get('format')!r})",
                        hint="update tpuctl, or start again with --overwrite")
    return [Segment(**s) for s in raw["segments"]]


def write_segments(output_dir: str, segments: list[Segment]) -> None:
    text = json.dumps({"format": FORMAT, "segments": [asdict(s) for s in segments]}, indent=1)
    storage.write_text(data_order_path(output_dir), text + "\n")


def resume_segments(saved: list[Segment] | None, want: Segment, *, start: int,
                    allow_change: bool) -> tuple[list[Segment], str | None]:
    """The segments a run at `start` trains on, and a line saying what changed (None: nothing).
    `want` is this run's settings (its `step` and `consumed` are ignored)."""
    if start == 0 and not saved:
        return [replace(want, step=0, consumed=dict.fromkeys(want.weights, 0))], None
    if not saved:
        # Checkpoints of a tpuctl that read the shards in another order: the new order continues
        # from the same example offset.
        consumed = replace(want, step=0, consumed={}).consumed_at(start)
        return [replace(want, step=start, consumed=consumed)], (
            f"the checkpoints hold no record of their input order (an earlier tpuctl): "
            f"continuing in the global order from example {start * want.batch_size}")
    kept = [s for s in saved if s.step <= start] or saved[:1]
    last = kept[-1]
    changed = [what for what, differs in (("train.seed", last.seed != want.seed),
                                          ("the prepared data", last.data != want.data)) if differs]
    if changed and not allow_change:
        raise UserError(
            f"--resume: {' and '.join(changed)} changed since the checkpoints were written, so "
            f"the steps before {start} were not drawn in the order this run would draw",
            hint=f"restore them, or pass {NEW_ORDER_FLAG} to continue in the new order from "
                 "the same example offset")
    consumed = last.consumed_at(start)
    notes = []
    if last.batch_size != want.batch_size:
        notes.append(f"train.batch_size {last.batch_size} -> {want.batch_size}: continuing from "
                     f"example {sum(consumed.values())}, where step {start} left off")
    if last.weights != want.weights:
        weights = ", ".join(f"{n or 'the plain entries'} {w:g}"
                            for n, w in want.weights.items())
        notes.append(f"data.corpus weights changed: from step {start} batches draw {weights}")
    if changed:
        notes.append(f"{' and '.join(changed)} changed ({NEW_ORDER_FLAG}): a new order from "
                     f"example {sum(consumed.values())}")
    if not notes:
        return kept, None
    new = replace(want, step=start, consumed={n: consumed.get(n, 0) for n in want.weights})
    return [*[s for s in kept if s.step < start], new], "; ".join(notes)


# --- batches ------------------------------------------------------------------------------


@dataclass
class TrainStream:
    """Global batch s of training, and each host's masked rows of it."""

    reader: Reader
    segments: list[Segment]
    objective: object  # payload.data.objectives: features of a [B, L] batch and its draws
    seed: int
    digests: dict[int, str] = field(default_factory=dict)  # step -> batch_digest, the chief's

    def segment_at(self, step: int) -> Segment:
        return [s for s in self.segments if s.step <= step][-1]

    def consumed(self, step: int) -> dict[str, int]:
        """Examples each source gave before `step`."""
        return self.segment_at(step).consumed_at(step)

    def records(self, step: int, lo: int, hi: int) -> list[tuple[str, np.ndarray]]:
        """Rows lo..hi of global batch `step` as (source, record indices) runs, in row order."""
        segment = self.segment_at(step)
        before, after = segment.consumed_at(step), segment.consumed_at(step + 1)
        runs, row = [], 0
        for name in segment.weights:
            count = after[name] - before[name]
            a, b = max(lo, row), min(hi, row + count)
            if a < b:
                position = before[name] + np.arange(a - row, b - row, dtype=np.int64)
                runs.append((name, self._shuffled(name, position)))
            row += count
        return runs

    def _shuffled(self, name: str, position: np.ndarray) -> np.ndarray:
        n = self.reader.sources[name].records
        epoch, offset = np.divmod(position, n)
        out = np.empty_like(position)
        for e in np.unique(epoch).tolist():
            at = epoch == e
            out[at] = Permutation(n, key_of(self.seed, name, e))(offset[at])
        return out

    def ids(self, step: int, lo: int, hi: int) -> np.ndarray:
        parts = [self.reader.rows(name, index) for name, index in self.records(step, lo, hi)]
        return np.concatenate(parts) if parts else np.zeros((0, self.reader.record_len), np.int32)

    def global_ids(self, step: int) -> np.ndarray:
        return self.ids(step, 0, self.segment_at(step).batch_size)

    def host_features(self, step: int, host: int, num_hosts: int, *,
                      digest: bool = False) -> dict[str, np.ndarray]:
        """This host's rows of batch `step` with the objective applied; `digest`: read the whole
        batch (the chief) and record its digest too."""
        batch = self.segment_at(step).batch_size
        if batch % num_hosts:
            raise ValueError(f"a batch of {batch} does not split over {num_hosts} hosts")
        per = batch // num_hosts
        lo, hi = host * per, (host + 1) * per
        if digest:
            whole = self.global_ids(step)
            self.digests[step] = batch_digest(whole)
            ids = whole[lo:hi]
        else:
            ids = self.ids(step, lo, hi)
        return apply_objective(self.objective, ids, key_of(self.seed, "mask", step),
                               np.arange(lo, hi))

    def host_batches(self, start: int, host: int, num_hosts: int, *, digest: bool = False):
        """Host `host`'s features of batches start, start + 1, ...; the next one is read while
        this one trains."""
        return _ahead(lambda step: self.host_features(step, host, num_hosts, digest=digest),
                      start)


@dataclass
class EvalStream:
    """The validation batches: records in manifest order (every source's, one after another),
    batch k the k-th run of B of them, masks seeded by k: the same batches at every evaluation."""

    reader: Reader
    objective: object
    seed: int
    batch_size: int

    def host_features(self, k: int, host: int, num_hosts: int) -> dict[str, np.ndarray]:
        per = self.batch_size // num_hosts
        lo, hi = host * per, (host + 1) * per
        order = [(name, s.records) for name, s in self.reader.sources.items()]
        total = sum(n for _, n in order)
        index = (k * self.batch_size + np.arange(lo, hi)) % total
        parts, start = [], 0
        for name, n in order:
            at = (index >= start) & (index < start + n)
            if at.any():
                parts.append((np.flatnonzero(at), self.reader.rows(name, index[at] - start)))
            start += n
        ids = np.empty((hi - lo, self.reader.record_len), np.int32)
        for where, rows in parts:
            ids[where] = rows
        return apply_objective(self.objective, ids, key_of(self.seed, "eval", k),
                               np.arange(lo, hi))

    def host_batches(self, host: int, num_hosts: int):
        return _ahead(lambda k: self.host_features(k, host, num_hosts), 0)


def apply_objective(objective, ids: np.ndarray, key: int, rows: np.ndarray) -> dict:
    """The objective's features of `ids`, its random draws a function of (key, global row)."""
    return objective(ids, uniform(key, rows, getattr(objective, "draws", 0)))


def _ahead(make, start: int):
    """make(start), make(start + 1), ... with the next one made on a thread meanwhile."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches") as pool:
        pending = pool.submit(make, start)
        step = start
        while True:
            ready = pending.result()
            step += 1
            pending = pool.submit(make, step)
            yield ready
