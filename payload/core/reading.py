"""Reading files tpuctl did not make (or that someone may have changed): the one place that
opens them, so every reader refuses the same inputs in one line.

    raw = read_file("run.yaml", limit=CONFIG_LIMIT)               # bytes of a regular file
    settings = read_json("x/config.json", what="model.config x/config.json")
    files = read_folder(folder, ("config.json", "tokenizer.json"), source="model.init_from m")
    with opened_in_folder(folder, "model.safetensors", source="model.init_from m") as path:
        header = read_file(path, limit=JSON_LIMIT)                # the file that was checked

- Regular files only: a folder, a named pipe, a socket or a device is one line. Files are
  opened with O_NONBLOCK and judged by fstat on what was opened, so a named pipe with no writer
  never hangs a reader.
- Bounded: every read has a size limit; JSON a nesting depth (`JSON_DEPTH`), so a crafted file
  is one line rather than a RecursionError here or in a library that reads it after us.
- A folder someone else made (`model.init_from`, `tokenizer.path`) gives only the names asked
  for, each opened once relative to the folder's own descriptor without following a link
  (O_NOFOLLOW), and only when it is the folder's own file (a regular file with one hard link):
  a link or a hard link to a file elsewhere is refused, and the bytes come from the descriptor
  that was checked, so no file swapped in after the check can be read (`read_folder` gives a
  private copy in memory; `opened_in_folder` a path to the opened file for large ones).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterable, Iterator
from typing import IO

from payload.core import storage
from payload.core.errors import UserError

JSON_DEPTH = 64  # config.json, tokenizer.json, a safetensors header: each under 10 deep
JSON_LIMIT = 256 << 20  # the largest tokenizer.json files are tens of MB
CONFIG_LIMIT = 4 << 20  # a tpuctl.yaml, a model config.json, tpuctl's own records
FOLDER_FILE_LIMIT = 512 << 20  # one tokenizer or config file of a model folder

_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _mib(count: int) -> str:
    return f"{count / (1 << 20):,.0f} MiB"


def _check_regular(st: os.stat_result, what: str, hint: str | None) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{what} is {_kind(st.st_mode)}, not a file",
                        hint=hint or "point it at a regular file")


def _too_large(what: str, limit: int) -> UserError:
    return UserError(f"{what} is larger than {_mib(limit)}, more than tpuctl reads of such a "
                     "file", hint="check that it is the file you meant")


def _read_fd(fd: int, *, what: str, limit: int, hint: str | None) -> bytes:
    """All of the regular file open at `fd`, refused past `limit` bytes (also when it grows
    while read)."""
    st = os.fstat(fd)
    _check_regular(st, what, hint)
    if st.st_size > limit:
        raise _too_large(what, limit)
    os.set_blocking(fd, True)
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise _too_large(what, limit)


def _open(path: str, what: str, hint: str | None) -> int:
    try:
        return os.open(path, _FLAGS)
    except FileNotFoundError:
        raise UserError(f"{what} does not exist", hint=hint or "check the path") from None
    except OSError as exc:
        raise UserError(f"cannot read {what}: {exc.strerror or exc}",
                        hint=hint or "check the file's permissions") from None


def read_file(path: str, *, what: str | None = None, limit: int = CONFIG_LIMIT,
              hint: str | None = None) -> bytes:
    """The bytes of the file at `path` (local, links followed: the user named it; or gs://),
    refused in one line when it is missing, not a regular file, or larger than `limit`.
    `what` names it in that line (default: its path)."""
    what = what or path
    if storage.is_gcs(path):
        if not storage.exists(path):
            raise UserError(f"{what} does not exist", hint=hint or "check the path")
        if storage.size(path) > limit:
            raise _too_large(what, limit)
        return storage.read_bytes(path)
    fd = _open(path, what, hint)
    try:
        return _read_fd(fd, what=what, limit=limit, hint=hint)
    finally:
        os.close(fd)


def open_file(path: str, *, what: str | None = None, hint: str | None = None) -> IO[bytes]:
    """The regular file at `path` open for reading (for readers of part of a large file, such
    as a safetensors header), refused in one line as `read_file` refuses it."""
    if storage.is_gcs(path):
        return storage.open_read(path)
    what = what or path
    fd = _open(path, what, hint)
    try:
        _check_regular(os.fstat(fd), what, hint)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _depth(value) -> int:
    """How deep a parsed JSON value nests (iteratively: no recursion of our own)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level > JSON_DEPTH:
                return level
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


NOT_JSON = "is not JSON"


def json_value(raw: bytes | str):
    """`raw` parsed as JSON, and what is wrong with it (None when nothing): not JSON (or not
    UTF-8), or nested deeper than JSON_DEPTH."""
    try:
        value = json.loads(raw)
    except RecursionError:
        return None, f"nests deeper than {JSON_DEPTH} levels"
    except ValueError:  # UnicodeDecodeError included
        return None, NOT_JSON
    if _depth(value) > JSON_DEPTH:
        return None, f"nests deeper than {JSON_DEPTH} levels"
    return value, None


def parse_json(raw: bytes | str, *, what: str, hint: str | None = None):
    """`raw` as JSON, or one line naming `what` and what is wrong (`json_value`)."""
    value, problem = json_value(raw)
    if problem:
        raise UserError(f"{what} {problem}", hint=hint or "check that it is the file you meant")
    return value


def read_json(path: str, *, what: str | None = None, limit: int = CONFIG_LIMIT,
              hint: str | None = None):
    """The JSON value in the file at `path`, every refusal of `read_file` and `parse_json`."""
    what = what or path
    return parse_json(read_file(path, what=what, limit=limit, hint=hint), what=what, hint=hint)


# --- a folder someone else made -------------------------------------------------------------


def _open_folder(folder: str, source: str) -> int:
    try:
        return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserError(f"{source} does not exist", hint="check the path") from None
    except NotADirectoryError:
        raise UserError(f"{source} is not a folder",
                        hint="point it at a Hugging Face model or tokenizer folder") from None
    except OSError as exc:
        raise UserError(f"cannot read {source}: {exc.strerror or exc}",
                        hint="check the folder's permissions") from None


def _open_own(dir_fd: int, name: str, source: str) -> int | None:
    """`name` in the folder open at `dir_fd`, opened without following a link and checked to be
    the folder's own regular file; None when the folder has no such name."""
    what = f"{source}: {name}"
    try:
        fd = os.open(name, _FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a link (EMLINK: BSD)
            target = "elsewhere"
            with contextlib.suppress(OSError):
                target = os.readlink(name, dir_fd=dir_fd)
            raise UserError(f"{what} is a symbolic link to {target}: tpuctl reads only the "
                            "folder's own files, never through a link",
                            hint="replace the link with a copy of the file (cp "
                                 "--remove-destination TARGET LINK)") from None
        raise UserError(f"cannot read {what}: {exc.strerror or exc}",
                        hint="check the file's permissions") from None
    try:
        st = os.fstat(fd)
        _check_regular(st, what, "the folder's files must be plain files")
        if st.st_nlink != 1:
            raise UserError(f"{what} has {st.st_nlink} hard links: tpuctl reads only files "
                            "that are the folder's own",
                            hint=f"give the folder its own copy (cp {name} {name}.copy && "
                                 f"mv {name}.copy {name})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_folder(folder: str, names: Iterable[str], *, source: str,
                limit: int = FOLDER_FILE_LIMIT) -> dict[str, bytes]:
    """A private copy, in memory, of the files of `names` that `folder` (local or gs://) holds:
    name -> bytes, each read once from the descriptor that was checked (see the module's
    docstring). `source` names the folder in every refusal."""
    names = list(names)
    if storage.is_gcs(folder):  # no links on gs://; a listing, then each object once
        present = {os.path.basename(p) for p in storage.listdir(folder)}
        return {name: read_file(storage.join(folder, name), what=f"{source}: {name}",
                                limit=limit) for name in names if name in present}
    dir_fd = _open_folder(folder, source)
    try:
        found = {}
        for name in names:
            fd = _open_own(dir_fd, name, source)
            if fd is None:
                continue
            try:
                found[name] = _read_fd(fd, what=f"{source}: {name}", limit=limit, hint=None)
            finally:
                os.close(fd)
        return found
    finally:
        os.close(dir_fd)


def _fd_path(fd: int) -> str:
    """A path that opens the very file open at `fd`, whatever its name now leads to."""
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else f"/dev/fd/{fd}"


@contextlib.contextmanager
def opened_in_folder(folder: str, name: str, *, source: str) -> Iterator[str | None]:
    """A path to read the folder's own file `name` through (None when it has none), for files
    too large to copy (model weights) and libraries that open a path: locally the file is
    opened and checked as `read_folder` checks it, and the path leads to that open file, held
    open until the block ends; a gs:// path is given as it is."""
    if storage.is_gcs(folder):
        path = storage.join(folder, name)
        yield path if storage.exists(path) else None
        return
    dir_fd = _open_folder(folder, source)
    try:
        fd = _open_own(dir_fd, name, source)
    finally:
        os.close(dir_fd)
    if fd is None:
        yield None
        return
    try:
        os.set_blocking(fd, True)
        yield _fd_path(fd)
    finally:
        os.close(fd)


def folder_has(folder: str, name: str, *, source: str) -> bool:
    """Whether `folder` holds `name` as its own regular file (refused in one line when it holds
    it otherwise: a link, a hard link, a folder, a pipe)."""
    with opened_in_folder(folder, name, source=source) as path:
        return path is not None
