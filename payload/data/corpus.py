"""Reading the corpus: resolve inputs, split them between workers, stream documents in batches.

    sources = resolve_sources(config.data)
    for batch in iter_batches(sources, share(sources, worker_index=1, num_workers=3), data):
        batch.texts, batch.cursor

How work is shared, so that every document goes to exactly one worker whatever the worker count:
- Plain `.txt` and `.jsonl` files (local or gs://) are split by bytes. All such files, in order,
  form one long byte range cut into `num_workers` equal parts; a document belongs to the part
  that holds its first byte. A worker reads only its part (plus the end of its last document).
- Files that cannot be entered in the middle (`.gz`, `.parquet`) and Hugging Face datasets are
  read by every worker, which keeps document k when k % num_workers == worker_index.
Invalid UTF-8 is replaced (U+FFFD) and counted per file, with the first offending byte offset
logged: one bad byte should not stop a day of preprocessing. Binary files (NUL bytes) are refused.
"""

from __future__ import annotations

import fnmatch
import gzip
import itertools
import json
import logging
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from payload.config import DataConfig
from payload.core import layout, storage
from payload.core.errors import UserError

log = logging.getLogger(__name__)

_BLOCK = 4 << 20  # bytes read at a time
_BATCH_BYTES = 1 << 20  # text handed to the tokenizer at a time
_BATCH_DOCS = 4096
_SNIFF = 8192
HF_PREFIX = "hf:"
# How many paths one data.corpus entry may reach (a glob's matches and the folders its ** walks
# through, or a folder's files): a corpus of more files than this is joined into fewer first,
# and an entry past it is nearly always a pattern rooted too high (~/**), walked for minutes.
MAX_CORPUS_PATHS = 100_000


@dataclass(frozen=True)
class Source:
    path: str
    kind: str  # "text" | "jsonl" | "parquet" | "hf"
    compressed: bool
    size: int

    @property
    def splittable(self) -> bool:
        return self.kind in ("text", "jsonl") and not self.compressed


@dataclass(frozen=True)
class Piece:
    """A worker's part of one source: a byte range [start, end), or every `stride`-th document."""

    source: int
    start: int = 0
    end: int = 0
    stride: tuple[int, int] | None = None  # (worker_index, num_workers)


@dataclass(frozen=True)
class Cursor:
    """Where a batch starts: a piece, and a byte offset (ranges) or document number (strides)."""

    piece: int
    offset: int

    def to_json(self) -> dict:
        return {"piece": self.piece, "offset": self.offset}

    @classmethod
    def from_json(cls, raw: dict) -> Cursor:
        return cls(piece=int(raw["piece"]), offset=int(raw["offset"]))


@dataclass
class Batch:
    cursor: Cursor
    texts: list[str]
    raw_bytes: int = 0
    # (documents, invalid UTF-8 lines) read before this batch's first document.
    stats_before: tuple[int, int] = (0, 0)


@dataclass
class ReadStats:
    documents: int = 0
    invalid_utf8_lines: int = 0
    # file -> byte offset of its first invalid UTF-8 (warned about once per file)
    files_with_invalid_utf8: dict[str, int] = field(default_factory=dict)


def _kind(path: str) -> tuple[str, bool]:
    name = path.lower()
    compressed = name.endswith(".gz")
    if compressed:
        name = name[:-3]
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl", compressed
    if name.endswith(".parquet"):
        return "parquet", compressed
    return "text", compressed


def resolve_sources(data: DataConfig) -> list[Source]:
    """Expand globs and folders; check every file exists and is not binary."""
    return [s for _, group in resolve_groups(data) for s in group]


def resolve_groups(data: DataConfig) -> list[tuple[str, list[Source]]]:
    """The files of each source of the mixture (DataConfig.sources: the pool of plain entries
    named "", each weighted entry by its path), in corpus order; a file reached by two sources
    is refused, since its records would be drawn under two weights."""
    groups: list[tuple[str, list[Source]]] = []
    owner: dict[str, str] = {}
    for mix in data.sources:
        sources: list[Source] = []
        for path in _group_paths(mix.paths):
            if path in owner and owner[path] != mix.name:
                first, second = sorted([owner[path] or "the plain entries", mix.name or
                                        "the plain entries"])
                raise UserError(f"data.corpus: {path} is reached by both {first} and {second}",
                                hint="name each file in one entry only")
            owner[path] = mix.name
            if path.startswith(HF_PREFIX):
                sources.append(Source(path=path, kind="hf", compressed=False, size=0))
                continue
            kind, compressed = _kind(path)
            source = Source(path=path, kind=kind, compressed=compressed,
                            size=storage.size(path))
            _check_not_binary(source)
            sources.append(source)
        groups.append((mix.name, sources))
    every = [s for _, group in groups for s in group]
    if not any(s.kind == "hf" for s in every) and all(s.size == 0 for s in every):
        raise UserError("the corpus is empty (every input file has 0 bytes)",
                        hint="check data.corpus")
    return groups


