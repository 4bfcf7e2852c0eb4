"""Files under `output_dir` and corpus paths, local or `gs://`, behind one small interface.

    write_bytes(layout.manifest_path(out), payload)            # atomic on both
    for path in glob("gs://bucket/texts/*.txt"): ...

Local writes go to a temporary name in the same folder and are renamed into place; a GCS object
only becomes visible when its upload completes, so both give readers all or nothing. Only this
module talks to Cloud Storage. What tpuctl may write and delete in is payload.core.ownership's
rule; which folders readers may trust whole, and how one is replaced, payload.core.folders'.
"""

from __future__ import annotations

import contextlib
import errno
import glob as _glob
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from typing import IO, NoReturn

from payload.core import layout
from payload.core.errors import UserError

# The layout's path rules, which every caller of this module spells as storage.join.
is_gcs, join = layout.is_gcs, layout.join


def _split_gcs(path: str) -> tuple[str, str]:
    bucket, _, name = path[len(layout.GCS):].partition("/")
    if not bucket:
        raise UserError(f"'{path}' has no bucket name", hint="write gs://BUCKET/PATH")
    return bucket, name


_client = None


def _gcs():
    """A Cloud Storage client (anonymous against STORAGE_EMULATOR_HOST, as the library does)."""
    global _client
    if _client is None:
        try:
            from google.auth.exceptions import DefaultCredentialsError
            from google.cloud import storage
        except ImportError:
            raise UserError(
                "gs:// paths need google-cloud-storage", hint="pip install 'tpuctl[worker]'"
            ) from None
        try:
            _client = storage.Client()
        except DefaultCredentialsError:
            raise UserError(
                "no Google Cloud credentials for gs:// paths",
                hint="run `gcloud auth application-default login` or set "
                "GOOGLE_APPLICATION_CREDENTIALS",
            ) from None
    return _client


EMULATOR_ENV = "STORAGE_EMULATOR_HOST"  # google-cloud-storage's own setting for a stand-in


def forwarded_env() -> tuple[tuple[str, str], ...]:
    """What the launcher passes on to every stage so workers use the same Cloud Storage (a
    stand-in the launcher was pointed at, in tests)."""
    host = os.environ.get(EMULATOR_ENV)
    return ((EMULATOR_ENV, host),) if host else ()


def client(project: str | None = None):
    """The Cloud Storage client this module uses (for callers that manage buckets)."""
    del project  # one client serves every project the credentials may use
    return _gcs()


def _blob(path: str):
    bucket, name = _split_gcs(path)
    return _gcs().bucket(bucket).blob(name)


def exists(path: str) -> bool:
    if is_gcs(path):
        return _blob(path).exists()
    return os.path.exists(path)


def size(path: str) -> int:
    if is_gcs(path):
        blob = _blob(path)
        blob.reload()
        return int(blob.size or 0)
    return os.path.getsize(path)


def open_read(path: str) -> IO[bytes]:
    if is_gcs(path):
        return _blob(path).open("rb", chunk_size=8 << 20)
    return open(path, "rb")


