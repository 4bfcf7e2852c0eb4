"""What tpuctl may write and delete in: an output_dir it marked as its own, and no link on the way.

    check_output_dir(out)          # refuses someone else's folder; True when it is tpuctl's
    claim_output_dir(out)          # the owner marker, first of anything a stage writes
    remove_owned(out, [storage.join(out, "checkpoints", "ckpt-1.index")])

- `output_dir/.tpuctl/owner`: tpuctl made (or adopted) this output_dir; it deletes only in
  folders that carry it (`claim_output_dir`, `remove_owned`).
- No symbolic link between output_dir and what tpuctl writes or deletes there
  (`check_no_link`); what tpuctl reads from a folder someone else made is payload.core.reading's
  rule.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterable

from payload.core import layout, storage
from payload.core.errors import UserError
from payload.core.layout import OWN_DIR, OWNER
from payload.core.storage import bucket_errors, exists, is_gcs, join, read_text, remove, write_text

_WORKER_LOG = re.compile(r"^worker-\d+\.log\Z")


def owner_marker(output_dir: str) -> str:
    return join(output_dir, OWN_DIR, OWNER)


def _strangers(output_dir: str) -> list[str]:
    """What is in output_dir that tpuctl's launcher did not put there before the stages ran
    (its `.tpuctl/` folder, write probes, `logs/worker-N.log`)."""
    found = []
    for name in storage.children(output_dir):
        if name == OWN_DIR or name.startswith(f"{OWN_DIR}-write-probe-"):
            continue
        if name == layout.LOGS_DIR and all(_WORKER_LOG.match(n) for n in storage.children(join(output_dir, name))):
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
    with bucket_errors(output_dir):
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

    with bucket_errors(output_dir):
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


def check_writable(path: str) -> None:
    """Fail early, with a clear message, if output_dir `path` cannot take output."""
    # One name per host: a probe left by a killed run is replaced, then removed, by the next.
    probe = join(path, OWN_DIR, f"write-probe-{socket.gethostname()}")
    if not is_gcs(path) and os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"output_dir {path} is a file, not a folder",
                        hint="choose a folder path for output_dir")
    with bucket_errors(path):
        storage.write_bytes(probe, b"probe")
    remove(probe)