def _group_paths(entries: Iterable[str]) -> list[str]:
    """The hf: datasets entries name, then the files they reach, each once, in order."""
    datasets: list[str] = []
    paths: list[str] = []
    for entry in entries:
        if entry.startswith(HF_PREFIX):
            name = entry[len(HF_PREFIX):].strip()
            if not name:
                raise UserError(f"data.corpus: '{entry}' names no dataset",
                                hint="write hf:OWNER/NAME")
            datasets.append(entry)
            continue
        if storage.has_magic(entry):
            try:
                matches = storage.glob(entry, limit=MAX_CORPUS_PATHS)
            except storage.TooManyPaths:
                raise _too_many(entry) from None
            if not matches:
                raise UserError(f"data.corpus: no file matches '{entry}'",
                                hint="check the pattern and the working folder")
            paths.extend(matches)
        elif storage.exists(entry) and not storage.is_dir(entry):
            paths.append(entry)
        elif storage.is_dir(entry):
            found = list(itertools.islice(storage.walk_files(entry), MAX_CORPUS_PATHS + 1))
            if len(found) > MAX_CORPUS_PATHS:
                raise _too_many(entry)
            if not found:
                raise UserError(f"data.corpus: folder '{entry}' has no files")
            paths.extend(found)
        else:
            looks_like_dataset = "/" not in entry.rstrip("/").split("/")[-1] and not any(
                entry.endswith(s) for s in (".txt", ".gz", ".jsonl", ".parquet"))
            hint = ("for a Hugging Face dataset write hf:NAME" if looks_like_dataset
                    else "check the path (relative paths are relative to the config file)")
            raise UserError(f"data.corpus: no such file '{entry}'", hint=hint)
    return datasets + list(dict.fromkeys(paths))


def _too_many(entry: str) -> UserError:
    return UserError(f"data.corpus: '{entry}' reaches more than {MAX_CORPUS_PATHS:,} paths "
                     "(files, and the folders a ** pattern walks through)",
                     hint="point it at the corpus' own folder, or join small files into "
                     "fewer (a .jsonl of documents)")


def _parts(path: str) -> list[str]:
    """A path's components, for comparing where files lie (symlinks resolved locally)."""
    if storage.is_gcs(path):
        return [p for p in path[len(layout.GCS):].split("/") if p]
    return [p for p in os.path.realpath(path).split(os.sep) if p]


def _under(inner: list[str], outer: list[str]) -> bool:
    return inner[:len(outer)] == outer


def _pattern_reaches(pattern: list[str], folder: list[str]) -> bool:
    """Whether a glob (as components; `**` spans folders) can match a file inside `folder`."""
    if not folder:
        return bool(pattern)
    if not pattern:
        return False
    if pattern[0] == "**":
        return True
    return fnmatch.fnmatchcase(folder[0], pattern[0]) and _pattern_reaches(pattern[1:], folder[1:])


def check_apart(data: DataConfig, output_dir: str, sources: list[Source] | None = None) -> None:
    """Refuse a corpus and an output_dir that overlap: tpuctl writes and deletes in output_dir,
    and must never read its own output back as text (nor the corpus be deleted with it)."""
    out = _parts(output_dir)
    hint = "keep output_dir and the corpus apart (neither inside the other)"
    for entry in data.paths:
        if entry.startswith(HF_PREFIX) or storage.is_gcs(entry) != storage.is_gcs(output_dir):
            continue
        where = _parts(entry)
        if storage.has_magic(entry):
            if _under(where, out) or _pattern_reaches(where, out):
                raise UserError(f"data.corpus pattern {entry} can match files inside output_dir "
                                f"{output_dir}", hint=hint)
        elif where == out:
            raise UserError(f"output_dir {output_dir} is also a data.corpus input", hint=hint)
        elif _under(out, where):
            raise UserError(f"output_dir {output_dir} lies inside the data.corpus input {entry}",
                            hint=hint)
        elif _under(where, out):
            raise UserError(f"data.corpus input {entry} lies inside output_dir {output_dir}",
                            hint=hint)
    for source in sources or []:
        if source.kind != "hf" and storage.is_gcs(source.path) == storage.is_gcs(output_dir) \
                and _under(_parts(source.path), out):
            raise UserError(f"data.corpus file {source.path} lies inside output_dir "
                            f"{output_dir}", hint=hint)


