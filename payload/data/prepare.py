"""Stage `prepare`: tokenize this worker's share of the corpus into TFRecord shards.

    python -m payload prepare --config run.yaml --worker-index 0 --num-workers 2

Each split (train, validation) is one token stream per worker: the worker's documents in order,
each followed by the family's separator, cut into rows of `record_len` tokens (BERT/RoBERTa
rows start with [CLS]/<s>). The tokens left after a worker's last full row (fewer than one
row, per worker and split) are dropped. A document is in validation when a hash of its text
falls under `validation_fraction`, so the split does not depend on the worker count and
duplicate documents never straddle it.

Shards fill to `records_per_shard` and are written under a temporary name, then renamed (or
uploaded) into place; then a receipt records the shard's manifest entry and where in the input
the next shard starts. A rerun resumes after the last receipt, so a killed run loses at most
one shard of work and ends with exactly the shards an uninterrupted run makes. The last worker
to finish merges the per-worker parts into `data/manifest.json`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from payload.config import RunConfig, dump_config
from payload.core import ownership, storage
from payload.core.errors import UserError
from payload.core.families import FamilySpec
from payload.core.layout import PARTS_DIR, config_path
from payload.core.layout import data_dir as data_dir_of
from payload.data import corpus
from payload.data import shards as records
from payload.data.tokenizer import family_tokens, load_tokenizer, read_tokenizer_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layout:
    """How token ids become rows: what every shard of one dataset shares."""

    family: str
    seq_len: int
    record_len: int
    dtype: str
    vocab_size: int
    separator_id: int
    row_start_id: int | None

    @property
    def window(self) -> int:
        """Stream tokens per row (the row-start token is added, not taken from the stream)."""
        return self.record_len - (1 if self.row_start_id is not None else 0)


def layout_for(config: RunConfig, tok, family: FamilySpec) -> Layout:
    """The rows' layout with `family`'s tokens as the tokenizer has them (family_tokens)."""
    vocab_size = tok.get_vocab_size(with_added_tokens=True)

    def token_id(token: str) -> int:
        tid = tok.token_to_id(token)
        if tid is None:
            raise UserError(f"the tokenizer has no {token} token, which {family.name} needs",
                            hint="retrain it with the tokenizer stage or fix tokenizer.path")
        return tid

    return Layout(
        family=family.name, seq_len=config.data.seq_len, record_len=config.record_len,
        dtype=records.dtype_for_vocab(vocab_size), vocab_size=vocab_size,
        separator_id=token_id(family.separator),
        row_start_id=token_id(family.row_start) if family.row_start else None,
    )


def data_fingerprint(config: RunConfig, sources: list[corpus.Source], layout: Layout,
                     tokenizer_fp: str, num_workers: int) -> str:
    """Everything that decides the shards' content: a rerun with another value starts over.
    The weights do not (they decide only how training draws, and may change on resume); which
    entries are weighted does (each weighted entry is written apart)."""
    d = config.data
    groups = {} if not d.weighted else {"groups": [[m.name, list(m.paths)] for m in d.sources]}
    facts = {**groups,
        "sources": [(s.path, s.size) for s in sources], "layout": asdict(layout),
        "tokenizer": tokenizer_fp, "num_workers": num_workers,
        "data": [d.text_column, d.document_split, d.validation_fraction, d.records_per_shard,
                 d.max_document_mb, d.hf_config, d.hf_split],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def in_validation(text: str, fraction: float) -> bool:
    if fraction <= 0:
        return False
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") < fraction * (1 << 64)


def encode_stream(tok, texts: list[str], separator_id: int) -> np.ndarray:
    """Token ids of `texts`, each document followed by the separator, as one int32 array."""
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    id_lists = [e.ids for e in encode(texts, add_special_tokens=False)]
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    flat = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int32,
                       count=int(lengths.sum()))
    return np.insert(flat, np.cumsum(lengths), separator_id)


def _encode_ahead(tok, batches, separator_id: int):
    """(batch, token ids) in order, encoding one batch ahead on a second thread: the tokenizer
    releases the GIL, so reading the next batch and writing rows overlap with encoding."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode") as pool:
        pending = None
        for batch in batches:
            future = pool.submit(encode_stream, tok, batch.texts, separator_id)
            if pending is not None:
                yield pending[0], pending[1].result()
            pending = (batch, future)
        if pending is not None:
            yield pending[0], pending[1].result()


