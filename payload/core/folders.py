"""Folders readers trust only whole: a completeness marker written last, and replacement by swap.

    with replacing_folder(layout.model_dir(out), {"stage": "export"}) as folder:
        model.save_pretrained(folder)          # swapped in whole, marked complete
    is_complete(layout.checkpoints_dir(out))   # FOLDER/.tpuctl-complete is there

`FOLDER/.tpuctl-complete`, written last, says the folder is whole (`mark_complete`,
`is_complete`). A folder cannot be swapped on gs://, so every reader of a folder that is
replaced or cleared (checkpoints, model/) requires it; locally `replacing_folder` also swaps the
new folder in with renames, so a crash leaves the old folder or the new one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator

from payload.core import reading, storage
from payload.core.errors import UserError
from payload.core.layout import COMPLETE, model_dir
from payload.core.storage import exists, is_gcs, join, note_change, raise_disk_error, remove

log = logging.getLogger(__name__)


def complete_marker(folder: str) -> str:
    return join(folder, COMPLETE)


def mark_complete(folder: str, info: dict) -> None:
    """Record that `folder` is whole, with what made it. Written after everything else in it."""
    from payload import __version__

    record = {**info, "tpuctl": __version__, "host": socket.gethostname(),
              "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    storage.write_text(complete_marker(folder), json.dumps(record, indent=1) + "\n")


def is_complete(folder: str) -> bool:
    return exists(complete_marker(folder))


def check_exported(output_dir: str) -> None:
    """output_dir/model/ is a finished export, or one line (what publish reads)."""
    model = model_dir(output_dir)
    if not is_complete(model):
        raise UserError(f"{model} is not a complete export",
                        hint="run the export stage first (`--stages export,publish`)")


def read_complete(folder: str) -> dict | None:
    """What the folder's completeness marker says (None without one)."""
    path = complete_marker(folder)
    if not exists(path):
        return None
    try:
        found = reading.read_json(path)
    except UserError:  # unreadable: the marker says nothing more than that it is there
        return {}
    return found if isinstance(found, dict) else {}


def replacing_words(folder: str) -> str:
    """What replacing `folder` (replacing_folder) removes, in words for a log line: the files
    tpuctl wrote there, as its completeness marker lists them; the others stay.

    >>> replacing_words("/nowhere/tokenizer")
    'replacing in /nowhere/tokenizer the files it writes (the others stay)'
    """
    record = read_complete(folder) or {}
    if "files" not in record:  # no list: what the new one writes is replaced, nothing else
        return f"replacing in {folder} the files it writes (the others stay)"
    return (f"replacing in {folder}: {', '.join(sorted(record['files'])) or 'no files'} "
            "(files tpuctl did not write stay)")


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
    return [n for n in storage.list_tree(folder) if os.path.basename(n) != COMPLETE]


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
        storage.upload_file(os.path.join(local, name), join(target, name))
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
        mode = storage.file_mode()
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
        # h5py raises RuntimeError, safetensors its own error: their text says the disk is full.
        if isinstance(exc, Exception) and storage.disk_full(exc):
            raise_disk_error(OSError(errno.ENOSPC, str(exc)), target)
        raise


def _abandon(staging: str, target: str) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):
        recover_folder(target)  # an old folder moved aside comes back