def _check_not_binary(source: Source) -> None:
    if source.kind == "parquet" or source.size == 0:
        return
    try:
        with storage.open_read(source.path) as raw:
            if source.compressed:
                try:
                    head = gzip.GzipFile(fileobj=raw).read(_SNIFF)
                except (OSError, EOFError) as exc:
                    raise UserError(f"data.corpus: {source.path} is not a readable gzip file "
                                    f"({exc})") from None
            else:
                head = raw.read(_SNIFF)
    except PermissionError:
        raise UserError(f"data.corpus: cannot read {source.path} (permission denied)") from None
    nul = head.find(b"\x00")
    if nul >= 0:
        raise UserError(
            f"data.corpus: {source.path} looks binary (NUL byte at offset {nul})",
            hint="tpuctl reads UTF-8 text, .jsonl and .parquet files, optionally .gz",
        )


def share(sources: list[Source], *, worker_index: int, num_workers: int) -> list[Piece]:
    """The pieces of the corpus that worker `worker_index` of `num_workers` reads."""
    pieces: list[Piece] = []
    splittable = [(i, s) for i, s in enumerate(sources) if s.splittable]
    total = sum(s.size for _, s in splittable)
    lo = total * worker_index // num_workers
    hi = total * (worker_index + 1) // num_workers
    base = 0
    for i, source in splittable:
        start, end = max(lo, base), min(hi, base + source.size)
        if start < end:
            pieces.append(Piece(source=i, start=start - base, end=end - base))
        base += source.size
    for i, source in enumerate(sources):
        if not source.splittable:
            pieces.append(Piece(source=i, stride=(worker_index, num_workers)))
    return sorted(pieces, key=lambda p: p.source)


# --- reading ----------------------------------------------------------------------------------