@dataclass(frozen=True)
class _Group:
    """One source of the mixture as prepare writes it: a token stream of its own, in shards
    of its own (a weighted entry, or the pool of plain entries, named "")."""

    name: str
    sources: list[corpus.Source]
    pieces: list[corpus.Piece]  # this worker's share of them


@dataclass
class _Context:
    config: RunConfig
    tok: object
    tokenizer_fp: str
    layout: Layout
    data_fp: str
    sources: list[corpus.Source]
    groups: list[_Group]
    worker_index: int
    num_workers: int

    @property
    def data_dir(self) -> str:
        return data_dir_of(self.config.output_dir)

    def path(self, relative: str) -> str:
        return storage.join(self.data_dir, relative)

    def stamp(self) -> dict:
        return {"data_fingerprint": self.data_fp, "tokenizer_fingerprint": self.tokenizer_fp,
                "seq_len": self.layout.seq_len, "record_len": self.layout.record_len,
                "num_workers": self.num_workers}


class _SplitWriter:
    """Cuts one split's token stream into rows and rows into shards, with receipts."""

    def __init__(self, ctx: _Context, split: str, source: str = "", first_index: int = 0):
        self.ctx = ctx
        self.split = split
        self.source = source
        self.first_index = first_index  # shards of the sources before this one come first
        self.rows_per_shard = ctx.config.data.records_per_shard
        self.shards: list[records.ShardEntry] = []
        self._file = None
        self._tmp = None
        self._writer: records.ShardWriter | None = None
        self._rows_in_shard = 0

    @property
    def next_index(self) -> int:
        return self.first_index + len(self.shards)

    def _open(self) -> None:
        name = records.shard_name(self.split, self.ctx.worker_index, self.ctx.num_workers,
                                  self.next_index)
        self._file, self._tmp = storage.staging_file(self.ctx.path(name))
        self._writer = records.ShardWriter(self._file, dtype=self.ctx.layout.dtype)
        self._rows_in_shard = 0

    def add_rows(self, rows: np.ndarray) -> int:
        """Write rows into the open shard; returns how many fit before it is full."""
        if self._writer is None:
            self._open()
        assert self._writer is not None
        take = min(len(rows), self.rows_per_shard - self._rows_in_shard)
        if self.ctx.layout.row_start_id is not None:
            starts = np.full((take, 1), self.ctx.layout.row_start_id, dtype=rows.dtype)
            body = np.concatenate([starts, rows[:take]], axis=1)
        else:
            body = rows[:take]
        try:
            self._writer.write_rows(body)
        except OSError as exc:
            self.abort()
            storage.raise_disk_error(exc, self.ctx.data_dir)
        self._rows_in_shard += take
        return take

    @property
    def full(self) -> bool:
        return self._rows_in_shard >= self.rows_per_shard

    def close_shard(self, resume: dict, *, final: bool) -> None:
        assert self._writer is not None and self._file is not None
        index = self.next_index
        name = records.shard_name(self.split, self.ctx.worker_index, self.ctx.num_workers, index)
        try:
            stats = self._writer.finish()
            os.fsync(self._file.fileno())
            self._file.close()
        except OSError as exc:
            self.abort()
            storage.raise_disk_error(exc, self.ctx.path(name))
        storage.publish_file(self._tmp, self.ctx.path(name))
        entry = records.ShardEntry(name=name, records=stats.records, tokens=stats.tokens,
                                   bytes=stats.bytes, sha256=stats.sha256, source=self.source)
        receipt = {**self.ctx.stamp(), "entry": asdict(entry), "resume": resume, "final": final}
        storage.write_text(self.ctx.path(records.shard_receipt_name(
            self.split, self.ctx.worker_index, self.ctx.num_workers, index)),
            json.dumps(receipt))
        self.shards.append(entry)
        self._writer, self._file, self._tmp = None, None, None
        log.info("%s shard %d: %d records -> %s", self.split, index, stats.records, name)

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            storage.remove(self._tmp)
        self._writer, self._file, self._tmp = None, None, None

    @property
    def has_rows(self) -> bool:
        return self._writer is not None and self._rows_in_shard > 0