def read_bytes(path: str) -> bytes:
    if is_gcs(path):
        return _blob(path).download_as_bytes()
    with open(path, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def disk_full(exc: Exception) -> bool:
    # h5py raises OSError without an errno, or RuntimeError; their text says what happened.
    text = str(exc)
    return getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or any(
        s in text for s in ("No space left", "errno = 28", "File too large", "errno = 27"))


def raise_disk_error(exc: OSError, path: str) -> NoReturn:
    text = str(exc)
    if disk_full(exc):
        raise UserError(
            f"no space left writing {path}",
            hint="free space or point output_dir somewhere larger, then rerun (finished work is kept)",
        ) from None
    reason = exc.strerror or (text.splitlines() or ["error"])[0]
    raise UserError(f"cannot write {path}: {reason}", hint="choose a writable output_dir") from None


# --- a test hook: count the changes made through this module, kill the process at one -------
# TPUCTL_TEST_KILL_AT=N SIGKILLs this process just before its N-th change (write, rename,
# removal); TPUCTL_TEST_WRITE_LOG=FILE appends one line per change. The crash-consistency test
# uses them to stop a stage at every point where a crash can leave files behind.
_changes = 0


def note_change(what: str, path: str) -> None:
    """Count one change to storage (also called for writes other libraries make, such as
    TensorFlow's checkpoints, so the test hook can stop the process before them)."""
    global _changes
    kill_at = os.environ.get("TPUCTL_TEST_KILL_AT")
    record = os.environ.get("TPUCTL_TEST_WRITE_LOG")
    if not (kill_at or record):
        return
    _changes += 1
    if record:
        with open(record, "a", encoding="utf-8") as f:
            f.write(f"{_changes} {what} {path}\n")
    if kill_at and int(kill_at) == _changes:
        os.kill(os.getpid(), signal.SIGKILL)


def file_mode() -> int:
    """What a new file's mode is under this process's umask (mkstemp's 0600 would survive the
    rename and hide logs, shards and models from teammates and from NFS hosts with other uids)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it (and put it back at once)
    os.umask(mask)
    return 0o666 & ~mask


def _mkstemp(folder: str, name: str) -> tuple[int, str]:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix="-" + name)
    os.fchmod(fd, file_mode())
    return fd, tmp


def makedirs(path: str) -> None:
    if is_gcs(path):
        return  # GCS has no folders; objects carry the full path.
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise_disk_error(exc, path)


def write_bytes(path: str, data: bytes) -> None:
    """Write all of `data` to `path` or nothing: readers never see a partial file."""
    note_change("write", path)
    if is_gcs(path):
        _blob(path).upload_from_string(data)
        return
    parent = os.path.dirname(path) or "."
    makedirs(parent)
    try:
        fd, tmp = _mkstemp(parent, os.path.basename(path))
    except OSError as exc:
        raise_disk_error(exc, path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        _remove_quietly(tmp)
        raise_disk_error(exc, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def create_exclusive(path: str, data: bytes, *, replacing: bytes | None = None) -> bool:
    """Create `path` holding `data` only if it does not exist (or, given `replacing`, only if it
    still holds exactly those bytes), in one atomic step: of two writers racing, exactly one
    gets True. Readers see all of `data` or no file. gs:// uses a generation precondition
    (`if_generation_match`: 0 for "no object yet"); a local disk links a finished temporary file
    into place (link(2) fails on an existing name, like O_EXCL, which is used where a filesystem
    has no hard links), and replaces by renaming the old file aside, checking it, then creating.
    """
    if is_gcs(path):
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = _blob(path)
        generation = 0
        try:
            if replacing is not None:
                blob.reload()
                generation = blob.generation
                held = _blob(path).download_as_bytes(if_generation_match=generation)
                if held != replacing:
                    return False
            blob.upload_from_string(data, if_generation_match=generation)
        except (NotFound, PreconditionFailed):
            return False
        return True
    parent = os.path.dirname(path) or "."
    makedirs(parent)
    if replacing is not None and not _remove_local_if(path, replacing):
        return False
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".tmp-", suffix="-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise_disk_error(exc, path)
            try:  # no hard links here (gcsfuse): an exclusive create, then the bytes
                created = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(created, "wb") as f:
                f.write(data)
        return True
    finally:
        _remove_quietly(tmp)


def publish_file(local_tmp: str, path: str) -> None:
    """Move a finished local file to `path` atomically (rename locally, upload for GCS)."""
    note_change("publish", path)
    if is_gcs(path):
        try:
            _blob(path).upload_from_filename(local_tmp)
        finally:
            _remove_quietly(local_tmp)
        return
    makedirs(os.path.dirname(path) or ".")
    try:
        os.replace(local_tmp, path)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            _remove_quietly(local_tmp)
            raise_disk_error(exc, path)
        # Different filesystems: copy next to the target, then rename there.
        try:
            fd, staged = _mkstemp(os.path.dirname(path), os.path.basename(path))
            os.close(fd)
        except OSError as copy_exc:
            _remove_quietly(local_tmp)
            raise_disk_error(copy_exc, path)
        try:
            shutil.copyfile(local_tmp, staged)
            os.replace(staged, path)
        except OSError as copy_exc:
            _remove_quietly(staged)
            raise_disk_error(copy_exc, path)
        finally:
            _remove_quietly(local_tmp)


def upload_file(local: str, path: str) -> None:
    """Upload the local file `local` to the gs:// object `path` (the local file stays)."""
    note_change("publish", path)
    _blob(path).upload_from_filename(local)


def staging_file(path: str) -> tuple[IO[bytes], str]:
    """An open temporary file to build `path` in; hand its name to `publish_file` when done."""
    folder = tempfile.gettempdir() if is_gcs(path) else (os.path.dirname(path) or ".")
    makedirs(folder)
    try:
        fd, tmp = _mkstemp(folder, os.path.basename(path))
    except OSError as exc:
        raise_disk_error(exc, path)
    return os.fdopen(fd, "wb"), tmp


def remove(path: str) -> None:
    note_change("remove", path)
    if is_gcs(path):
        from google.api_core import exceptions

        with contextlib.suppress(exceptions.NotFound):  # gone already, like a local remove
            _blob(path).delete()
        return
    _remove_quietly(path)


def remove_if(path: str, holding: bytes) -> bool:
    """Remove `path` only if it still holds exactly `holding`, in one atomic step (the
    counterpart of create_exclusive's `replacing`): a file someone else has written since it
    was read is left as it is. Whether it removed it."""
    note_change("remove", path)
    if is_gcs(path):
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = _blob(path)
        try:
            blob.reload()
            generation = blob.generation
            if _blob(path).download_as_bytes(if_generation_match=generation) != holding:
                return False
            blob.delete(if_generation_match=generation)
        except (NotFound, PreconditionFailed):
            return False
        return True
    return _remove_local_if(path, holding)


def _remove_local_if(path: str, holding: bytes) -> bool:
    """The local side of `remove_if` (and of create_exclusive's `replacing`): rename the file
    aside, so no other writer can change it while it is compared, and put it back if it is
    someone else's by now (unless a newer one is there already)."""
    aside = f"{path}.{os.getpid()}-{os.urandom(4).hex()}.old"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    with open(aside, "rb") as f:
        held = f.read()
    if held != holding:
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
        _remove_quietly(aside)
        return False
    _remove_quietly(aside)
    return True


def remove_tree(path: str) -> None:
    note_change("remove-tree", path)
    if is_gcs(path):
        bucket, prefix = _split_gcs(path)
        for blob in _gcs().list_blobs(bucket, prefix=prefix.rstrip("/") + "/"):
            blob.delete()
        return
    shutil.rmtree(path, ignore_errors=True)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def listdir(path: str) -> list[str]:
    """Full paths of the files directly under `path` (sorted); empty if it does not exist."""
    if is_gcs(path):
        bucket, prefix = _split_gcs(path)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        blobs = _gcs().list_blobs(bucket, prefix=prefix, delimiter="/")
        # An object named like the folder itself ("dir/") is a folder marker (TensorFlow's
        # makedirs writes them), not a file; nor is a completeness marker.
        return sorted(f"{layout.GCS}{bucket}/{b.name}" for b in blobs
                      if not b.name.endswith(("/", "/" + layout.COMPLETE)))
    if not os.path.isdir(path):
        return []
    return sorted(
        os.path.join(path, name) for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name)) and not name.startswith(".tmp-")
        and name != layout.COMPLETE
    )


