"""Files under `output_dir` and corpus paths, local or `gs://`, behind one small interface.

    write_bytes(layout.manifest_path(out), payload)            # atomic on both
    for path in glob("gs://bucket/texts/*.txt"): ...

Local writes go to a temporary name in the same folder and are renamed into place; a GCS object
only becomes visible when its upload completes, so both give readers all or nothing. Only this
module talks to Cloud Storage.

Folders are owned and complete by markers this module writes:
- `output_dir/.tpuctl/owner`: tpuctl made (or adopted) this output_dir; it deletes only in
  folders that carry it (`claim_output_dir`, `remove_owned`).
- `FOLDER/.tpuctl-complete`, written last: the folder is whole (`mark_complete`,
  `is_complete`). A folder cannot be swapped on gs://, so every reader of a folder that is
  replaced or cleared (checkpoints, model/) requires it; locally `replacing_folder` also swaps
  the new folder in with renames, so a crash leaves the old folder or the new one.
"""

from __future__ import annotations

import contextlib
import errno
import glob as _glob
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import IO, NoReturn

from payload.core import layout
from payload.core.errors import UserError

# Named in the layout; kept here too because callers say storage.COMPLETE, storage.join.
GCS, COMPLETE, OWN_DIR, OWNER = layout.GCS, layout.COMPLETE, layout.OWN_DIR, layout.OWNER
is_gcs, join = layout.is_gcs, layout.join

log = logging.getLogger(__name__)


def _split_gcs(path: str) -> tuple[str, str]:
    bucket, _, name = path[len(GCS):].partition("/")
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


def _disk_full(exc: Exception) -> bool:
    # h5py raises OSError without an errno, or RuntimeError; their text says what happened.
    text = str(exc)
    return getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or any(
        s in text for s in ("No space left", "errno = 28", "File too large", "errno = 27"))


def raise_disk_error(exc: OSError, path: str) -> NoReturn:
    text = str(exc)
    if _disk_full(exc):
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


def _file_mode() -> int:
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
    os.fchmod(fd, _file_mode())
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
        return sorted(f"{GCS}{bucket}/{b.name}" for b in blobs
                      if not b.name.endswith(("/", "/" + COMPLETE)))
    if not os.path.isdir(path):
        return []
    return sorted(
        os.path.join(path, name) for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name)) and not name.startswith(".tmp-")
        and name != COMPLETE
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


def _children(path: str) -> list[str]:
    """Names of the files and folders directly under `path` (empty if it does not exist)."""
    if is_gcs(path):
        bucket, prefix = _split_gcs(path)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        pages = _gcs().list_blobs(bucket, prefix=prefix, delimiter="/")
        names = {b.name[len(prefix):] for b in pages}
        names |= {p[len(prefix):].rstrip("/") for p in pages.prefixes}
        return sorted(n for n in names if n)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def glob(pattern: str) -> list[str]:
    """Files matching a glob, sorted; `**` recurses. On gs:// with the local rules: `*`, `?`
    and `[...]` stay within one folder level and skip names starting with a dot."""
    if is_gcs(pattern):
        bucket, name = _split_gcs(pattern)
        literal = name.split("*")[0].split("?")[0].split("[")[0]
        matches = _glob_regex(name).match
        return sorted(
            f"{GCS}{bucket}/{b.name}" for b in _gcs().list_blobs(bucket, prefix=literal)
            if matches(b.name) and not b.name.endswith("/")  # not folder markers
        )
    return sorted(p for p in _glob.glob(pattern, recursive=True) if os.path.isfile(p))


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


def check_writable(path: str) -> None:
    """Fail early, with a clear message, if `path` cannot take output."""
    # One name per host: a probe left by a killed run is replaced, then removed, by the next.
    probe = join(path, OWN_DIR, f"write-probe-{socket.gethostname()}")
    if not is_gcs(path) and os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"output_dir {path} is a file, not a folder",
                        hint="choose a folder path for output_dir")
    with _bucket_errors(path):
        write_bytes(probe, b"probe")
    remove(probe)


@contextlib.contextmanager
def _bucket_errors(path: str) -> Iterator[None]:
    """A missing bucket or a refused write on gs:// as one line naming what to do."""
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


# --- ownership: tpuctl deletes only in an output_dir it marked as its own ---------------------