def _read_receipts(ctx: _Context, split: str) -> list[dict]:
    """This worker's finished shards of a split, in order, stopping at the first gap. Two
    listings say which receipts and shards exist and how big; the receipts are then read
    together (in parallel on gs://), not one request after another per shard."""
    first = records.shard_receipt_name(split, ctx.worker_index, ctx.num_workers, 0)
    present = storage.sizes(ctx.path(os.path.dirname(first)))
    receipts = []
    for index in itertools.count():
        name = records.shard_receipt_name(split, ctx.worker_index, ctx.num_workers, index)
        if os.path.basename(name) not in present:
            break
        receipts.append(ctx.path(name))
    shard_sizes: dict[str, dict[str, int]] = {}
    done = []
    for raw in storage.read_many(receipts):
        if raw is None:
            break
        receipt = json.loads(raw)
        folder, _, file = receipt["entry"]["name"].rpartition("/")
        if folder not in shard_sizes:
            shard_sizes[folder] = storage.sizes(ctx.path(folder))
        if (receipt.get("data_fingerprint") != ctx.data_fp
                or shard_sizes[folder].get(file) != receipt["entry"]["bytes"]):
            break
        done.append(receipt)
        if receipt["final"]:
            break
    return done


def _prepare_split(ctx: _Context, split: str) -> tuple[list[records.ShardEntry], tuple[int, int]]:
    """Write one split's shards, source after source (resuming after finished ones); returns
    them and read stats."""
    done = _read_receipts(ctx, split)
    shards: list[records.ShardEntry] = []
    documents = invalid = 0
    for group in ctx.groups:
        mine = [r for r in done if r["entry"].get("source", "") == group.name]
        made, (docs, bad) = _prepare_source(ctx, split, group, mine, first_index=len(shards))
        shards += made
        documents, invalid = documents + docs, invalid + bad
    return shards, (documents, invalid)


