"""Files under `output_dir` and corpus paths, local or `gs://`, behind one small interface.

    write_bytes(join(out, "data", "manifest.json"), payload)   # atomic on both
    for path in glob("gs://bucket/texts/*.txt"): ...

Local writes go to a temporary name in the same folder and are renamed into place; a GCS object
only becomes visible when its upload completes, so both give readers all or nothing. Only this
module talks to Cloud Storage.
"""

from __future__ import annotations

import contextlib
import errno
import glob as _glob
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, NoReturn

from payload.errors import UserError

GCS = "gs://"


def is_gcs(path: str) -> bool:
    return path.startswith(GCS)


def join(base: str, *parts: str) -> str:
    if is_gcs(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return os.path.join(base, *parts)


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


def raise_disk_error(exc: OSError, path: str) -> NoReturn:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        raise UserError(
            f"no space left writing {path}",
            hint="free space or point output_dir somewhere larger, then rerun (finished work is kept)",
        ) from None
    raise UserError(
        f"cannot write {path}: {exc.strerror}", hint="choose a writable output_dir"
    ) from None


def makedirs(path: str) -> None:
    if is_gcs(path):
        return  # GCS has no folders; objects carry the full path.
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise_disk_error(exc, path)


def write_bytes(path: str, data: bytes) -> None:
    """Write all of `data` to `path` or nothing: readers never see a partial file."""
    if is_gcs(path):
        _blob(path).upload_from_string(data)
        return
    parent = os.path.dirname(path) or "."
    makedirs(parent)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".tmp-", suffix="-" + os.path.basename(path))
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
    if replacing is not None:
        aside = f"{path}.{os.getpid()}-{os.urandom(4).hex()}.old"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False
        with open(aside, "rb") as f:
            held = f.read()
        if held != replacing:  # someone else's by now: put it back (unless replaced again)
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
            _remove_quietly(aside)
            return False
        _remove_quietly(aside)
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
        fd, staged = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        os.close(fd)
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
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix="-" + os.path.basename(path))
    except OSError as exc:
        raise_disk_error(exc, path)
    return os.fdopen(fd, "wb"), tmp


def remove(path: str) -> None:
    if is_gcs(path):
        blob = _blob(path)
        if blob.exists():
            blob.delete()
        return
    _remove_quietly(path)


def remove_tree(path: str) -> None:
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
        # makedirs writes them), not a file.
        return sorted(f"{GCS}{bucket}/{b.name}" for b in blobs if not b.name.endswith("/"))
    if not os.path.isdir(path):
        return []
    return sorted(
        os.path.join(path, name) for name in os.listdir(path)
        if os.path.isfile(os.path.join(path, name)) and not name.startswith(".tmp-")
    )


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
        bucket, prefix = _split_gcs(path)
        prefix = prefix.rstrip("/") + "/"
        for b in _gcs().list_blobs(bucket, prefix=prefix):
            rest = b.name[len(prefix):]
            if rest and not rest.endswith("/") and not any(
                    p.startswith(".") for p in rest.split("/")):
                yield f"{GCS}{bucket}/{b.name}"
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
    probe = join(path, f".tpuctl-write-probe-{os.getpid()}")
    if not is_gcs(path) and os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"output_dir {path} is a file, not a folder",
                        hint="choose a folder path for output_dir")
    if is_gcs(path):
        from google.api_core import exceptions

        try:
            write_bytes(probe, b"probe")
        except exceptions.NotFound:
            bucket = _split_gcs(path)[0]
            raise UserError(f"bucket gs://{bucket} does not exist (output_dir {path})",
                            hint=f"create it (gcloud storage buckets create gs://{bucket}) "
                            "or fix output_dir") from None
        except exceptions.Forbidden:
            raise UserError(f"no permission to write to {path}",
                            hint="grant the account Storage Object Admin on the bucket")\
                from None
    else:
        write_bytes(probe, b"probe")
    remove(probe)
