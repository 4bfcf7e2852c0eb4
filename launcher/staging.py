"""Local corpus files, uploaded once to content-addressed places in a bucket that TPU workers read.

    staged = stage_corpus(["./texts/a.txt", "./texts/*.jsonl"], bucket="my-bucket",
                          on_event=print)                     # ["gs://my-bucket/corpus/<h>/a.txt", ...]

A file goes to gs://BUCKET/corpus/<sha256 of its bytes>/<its name>: outside every run's
output_dir, shared by every run that reads the same bytes, and never deleted by tpuctl except by
`tpuctl down --delete-bucket`. A file already there with the same MD5 is skipped, so a second
run (or a rerun after an interrupted upload) uploads only what is missing; an object only
appears once its upload completed. Uploads run in parallel; `on_event` hears the progress.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from payload.core import layout, storage
from payload.core.errors import UserError

if TYPE_CHECKING:
    from payload.config import RunConfig

PREFIX = "corpus"
# What marks the staging area as tpuctl's own (see `tpuctl down --delete-bucket`).
OWNER_MARKER = f"{PREFIX}/{layout.OWN_DIR}/staged-by-tpuctl"
# corpus/.tpuctl/staged/RUN.json lists the objects RUN staged: `down --delete-bucket` deletes
# those of its own run that no other run's record lists, and nothing else under corpus/.
STAGED_RECORDS = f"{PREFIX}/{layout.OWN_DIR}/staged/"
PARALLEL = 8
CHUNK = 8 << 20


@dataclass(frozen=True)
class LocalFile:
    path: str
    size: int
    sha256: str
    md5_b64: str

    def object_name(self) -> str:
        return f"{PREFIX}/{self.sha256[:32]}/{os.path.basename(self.path)}"


def staged_record(run: str) -> str:
    return f"{STAGED_RECORDS}{run}.json"


def _record_staged(target, run: str, names: list[str]) -> None:
    """Add `names` to the run's staging record (written whole, after the uploads)."""
    import json

    from google.api_core import exceptions as gexc

    blob = target.blob(staged_record(run))
    try:
        known = json.loads(blob.download_as_bytes()).get("objects", [])
    except (gexc.NotFound, ValueError, AttributeError):  # none yet, or not a record of ours
        known = []
    merged = sorted(set(known) | set(names))
    if merged != sorted(known):
        blob.upload_from_string(json.dumps({"run": run, "objects": merged}, indent=1).encode())


def is_local(entry) -> bool:
    """Whether a corpus entry (a path, or a weighted entry) names files on this machine."""
    from payload.config.sections import entry_path

    return not entry_path(entry).startswith(("gs://", "hf:"))


def local_files(entries: list[str]) -> list[str]:
    """The files local corpus entries name (globs and folders expanded), in corpus order."""
    from payload.config import DataConfig
    from payload.data import corpus

    local = [e for e in entries if is_local(e)]
    if not local:
        return []
    return [s.path for s in corpus.resolve_sources(DataConfig(corpus=local))]


def fingerprint(path: str) -> LocalFile:
    sha, md5 = hashlib.sha256(), hashlib.md5()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return LocalFile(path=path, size=os.path.getsize(path), sha256=sha.hexdigest(),
                     md5_b64=base64.b64encode(md5.digest()).decode())


def staged_config(config: RunConfig, *,
                  on_event: Callable[[str], None] = lambda m: None) -> RunConfig:
    """The run config with its corpus staged (stage_corpus into cluster.bucket_name); the same
    config when no entry is a local file. gs:// and hf: entries are left as they are."""
    weighted = [e.path for e in config.data.corpus if not isinstance(e, str) and is_local(e.path)]
    if weighted:
        # Staging turns an entry into its files, one entry each: a weighted entry would then be
        # as many sources, under other names.
        raise UserError(f"data.corpus: the weighted entry {weighted[0]} is on this machine; "
                        "weighted entries are not staged to the bucket",
                        hint=f"copy its files to gs://{config.cluster.bucket_name}/FOLDER/ and "
                             "name that folder as the entry's path")
    pairs = _stage(config.data.corpus, bucket=config.cluster.bucket_name, run=config.name,
                   on_event=on_event)
    corpus = [copy for copy, _ in pairs]
    if corpus == list(config.data.corpus):
        return config
    # A staged copy is named as the entry it came from was (DataConfig.corpus_names).
    names = dict(config.data.corpus_names)
    names.update({copy: names.get(entry, entry) for copy, entry in pairs if copy != entry})
    data = config.data.model_copy(update={"corpus": corpus, "corpus_names": names})
    return config.model_copy(update={"data": data})


def stage_corpus(entries: list[str], *, bucket: str, run: str | None = None,
                 on_event: Callable[[str], None] = lambda m: None) -> list[str]:
    """The corpus with every local file replaced by its staged gs:// copy (uploaded if needed);
    `run`'s staging record lists them (what `down --delete-bucket` may delete)."""
    return [copy for copy, _ in _stage(entries, bucket=bucket, run=run, on_event=on_event)]


def _stage(entries: list, *, bucket: str, run: str | None,
           on_event: Callable[[str], None]) -> list[tuple[str, str]]:
    """stage_corpus's entries, each with the corpus entry it came from (each local entry's
    files expanded once, in corpus order)."""
    files_of = [local_files([entry]) if is_local(entry) else [] for entry in entries]
    paths = list(dict.fromkeys(path for files in files_of for path in files))
    if not paths:
        return [(entry, entry) for entry in entries]
    client = storage.client()
    target = client.bucket(bucket)
    files = [fingerprint(p) for p in paths]
    total = sum(f.size for f in files)
    done = {"bytes": 0, "uploaded": 0}
    lock = threading.Lock()

    def upload(item: LocalFile) -> None:
        blob = target.blob(item.object_name())
        existing = target.get_blob(item.object_name())
        if existing is not None and existing.size == item.size and existing.md5_hash == (
                item.md5_b64):
            outcome = "kept"
        else:
            blob.upload_from_filename(item.path, checksum="md5")
            outcome = "uploaded"
        with lock:
            done["bytes"] += item.size
            done["uploaded"] += outcome == "uploaded"
            on_event(f"staging the corpus: {done['bytes'] / 1e6:,.1f} of {total / 1e6:,.1f} MB "
                     f"({os.path.basename(item.path)} {outcome})")

    try:
        target.blob(OWNER_MARKER).upload_from_string(b"files under corpus/ were staged by "
                                                     b"tpuctl\n")
        # Recorded before the uploads: an interrupted staging leaves no object unlisted.
        if run:
            _record_staged(target, run, [f.object_name() for f in files])
        with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
            list(pool.map(upload, files))
    except OSError as exc:
        raise UserError(f"staging the corpus to gs://{bucket}/{PREFIX}/ failed: {exc}",
                        hint="rerun: files already uploaded are kept") from None
    on_event(f"corpus staged in gs://{bucket}/{PREFIX}/: {len(files)} files, "
             f"{done['uploaded']} uploaded, {len(files) - done['uploaded']} already there")
    by_path = {f.path: f"gs://{bucket}/{f.object_name()}" for f in files}
    return [pair for entry, local in zip(entries, files_of, strict=True)
            for pair in ([(by_path[path], entry) for path in local] if is_local(entry)
                         else [(entry, entry)])]