def _prepare_source(ctx: _Context, split: str, group: _Group, done: list[dict], *,
                    first_index: int) -> tuple[list[records.ShardEntry], tuple[int, int]]:
    """Write one source's shards of a split (resuming after `done`, its finished ones)."""
    fraction = ctx.config.data.validation_fraction
    want_validation = split == "validation"
    writer = _SplitWriter(ctx, split, group.name, first_index)
    writer.shards = [records.ShardEntry(**r["entry"]) for r in done]
    label = f"{split} ({group.name})" if group.name else split
    if done and done[-1]["final"]:
        totals = done[-1]["resume"]["stats"]
        return writer.shards, (totals[0], totals[1])
    start_cursor, next_token, stats_before = None, 0, (0, 0)
    if done:
        resume = done[-1]["resume"]
        start_cursor = corpus.Cursor.from_json(resume["cursor"]) if resume["cursor"] else None
        next_token = resume["next_token"]
        stats_before = tuple(resume["batch_stats"])
        log.info("%s: resuming after %d finished shards", label, len(done))
    # `buffer` holds stream tokens [buffer_start, buffer_start + len) not yet in a row.
    buffer = np.zeros(0, dtype=np.int32)
    buffer_start = done[-1]["resume"]["batch_offset"] if done else 0
    stats = corpus.ReadStats(documents=stats_before[0], invalid_utf8_lines=stats_before[1])
    recent: list[tuple[corpus.Cursor, int, tuple[int, int]]] = []
    window = ctx.layout.window
    started, tokens_seen, last_report = time.monotonic(), 0, time.monotonic()

    def resume_point() -> dict:
        # The newest batch that starts at or before the next unwritten token.
        cursor, offset, before = next((c, o, b) for c, o, b in reversed(recent)
                                      if o <= buffer_start)
        return {"cursor": cursor.to_json(), "batch_offset": offset, "next_token": buffer_start,
                "batch_stats": list(before)}

    batches = corpus.iter_batches(
        group.sources, group.pieces, ctx.config.data, stats=stats, start=start_cursor,
        keep=lambda text: in_validation(text, fraction) == want_validation,
    )
    for batch, ids in _encode_ahead(ctx.tok, batches, ctx.layout.separator_id):
        batch_offset = buffer_start + len(buffer)
        recent.append((batch.cursor, batch_offset, batch.stats_before))
        buffer = np.concatenate([buffer, ids]) if len(buffer) else ids
        if buffer_start < next_token:  # resuming: skip what finished shards already hold
            drop = min(next_token - buffer_start, len(buffer))
            buffer, buffer_start = buffer[drop:], buffer_start + drop
        tokens_seen += len(ids)
        while len(buffer) >= window:
            num_rows = len(buffer) // window
            rows = buffer[:num_rows * window].reshape(num_rows, window)
            taken = writer.add_rows(rows)
            buffer, buffer_start = buffer[taken * window:], buffer_start + taken * window
            if writer.full:
                point = resume_point()
                writer.close_shard(point, final=False)
                recent = [r for r in recent if r[1] >= point["batch_offset"]]
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            log.info("%s: %d documents read, %.0f tokens/s", label, stats.documents,
                     tokens_seen / (last_report - started))
    totals = (stats.documents, stats.invalid_utf8_lines)
    if writer.has_rows:
        writer.close_shard({"cursor": None, "batch_offset": 0, "next_token": buffer_start,
                            "batch_stats": list(totals), "stats": list(totals)}, final=True)
    elif writer.shards:
        # The stream ended exactly on a shard boundary: mark the last receipt final.
        last = records.shard_receipt_name(split, ctx.worker_index, ctx.num_workers,
                                          writer.next_index - 1)
        receipt = json.loads(storage.read_text(ctx.path(last)))
        receipt["final"] = True
        receipt["resume"]["stats"] = list(totals)
        storage.write_text(ctx.path(last), json.dumps(receipt))
    log.info("%s: %d shards, %d documents read, %d tokens dropped at the tail", label,
             len(writer.shards), stats.documents, len(buffer))
    return writer.shards, totals


def _existing_stamps(ctx: _Context) -> list[tuple[str, dict]]:
    """Fingerprint-bearing files already in data/: the manifest and every receipt and part."""
    manifest = storage.join(ctx.data_dir, records.MANIFEST)
    candidates = [p for p in storage.listdir(ctx.path(PARTS_DIR)) if p.endswith(".json")]
    if storage.exists(manifest):
        candidates.insert(0, manifest)
    found = []
    # Read together (in parallel on gs://): a big run has thousands of receipts.
    for path, raw in zip(candidates, storage.read_many(candidates), strict=True):
        if raw is None:
            continue
        try:
            found.append((path, json.loads(raw)))
        except (ValueError, UnicodeDecodeError):
            found.append((path, {}))
    return found


def _mismatch_reason(ctx: _Context, stamp: dict) -> str | None:
    if stamp.get("data_fingerprint") == ctx.data_fp:
        return None
    if stamp.get("tokenizer_fingerprint") not in (None, ctx.tokenizer_fp):
        return "a different tokenizer"
    if stamp.get("seq_len") not in (None, ctx.layout.seq_len) or stamp.get(
            "record_len") not in (None, ctx.layout.record_len):
        return f"seq_len {stamp.get('seq_len')} (this run: {ctx.layout.seq_len})"
    if stamp.get("num_workers") not in (None, ctx.num_workers):
        return f"{stamp.get('num_workers')} workers (this run: {ctx.num_workers})"
    return "other data settings or corpus files"