def sizes(path: str) -> dict[str, int]:
    """Size of every file directly under `path`, by name: one listing (one request on gs://,
    where asking file by file costs a round trip each)."""
    if is_gcs(path):
        bucket, prefix = _split_gcs(path)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        return {b.name[len(prefix):]: int(b.size or 0)
                for b in _gcs().list_blobs(bucket, prefix=prefix, delimiter="/")
                if not b.name.endswith("/")}
    if not os.path.isdir(path):
        return {}
    found = {}
    for entry in os.scandir(path):
        # Another worker's temporary file can be renamed between the listing and its stat.
        if entry.name.startswith(".tmp-"):
            continue
        with contextlib.suppress(FileNotFoundError):
            if entry.is_file():
                found[entry.name] = entry.stat().st_size
    return found


PARALLEL_READS = 16


def read_many(paths: list[str]) -> list[bytes | None]:
    """Read several files, in parallel on gs:// (latency, not bandwidth, is what costs there);
    None for one that is gone by the time it is read."""

    def read(path: str) -> bytes | None:
        try:
            return read_bytes(path)
        except FileNotFoundError:
            return None
        except Exception as exc:
            if type(exc).__name__ == "NotFound":  # google.api_core's, for a gs:// object
                return None
            raise

    if not paths or not is_gcs(paths[0]):
        return [read(p) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(PARALLEL_READS, len(paths))) as pool:
        return list(pool.map(read, paths))


def read_ranges(ranges: list[tuple[str, int, int]]) -> list[bytes]:
    """(path, offset, length) byte ranges of files, in order; on gs:// ranged reads, several
    at once (a training host reads its rows of a batch this way, from the shards' offsets)."""

    def read(item: tuple[str, int, int]) -> bytes:
        path, offset, length = item
        if is_gcs(path):
            return _blob(path).download_as_bytes(start=offset, end=offset + length - 1)
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(length)

    if len(ranges) < 2 or not is_gcs(ranges[0][0]):
        return [read(r) for r in ranges]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(PARALLEL_READS, len(ranges))) as pool:
        return list(pool.map(read, ranges))


def list_tree(path: str) -> list[str]:
    """Every file under `path`, hidden ones included, as sorted paths relative to it."""
    if is_gcs(path):
        bucket, prefix = _split_gcs(path)
        prefix = prefix.rstrip("/") + "/"
        return sorted(b.name[len(prefix):] for b in _gcs().list_blobs(bucket, prefix=prefix)
                      if not b.name.endswith("/"))
    found = []
    for root, _dirs, files in os.walk(path):
        found += [os.path.relpath(os.path.join(root, name), path) for name in files]
    return sorted(found)