_WORKER_LOG = re.compile(r"^worker-\d+\.log\Z")


def owner_marker(output_dir: str) -> str:
    return join(output_dir, OWN_DIR, OWNER)


def _strangers(output_dir: str) -> list[str]:
    """What is in output_dir that tpuctl's launcher did not put there before the stages ran
    (its `.tpuctl/` folder, write probes, `logs/worker-N.log`)."""
    found = []
    for name in _children(output_dir):
        if name == OWN_DIR or name.startswith(f"{OWN_DIR}-write-probe-"):
            continue
        if name == layout.LOGS_DIR and all(_WORKER_LOG.match(n) for n in _children(join(output_dir, name))):
            continue
        found.append(name)
    return found


def _earlier_run(output_dir: str) -> bool:
    """A run made before ownership markers: its resolved config.yaml names this output_dir."""
    import yaml

    path = layout.config_path(output_dir)
    try:
        raw = yaml.safe_load(read_text(path)) if exists(path) else None
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return False
    return isinstance(raw, dict) and raw.get("output_dir") == output_dir


def _check_not_a_file(output_dir: str) -> None:
    if is_gcs(output_dir):
        return
    probe = os.path.abspath(output_dir)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if os.path.exists(probe) and not os.path.isdir(probe):
        where = "" if probe == os.path.abspath(output_dir) else f": {probe}"
        raise UserError(f"output_dir {output_dir}{where} is a file, not a folder",
                        hint="choose a folder path for output_dir")


def check_output_dir(output_dir: str) -> bool:
    """Refuse an output_dir tpuctl may not write in; True when it is already tpuctl's.

    It may write in a folder that carries its owner marker, that does not exist or is empty, or
    that an earlier tpuctl run made. Anything else is someone's folder: pointing output_dir at
    it must not lose a file, so nothing is written there at all. Writes nothing."""
    _check_not_a_file(output_dir)
    marker = owner_marker(output_dir)
    with _bucket_errors(output_dir):
        if exists(marker):
            return True
        strangers = _strangers(output_dir)
        # Checked again: another worker claiming the folder writes its marker before anything.
        if not strangers or exists(marker) or _earlier_run(output_dir):
            return exists(marker)
    shown = ", ".join(strangers[:3]) + (f" and {len(strangers) - 3} more" if len(strangers) > 3
                                        else "")
    raise UserError(
        f"output_dir {output_dir} already holds files that tpuctl did not write ({shown})",
        hint="point output_dir at a new or empty folder: tpuctl writes and deletes only in "
             f"folders it made (marked {OWN_DIR}/{OWNER})",
    )