def _prepared_with_another_count(ctx: _Context) -> int | None:
    """The worker count of a whole prepare of this same data (its manifest's fingerprint is the
    one this run would make with that count), when it is not this run's: training reads any
    prepared data with any worker count, so it is not made again."""
    path = records.manifest_path(ctx.config.output_dir)
    if not storage.exists(path):
        return None
    try:
        manifest = records.Manifest.from_json(storage.read_text(path))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    if manifest.num_workers == ctx.num_workers:
        return None
    same = data_fingerprint(ctx.config, ctx.sources, ctx.layout, ctx.tokenizer_fp,
                            manifest.num_workers)
    return manifest.num_workers if manifest.data_fingerprint == same else None


def _other_current_worker(ctx: _Context, name: str) -> bool:
    return records.written_for(name, ctx.num_workers) and not records.owned_by(
        name, ctx.worker_index, ctx.num_workers)


def _guard_existing(ctx: _Context, overwrite: bool) -> None:
    """Refuse shards of an earlier, different prepare; with --overwrite, remove what this
    worker makes again (its share is redone, whether what is there is an earlier prepare's or
    this one's)."""
    for folder in ["", *records.SPLITS, PARTS_DIR]:  # prepare writes and deletes in these
        ownership.check_no_link(ctx.config.output_dir, ctx.path(folder) if folder else ctx.data_dir)
    if not overwrite:
        stale = [(path, reason) for path, stamp in _existing_stamps(ctx)
                 if (reason := _mismatch_reason(ctx, stamp))]
        if stale:
            raise UserError(f"{ctx.data_dir} holds shards made with {stale[0][1]}",
                            hint="pass --overwrite to replace them, or choose another output_dir")
        return
    # Each worker deletes what it owns and what no current worker owns; never another
    # current worker's files, which may already be this run's, and never a file whose name
    # prepare does not write (the user's notes in data/ stay). The manifest goes first: until
    # the last worker writes a new one, no stage reads data/ as whole.
    manifest = storage.join(ctx.data_dir, records.MANIFEST)
    had_manifest = storage.exists(manifest)
    doomed, names = [manifest] if had_manifest else [], []
    for folder in [*records.SPLITS, PARTS_DIR]:
        for path in storage.listdir(ctx.path(folder)):
            name = f"{folder}/{os.path.basename(path)}"
            if records.written_by_prepare(name) and not _other_current_worker(ctx, name):
                doomed.append(path)
                names.append(name)
    if not doomed:
        return
    log.info("--overwrite: removing what prepare wrote in %s for worker %d of %d: %s",
             ctx.data_dir, ctx.worker_index, ctx.num_workers,
             records.prepared_words(names, manifest=had_manifest))
    ownership.remove_owned(ctx.config.output_dir, doomed)


def _clean_temporaries(ctx: _Context) -> None:
    if storage.is_gcs(ctx.data_dir):
        return
    for folder in [ctx.path(s) for s in records.SPLITS] + [ctx.path(PARTS_DIR)]:
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                if name.startswith(".tmp-") and records.owned_by(name, ctx.worker_index,
                                                                 ctx.num_workers):
                    storage.remove(os.path.join(folder, name))


def finalize_manifest(ctx: _Context) -> records.Manifest | None:
    """Merge every worker's part into data/manifest.json once all parts exist."""
    parts = []
    for index in range(ctx.num_workers):
        path = ctx.path(records.worker_part_name(index, ctx.num_workers))
        if not storage.exists(path):
            return None
        part = json.loads(storage.read_text(path))
        if part.get("data_fingerprint") != ctx.data_fp:
            return None
        parts.append(part)
    splits = {}
    for split in records.SPLITS:
        entries = [records.ShardEntry(**e) for part in parts for e in part["shards"][split]]
        splits[split] = records.SplitSummary(
            shards=entries, records=sum(e.records for e in entries),
            tokens=sum(e.tokens for e in entries))
    layout = ctx.layout
    manifest = records.Manifest(
        format=records.FORMAT, seq_len=layout.seq_len, record_len=layout.record_len,
        dtype=layout.dtype, family=layout.family, vocab_size=layout.vocab_size,
        tokenizer_fingerprint=ctx.tokenizer_fp, data_fingerprint=ctx.data_fp,
        num_workers=ctx.num_workers, documents=sum(p["documents"] for p in parts),
        invalid_utf8_lines=sum(p["invalid_utf8_lines"] for p in parts), splits=splits,
    )
    given = {e.source for e in splits["train"].shards if e.records}
    empty = [m.name for m in ctx.config.data.sources if m.name and m.name not in given]
    if empty:
        raise UserError(
            f"data.corpus: {empty[0]} gave no full training row of {layout.record_len} tokens",
            hint="add text to it, lower data.seq_len, or leave the entry out")
    if manifest.splits["train"].records == 0:
        raise UserError(
            f"the corpus gave no full training row of {layout.record_len} tokens "
            f"({manifest.documents} documents)",
            hint="add text or lower data.seq_len",
        )
    storage.write_text(records.manifest_path(ctx.config.output_dir), manifest.to_json())
    log.info("manifest: %d train / %d validation records in %d + %d shards, %d documents",
             splits["train"].records, splits["validation"].records,
             len(splits["train"].shards), len(splits["validation"].shards), manifest.documents)
    return manifest