def children(path: str) -> list[str]:
    """Names of the files and folders directly under `path` (empty if it does not exist)."""
    if is_gcs(path):
        bucket, prefix = _split_gcs(path)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        pages = _gcs().list_blobs(bucket, prefix=prefix, delimiter="/")
        names = {b.name[len(prefix):] for b in pages}
        names |= {p[len(prefix):].rstrip("/") for p in pages.prefixes}
        return sorted(n for n in names if n)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


class TooManyPaths(Exception):
    """A glob or folder walk went past its limit of paths (glob's `limit`)."""

    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


def glob(pattern: str, *, limit: int | None = None) -> list[str]:
    """Files matching a glob, sorted; `**` recurses. On gs:// with the local rules: `*`, `?`
    and `[...]` stay within one folder level and skip names starting with a dot. With `limit`,
    TooManyPaths as soon as more paths than that match (the folders `**` passes through count
    too: they are the walk's work), before the rest of the tree is looked at."""
    if is_gcs(pattern):
        bucket, name = _split_gcs(pattern)
        literal = name.split("*")[0].split("?")[0].split("[")[0]
        matches = _glob_regex(name).match
        found = (f"{layout.GCS}{bucket}/{b.name}" for b in _gcs().list_blobs(bucket, prefix=literal)
                 if matches(b.name) and not b.name.endswith("/"))  # not folder markers
        return sorted(_at_most(found, limit))
    paths = _at_most(_glob.iglob(pattern, recursive=True), limit)
    return sorted(p for p in paths if os.path.isfile(p))


def _at_most(paths: Iterator[str], limit: int | None) -> list[str]:
    found = []
    for path in paths:
        if limit is not None and len(found) >= limit:
            raise TooManyPaths(limit)
        found.append(path)
    return found


def _glob_regex(pattern: str) -> re.Pattern:
    """The object names `glob.glob(pattern, recursive=True)` would give as files."""
    visible = r"(?:(?!\.)[^/]+/)*"  # `**`: any number of folder levels, none hidden
    parts = pattern.split("/")
    out = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part == "**":
            out.append(visible + (r"(?!\.)[^/]+" if last else ""))
            continue
        hidden = "" if part.startswith(".") else r"(?!\.)"
        out.append(hidden + _component_regex(part) + ("" if last else "/"))
    return re.compile("".join(out) + r"\Z")


def _component_regex(part: str) -> str:
    out, i = [], 0
    while i < len(part):
        c = part[i]
        close = part.find("]", i + 2) if c == "[" else -1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif close > 0:
            body = part[i + 1:close]
            negate = body[:1] == "!"
            body = re.escape(body[1:] if negate else body).replace("\\-", "-")
            out.append(f"[{'^/' if negate else ''}{body}]")
            i = close
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")


def walk_files(path: str) -> Iterator[str]:
    """Every file under a folder, sorted, hidden files skipped."""
    if is_gcs(path):
        for rest in list_tree(path):
            if rest and not any(p.startswith(".") for p in rest.split("/")):
                yield join(path, rest)
        return
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                yield os.path.join(root, name)


def is_dir(path: str) -> bool:
    if is_gcs(path):
        bucket, prefix = _split_gcs(path)
        return any(True for _ in _gcs().list_blobs(bucket, prefix=prefix.rstrip("/") + "/",
                                                   max_results=1))
    return os.path.isdir(path)


def not_a_folder(path: str) -> str | None:
    """Why `path` is no folder to read from ("does not exist", "is a file"), None when it is
    one: for a folder given in the config whose expected file is missing, so that the line
    names what is really wrong."""
    if is_dir(path):
        return None
    return "is a file, not a folder" if exists(path) else "does not exist"


@contextlib.contextmanager
def bucket_errors(path: str) -> Iterator[None]:
    """A missing bucket or a refused write on gs:// as one line naming what to do (output_dir
    is the path that was written)."""
    if not is_gcs(path):
        yield
        return
    from google.api_core import exceptions

    try:
        yield
    except exceptions.NotFound:
        bucket = _split_gcs(path)[0]
        raise UserError(f"bucket gs://{bucket} does not exist (output_dir {path})",
                        hint=f"create it (gcloud storage buckets create gs://{bucket}) "
                        "or fix output_dir") from None
    except exceptions.Forbidden:
        raise UserError(f"no permission to write to {path}",
                        hint="grant the account Storage Object Admin on the bucket") from None