def claim_output_dir(output_dir: str) -> None:
    """Make output_dir tpuctl's (the owner marker, first of anything) or refuse it: every stage
    calls this before it writes."""
    if check_output_dir(output_dir):
        return
    from payload import __version__

    with _bucket_errors(output_dir):
        write_text(owner_marker(output_dir), json.dumps(
            {"tool": "tpuctl", "version": __version__, "host": socket.gethostname(),
             "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1) + "\n")


def check_no_link(output_dir: str, folder: str) -> None:
    """Refuse to write or delete in local `folder` (output_dir or inside it) when it, or a
    folder between output_dir and it, is a symbolic link: a link would lead tpuctl's writes
    and deletes to files it did not make, outside output_dir (output_dir itself may be reached
    through links; what tpuctl makes inside it may not)."""
    if is_gcs(folder):
        return
    root, target = os.path.abspath(output_dir), os.path.abspath(folder)
    if os.path.commonpath([root, target]) != root:
        raise ValueError(f"{folder} is not inside {output_dir}")
    current = root
    for part in [p for p in os.path.relpath(target, root).split(os.sep) if p != "."]:
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise UserError(f"{current} is a symbolic link (to {os.readlink(current)}): tpuctl "
                            "writes and deletes only inside output_dir",
                            hint="replace the link with a folder (move what it points to "
                                 "yourself if you want it there)")


def inside_path(folder: str, name: str, *, source: str | None = None) -> str:
    """`folder`/`name`, to read from a folder someone else made (a model.init_from or
    tokenizer.path folder); refuses, in one line, a local symbolic link that leads out of the
    folder, so nothing from outside it reaches what tpuctl writes or publishes (a link inside
    the folder is fine; gs:// has no links). `source` names the folder in the message."""
    path = join(folder, name)
    if is_gcs(path):
        return path
    root, real = os.path.realpath(folder), os.path.realpath(path)
    if os.path.commonpath([root, real]) != root:
        raise UserError(f"{source or folder}: {name} is a symbolic link to {real}, outside the "
                        "folder", hint="tpuctl reads only what is inside the folder: replace "
                        "the link with a copy of the file (cp --remove-destination TARGET LINK)"
                        " or remove it")
    return path


def _inside(path: str, folder: str) -> bool:
    if is_gcs(path) or is_gcs(folder):
        return path.startswith(folder.rstrip("/") + "/")
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    return os.path.commonpath([path, folder]) == folder and path != folder


def remove_owned(output_dir: str, paths: Iterable[str]) -> None:
    """Delete files tpuctl wrote, inside an output_dir it owns, in the order given; local
    folders left empty by it go too."""
    paths = list(paths)
    if not paths:
        return
    if not exists(owner_marker(output_dir)):
        raise UserError(f"refusing to delete in {output_dir}: tpuctl did not mark it as its own "
                        f"({OWN_DIR}/{OWNER} is missing)",
                        hint="move the files you want removed yourself, or use a new output_dir")
    for path in paths:
        if not _inside(path, output_dir):
            raise ValueError(f"{path} is not inside {output_dir}")
        check_no_link(output_dir, os.path.dirname(path))  # real paths: no link on the way
        remove(path)
        if not is_gcs(path):
            parent = os.path.dirname(path)
            while _inside(parent, output_dir):
                try:
                    os.rmdir(parent)
                except OSError:
                    break
                parent = os.path.dirname(parent)


# --- complete folders: a marker written last; replacement by swap (local) -----------------------


def complete_marker(folder: str) -> str:
    return join(folder, COMPLETE)


def mark_complete(folder: str, info: dict) -> None:
    """Record that `folder` is whole, with what made it. Written after everything else in it."""
    from payload import __version__

    record = {**info, "tpuctl": __version__, "host": socket.gethostname(),
              "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_text(complete_marker(folder), json.dumps(record, indent=1) + "\n")


def is_complete(folder: str) -> bool:
    return exists(complete_marker(folder))


def read_complete(folder: str) -> dict | None:
    """What the folder's completeness marker says (None without one)."""
    path = complete_marker(folder)
    if not exists(path):
        return None
    try:
        return json.loads(read_text(path))
    except (ValueError, UnicodeDecodeError):
        return {}


def clear_complete(folder: str) -> None:
    """Readers stop trusting `folder`: the first step of changing it in place."""
    remove(complete_marker(folder))


def _sibling(target: str, kind: str) -> str:
    """`.model.tpuctl-new` next to `model`: where a replacement is built or the old one kept."""
    parent, name = os.path.split(os.path.abspath(target))
    return os.path.join(parent, f".{name}.tpuctl-{kind}")


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_RENAME_EXCHANGE = 2


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system or
    the filesystem cannot (NFS, macOS), and the caller renames twice instead."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), b)


def recover_folder(target: str) -> None:
    """Finish or undo a replacement of local `target` that a crash cut short, and remove its
    leftovers: after this, `target` is the old folder or the new one, and nothing else is."""
    if is_gcs(target):
        return
    new, old = _sibling(target, "new"), _sibling(target, "old")
    if not os.path.lexists(target):
        # (Never a link: tpuctl makes these as folders; a link is someone else's.)
        if is_complete(new) and not os.path.islink(new):  # the crash came between moving
            note_change("rename", target)                  # the old aside and the new in
            os.rename(new, target)
        elif os.path.isdir(old) and not os.path.islink(old):
            note_change("rename", target)
            os.rename(old, target)
    for leftover in (new, old):
        if os.path.islink(leftover):  # the link goes, never what it points to
            note_change("remove", leftover)
            os.unlink(leftover)
        elif os.path.lexists(leftover):
            note_change("remove-tree", leftover)
            shutil.rmtree(leftover, ignore_errors=True)


def _files_under(folder: str) -> list[str]:
    return [n for n in list_tree(folder) if os.path.basename(n) != COMPLETE]


def _keep_foreign_files(target: str, staging: str) -> None:
    """Copy into the new folder what the old one holds that tpuctl did not write there (not in
    its marker's list; everything, for an old folder without a list) and the new one lacks."""
    if not os.path.isdir(target):
        return
    record = read_complete(target) or {}
    ours = set(record.get("files", [])) if "files" in record else None
    for name in _files_under(target):
        if os.path.exists(os.path.join(staging, name)) or (ours is not None and name in ours):
            continue
        if os.path.islink(os.path.join(target, name)):  # its target is not the folder's
            log.info("not keeping %s in the new %s: a symbolic link", name, target)
            continue
        log.info("keeping %s in the new %s (tpuctl did not write it)", name, target)
        os.makedirs(os.path.dirname(os.path.join(staging, name)), exist_ok=True)
        shutil.copy2(os.path.join(target, name), os.path.join(staging, name))


def _swap_in(staging: str, target: str) -> None:
    if not os.path.lexists(target):
        note_change("rename", target)
        os.rename(staging, target)
        return
    note_change("rename", target)
    if _exchange(staging, target):
        old = staging  # the old folder now lives under the staging name
    else:
        old = _sibling(target, "old")
        os.rename(target, old)
        note_change("rename", target)
        os.rename(staging, target)
    _fsync_dir(os.path.dirname(os.path.abspath(target)))
    note_change("remove-tree", old)
    shutil.rmtree(old, ignore_errors=True)


def _publish_to_gcs(local: str, target: str, info: dict) -> None:
    """On gs:// a folder cannot be swapped: the old marker goes first (readers stop), then the
    new files go up, then what tpuctl wrote before and no longer writes is removed, then the
    marker. Files tpuctl did not write stay."""
    record = read_complete(target)
    ours = set(record.get("files", [])) if record and "files" in record else set()
    clear_complete(target)
    names = _files_under(local)
    for name in names:
        note_change("publish", join(target, name))
        _blob(join(target, name)).upload_from_filename(os.path.join(local, name))
    for name in sorted(ours - set(names)):
        remove(join(target, name))
    mark_complete(target, {**info, "files": names})


@contextlib.contextmanager
def replacing_folder(target: str, info: dict) -> Iterator[str]:
    """A local folder to build the new `target` in; when the block ends without an error, it
    replaces `target` whole and is marked complete with `info`.

        with replacing_folder(layout.model_dir(out), {"stage": "export"}) as folder:
            model.save_pretrained(folder)

    Locally the folder is a sibling (`.model.tpuctl-new`) swapped in by rename: a crash at any
    point leaves the old folder or the new one (`recover_folder` tidies up on the next run); a
    full disk while writing leaves the old one. On gs:// it is a local temporary folder that is
    uploaded, and readers rely on the completeness marker."""
    if is_gcs(target):
        local = tempfile.mkdtemp(prefix="tpuctl-folder-")
        try:
            yield local
            try:
                _publish_to_gcs(local, target, info)
            except OSError as exc:
                raise_disk_error(exc, target)
        finally:
            shutil.rmtree(local, ignore_errors=True)
        return
    if os.path.islink(target):  # replacing it would read, copy and delete what it points to
        raise UserError(f"{target} is a symbolic link (to {os.readlink(target)}): tpuctl "
                        "replaces only a folder it made",
                        hint="remove the link (what it points to stays), or move it aside")
    try:
        recover_folder(target)
        staging = _sibling(target, "new")
        os.makedirs(staging)
    except OSError as exc:
        raise_disk_error(exc, target)
    try:
        yield staging
        ours = _files_under(staging)  # what tpuctl wrote; the marker lists these alone
        _keep_foreign_files(target, staging)
        mode = _file_mode()
        for name in _files_under(staging):
            fd = os.open(os.path.join(staging, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                # Libraries write some files 0600 (safetensors does): the umask decides.
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
        mark_complete(staging, {**info, "files": ours})
        _swap_in(staging, target)
    except OSError as exc:
        _abandon(staging, target)
        raise_disk_error(exc, target)
    except BaseException as exc:
        _abandon(staging, target)
        if isinstance(exc, RuntimeError) and _disk_full(exc):
            raise_disk_error(OSError(errno.ENOSPC, str(exc)), target)
        raise


def _abandon(staging: str, target: str) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):
        recover_folder(target)  # an old folder moved aside comes back