def run_prepare(config: RunConfig, *, worker_index: int = 0, num_workers: int = 1,
                overwrite: bool = False) -> None:
    resolved = corpus.resolve_groups(config.data)
    sources = [s for _, group in resolved for s in group]
    corpus.check_apart(config.data, config.output_dir, sources)
    ownership.check_output_dir(config.output_dir)
    files = read_tokenizer_files(config)
    tok, tokenizer_fp = load_tokenizer(config, files)
    layout = layout_for(config, tok, family_tokens(config, tok, files))
    ownership.claim_output_dir(config.output_dir)
    ownership.check_writable(config.output_dir)
    ctx = _Context(
        config=config, tok=tok, tokenizer_fp=tokenizer_fp, layout=layout,
        data_fp=data_fingerprint(config, sources, layout, tokenizer_fp, num_workers),
        sources=sources,
        groups=[_Group(name, group, corpus.share(group, worker_index=worker_index,
                                                 num_workers=num_workers))
                for name, group in resolved],
        worker_index=worker_index, num_workers=num_workers,
    )
    made_by = None if overwrite else _prepared_with_another_count(ctx)
    if made_by is not None:
        log.info("data/ already holds this corpus prepared by %d workers; it serves any worker "
                 "count (--overwrite prepares it again with %d)", made_by, num_workers)
        return
    _guard_existing(ctx, overwrite)
    _clean_temporaries(ctx)
    if worker_index == 0:
        storage.write_text(config_path(config.output_dir), dump_config(config))
    part_path = ctx.path(records.worker_part_name(worker_index, num_workers))
    if storage.exists(part_path) and json.loads(storage.read_text(part_path)).get(
            "data_fingerprint") == ctx.data_fp:
        log.info("worker %d already prepared its share; nothing to do (--overwrite prepares it "
                 "again)", worker_index)
        finalize_manifest(ctx)
        return
    started = time.monotonic()
    shards = {}
    totals = (0, 0)
    for split in records.SPLITS:
        if split == "validation" and config.data.validation_fraction == 0:
            shards[split] = []  # nothing to hold out: no second pass over the input
            continue
        shards[split], split_totals = _prepare_split(ctx, split)
        if split == "train":
            totals = split_totals
    documents, invalid = totals
    if documents == 0:
        raise UserError(
            f"worker {worker_index} of {num_workers} has no documents to prepare",
            hint="the corpus has fewer documents than workers (or only blank lines); "
                 "use fewer workers or more text",
        )
    part = {**ctx.stamp(), "worker_index": worker_index, "documents": documents,
            "invalid_utf8_lines": invalid,
            "shards": {s: [asdict(e) for e in shards[s]] for s in records.SPLITS}}
    storage.write_text(part_path, json.dumps(part))
    tokens = sum(e.tokens for s in records.SPLITS for e in shards[s])
    elapsed = time.monotonic() - started
    log.info("worker %d: %d documents, %d tokens in %.1fs (%.0f tokens/s)%s", worker_index,
             documents, tokens, elapsed, tokens / max(elapsed, 1e-9),
             f", {invalid} lines with invalid UTF-8 replaced" if invalid else "")
    finalize_manifest(ctx)