class _Decoder:
    """UTF-8 decoding that replaces bad bytes; reports which lines had them."""

    def __init__(self, path: str, stats: ReadStats):
        self.path = path
        self.stats = stats

    def lines(self, block: bytes, base_offset: int) -> tuple[list[str], set[int]]:
        try:
            return block.decode("utf-8").split("\n"), set()
        except UnicodeDecodeError:
            pass
        out, bad = [], set()
        offset = base_offset
        for i, raw in enumerate(block.split(b"\n")):
            try:
                out.append(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                out.append(raw.decode("utf-8", errors="replace"))
                bad.add(i)
                if self.path not in self.stats.files_with_invalid_utf8:
                    self.stats.files_with_invalid_utf8[self.path] = offset + exc.start
                    log.warning("%s: invalid UTF-8 at byte %d, replaced with U+FFFD (lines "
                                "replaced are counted in the manifest)", self.path,
                                offset + exc.start)
            offset += len(raw) + 1
        return out, bad


def _too_long(path: str, offset: int, size: int, limit: int):
    return UserError(
        f"{path}: a document at byte {offset} is over {size / 1e6:.1f} MB "
        f"(data.max_document_mb={limit / 1e6:g})",
        hint="split the file into documents (data.document_split) or raise data.max_document_mb",
    )


def _line_blocks(f, path: str, start: int, end: int | None, limit: int):
    """Yield (offset, block) of whole lines whose first byte lies in [start, end).

    The line that straddles `start` belongs to the previous range, so reading begins at the
    first line that starts at or after `start`; the last line may run past `end`. With
    start 0 the file is read from where it stands (streams cannot seek).
    """
    pos = start
    if start > 0:
        first = _first_line_start(f, start)
        if first is None:
            return
        pos = first
        f.seek(pos)
    pending = b""
    while end is None or pos < end:
        chunk = f.read(_BLOCK)
        if not chunk:
            if pending:
                yield pos, pending
            return
        data = pending + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > limit:
                raise _too_long(path, pos, len(data), limit)
            pending = data
            continue
        block, pending = data[:cut + 1], data[cut + 1:]
        if end is not None and pos + len(block) > end:
            # Keep only lines starting before `end`: cut after the newline that ends the line
            # containing byte end-1.
            stop = block.find(b"\n", max(end - 1 - pos, 0))
            yield pos, block[:stop + 1]
            return
        yield pos, block
        pos += len(block)


def _previous_line_blank(f, line_start: int) -> bool:
    if line_start == 0:
        return True
    back = min(line_start, 1 << 16)
    f.seek(line_start - back)
    body = f.read(back)[:-1]  # drop the newline that ends the previous line
    nl = body.rfind(b"\n")
    if nl < 0 and back < line_start:
        return False  # a previous line over 64 KB is not blank
    return body[nl + 1:].strip() == b""


def _first_line_start(f, start: int) -> int | None:
    """Offset of the first line that begins at or after `start` (None: no such line)."""
    f.seek(start - 1)
    skipped = 0
    while True:
        chunk = f.read(1 << 16)
        if not chunk:
            return None
        nl = chunk.find(b"\n")
        if nl >= 0:
            return start - 1 + skipped + nl + 1
        skipped += len(chunk)


def _strip_newline(block: bytes) -> bytes:
    return block[:-1] if block.endswith(b"\n") else block


@dataclass
class _Paragraph:
    start: int = -1
    lines: list[str] = field(default_factory=list)
    size: int = 0
    bad: int = 0

    def take(self) -> tuple[int, str, int]:
        doc = (self.start, "\n".join(self.lines), self.bad)
        self.lines, self.size, self.bad = [], 0, 0
        return doc


# A document on its way out of a reader: (position, text, number of lines with bad UTF-8).
Doc = tuple[int, str, int]


class _LineDocuments:
    """Turns decoded lines into documents: one per line, or one per blank-line separated block."""

    def __init__(self, path: str, *, blank: bool, limit: int):
        self.path = path
        self.blank = blank
        self.limit = limit
        self.para = _Paragraph()

    def feed(self, lines: list[str], offsets: list[int], bad: set[int]) -> Iterator[Doc]:
        for i, line in enumerate(lines):
            text = line.rstrip("\r")
            if not self.blank:
                if text.strip():
                    if len(text) > self.limit:
                        raise _too_long(self.path, offsets[i], len(text), self.limit)
                    yield offsets[i], text, int(i in bad)
                continue
            if text.strip():
                if not self.para.lines:
                    self.para.start = offsets[i]
                self.para.lines.append(text)
                self.para.size += len(text) + 1
                self.para.bad += int(i in bad)
                if self.para.size > self.limit:
                    raise _too_long(self.path, self.para.start, self.para.size, self.limit)
            elif self.para.lines:
                yield self.para.take()

    def finish(self) -> Iterator[Doc]:
        if self.para.lines:
            yield self.para.take()


def _offsets(block_offset: int, block: bytes) -> list[int]:
    out = []
    pos = block_offset
    for raw in block.split(b"\n"):
        out.append(pos)
        pos += len(raw) + 1
    return out


def _json_text(line: str, path: str, where: str, column: str) -> str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError:
        raise UserError(f"{path}: {where} is not valid JSON",
                        hint="one JSON object per line (.jsonl)") from None
    if not isinstance(obj, dict) or column not in obj:
        keys = ", ".join(list(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
        raise UserError(f"{path}: {where} has no '{column}' field (has: {keys})",
                        hint="set data.text_column")
    value = obj[column]
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _as_json(docs: Iterator[Doc], source: Source, column: str) -> Iterator[Doc]:
    for pos, line, bad in docs:
        where = f"byte {pos}" if pos >= 0 else "a line"
        text = _json_text(line, source.path, where, column)
        if text.strip():
            yield pos, text, bad


def _range_documents(source: Source, piece: Piece, data: DataConfig, stats: ReadStats,
                     resume_offset: int | None) -> Iterator[Doc]:
    """Documents whose first byte lies in the piece's byte range, positioned by byte offset."""
    limit = int(data.max_document_mb * 1e6)
    decoder = _Decoder(source.path, stats)
    blank = source.kind == "text" and data.document_split == "blank_line"
    splitter = _LineDocuments(source.path, blank=blank, limit=limit)

    def raw_docs(f) -> Iterator[Doc]:
        start = piece.start if resume_offset is None else resume_offset
        skipping = False
        if blank and resume_offset is None and piece.start > 0:
            # Entering mid-file: leading lines may continue a paragraph owned by the range
            # before; skip them up to the next blank line.
            first = _first_line_start(f, piece.start)
            skipping = first is not None and not _previous_line_blank(f, first)
        # In blank-line mode the last paragraph may run past the range end; read on until the
        # first paragraph that starts at or after it.
        for block_offset, block in _line_blocks(f, source.path, start,
                                                None if blank else piece.end, limit):
            body = _strip_newline(block)
            lines, bad = decoder.lines(body, block_offset)
            offsets = _offsets(block_offset, body)
            if skipping:
                blank_at = next((i for i, line in enumerate(lines) if not line.strip()), None)
                if blank_at is None:
                    continue
                skipping = False
                lines, offsets = lines[blank_at:], offsets[blank_at:]
                bad = {i - blank_at for i in bad if i >= blank_at}
            yield from splitter.feed(lines, offsets, bad)
        yield from splitter.finish()

    with storage.open_read(source.path) as f:
        docs = raw_docs(f)
        if source.kind == "jsonl":
            docs = _as_json(docs, source, data.text_column)
        for doc in docs:
            if doc[0] >= piece.end:
                return
            yield doc


def _stream_documents(source: Source, data: DataConfig, stats: ReadStats) -> Iterator[Doc]:
    """Every document of a source read from its start (.gz, .parquet, hf:); position -1."""
    if source.kind == "hf":
        yield from ((-1, t, 0) for t in _hf_documents(source, data))
        return
    limit = int(data.max_document_mb * 1e6)
    with storage.open_read(source.path) as raw:
        f = gzip.GzipFile(fileobj=raw) if source.compressed else raw
        if source.kind == "parquet":
            yield from ((-1, t, 0) for t in _parquet_documents(f, source, data))
            return
        decoder = _Decoder(source.path, stats)
        blank = source.kind == "text" and data.document_split == "blank_line"
        splitter = _LineDocuments(source.path, blank=blank, limit=limit)

        def raw_docs() -> Iterator[Doc]:
            for offset, block in _line_blocks(f, source.path, 0, None, limit):
                body = _strip_newline(block)
                lines, bad = decoder.lines(body, offset)
                yield from splitter.feed(lines, _offsets(offset, body), bad)
            yield from splitter.finish()

        docs = raw_docs()
        if source.kind == "jsonl":
            docs = _as_json(docs, source, data.text_column)
        try:
            yield from docs
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise UserError(f"data.corpus: {source.path} is a damaged gzip file ({exc})") \
                from None


def _parquet_documents(f, source: Source, data: DataConfig) -> Iterator[str]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
    except Exception as exc:  # pyarrow raises ArrowInvalid and friends
        raise UserError(f"data.corpus: {source.path} is not a readable parquet file ({exc})") \
            from None
    names = pf.schema_arrow.names
    if data.text_column not in names:
        raise UserError(f"{source.path} has no column '{data.text_column}' (has: "
                        f"{', '.join(names[:8])})", hint="set data.text_column")
    for batch in pf.iter_batches(columns=[data.text_column], batch_size=4096):
        for value in batch.column(0).to_pylist():
            if value and str(value).strip():
                yield str(value)


def _hf_documents(source: Source, data: DataConfig) -> Iterator[str]:
    name = source.path[len(HF_PREFIX):]
    try:
        import datasets

        ds = datasets.load_dataset(name, data.hf_config, split=data.hf_split, streaming=True)
    except Exception as exc:  # offline, unknown name, gated: datasets raises many types
        first = (str(exc).splitlines() or [""])[0][:200]
        raise UserError(f"data.corpus: cannot load Hugging Face dataset '{name}' "
                        f"({type(exc).__name__}: {first})",
                        hint="check the name, data.hf_config, data.hf_split and the network"
                        ) from None
    for row in ds:
        if data.text_column not in row:
            raise UserError(f"dataset '{name}' has no column '{data.text_column}' (has: "
                            f"{', '.join(list(row)[:8])})", hint="set data.text_column")
        value = row[data.text_column]
        if value and str(value).strip():
            yield str(value)


def piece_documents(sources: list[Source], piece: Piece, data: DataConfig, stats: ReadStats,
                    resume: int | None = None) -> Iterator[Doc]:
    """The documents of one piece, positioned so that `resume=position` restarts at one."""
    source = sources[piece.source]
    if piece.stride is None:
        yield from _range_documents(source, piece, data, stats, resume)
        return
    index, count = piece.stride
    for k, (_, text, bad) in enumerate(_stream_documents(source, data, stats)):
        if k % count == index and (resume is None or k >= resume):
            yield k, text, bad


def iter_batches(sources: list[Source], pieces: list[Piece], data: DataConfig, *,
                 stats: ReadStats | None = None, start: Cursor | None = None,
                 keep=None) -> Iterator[Batch]:
    """Batches of this worker's documents in a fixed order, each with a cursor to resume from.

    `keep(text) -> bool` filters documents (the train/validation split); `start` resumes at a
    cursor that an earlier batch reported. `stats` counts every document read (kept or not).
    """
    stats = stats if stats is not None else ReadStats()
    for p_index, piece in enumerate(pieces):
        if start is not None and p_index < start.piece:
            continue
        resume = start.offset if (start is not None and p_index == start.piece) else None
        batch: Batch | None = None
        for position, text, bad in piece_documents(sources, piece, data, stats, resume):
            before = (stats.documents, stats.invalid_utf8_lines)
            stats.documents += 1
            stats.invalid_utf8_lines += bad
            if keep is not None and not keep(text):
                continue
            if batch is None:
                batch = Batch(Cursor(p_index, position), [], 0, stats_before=before)
            batch.texts.append(text)
            batch.raw_bytes += len(text)
            if batch.raw_bytes >= _BATCH_BYTES or len(batch.texts) >= _BATCH_DOCS:
                yield batch
                batch = None
        if batch is not None:
            yield batch


def check_sample(sources: list[Source], data: DataConfig, documents: int = 8) -> None:
    """Read the first documents of every .jsonl and .parquet input, so a missing text field or
    column is refused before a job starts rather than by its workers."""
    stats = ReadStats()
    for i, source in enumerate(sources):
        if source.kind not in ("jsonl", "parquet") or source.size == 0:
            continue
        whole = (Piece(source=i, start=0, end=source.size) if source.splittable
                 else Piece(source=i, stride=(0, 1)))
        docs = piece_documents(sources, whole, data, stats)
        try:
            for _ in itertools.islice(docs, documents):
                pass
        finally:
            docs.close()


def check_shares(sources: list[Source], data: DataConfig, *, num_workers: int, keep) -> None:
    """Every worker's share holds a training document (`keep(text)`: not held out), as prepare
    requires: a one-line corpus on two workers is refused before a job starts, not by worker 1
    once it has. Reads each share only up to its first such document; datasets are skipped (they
    need the network, and their workers' shares are known only by reading them)."""
    if any(s.kind == "hf" for s in sources):
        return
    stats = ReadStats()
    for index in range(num_workers):
        found = False
        for piece in share(sources, worker_index=index, num_workers=num_workers):
            docs = piece_documents(sources, piece, data, stats)
            try:
                found = any(keep(text) for _, text, _ in docs)
            finally:
                docs.close()
            if found:
                break
        if not found:
            raise UserError(
                f"worker {index} of {num_workers} would have no documents to prepare",
                hint="the corpus has fewer documents than workers (or only blank lines); "
                     "use fewer workers or more text")


class ByteCounter:
    """Counts documents and characters flowing through an iterator."""

    def __init__(self):
        self.documents = 0
        self.bytes = 0

    def count(self, texts: Iterable[str]) -> Iterator[str]:
        for text in texts:
            self.documents += 1
            self.bytes += len(text)
            yield text


def sample_documents(sources: list[Source], data: DataConfig, max_bytes: int | None
                     ) -> Iterator[str]:
    """Documents for tokenizer training: from every source, its size-proportional share of
    `max_bytes` (all documents when None), read from the source's start."""
    total = sum(s.size for s in sources) or 1
    stats = ReadStats()
    for i, source in enumerate(sources):
        share_of_total = source.size / total if source.kind != "hf" else 1 / len(sources)
        budget = None if max_bytes is None else max(int(max_bytes * share_of_total), 1)
        whole = Piece(source=i, start=0, end=source.size) if source.splittable else Piece(
            source=i, stride=(0, 1))
        taken = 0
        for _, text, _ in piece_documents(sources, whole, data, stats):
            yield text
            taken += len(text)
            if budget is not None and taken >= budget:
                break
