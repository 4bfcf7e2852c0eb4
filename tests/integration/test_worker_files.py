"""The worker side of the launcher's shared-output check, run as the launcher runs it:
`python -m payload.jobs.files` (a module lint and tests see, not a string of code)."""

from __future__ import annotations

import subprocess
import sys

from payload.core import layout
from tests.support.runners import payload_env


def _files(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "payload.jobs.files", *args],
                          capture_output=True, text=True, env=payload_env(), timeout=120)


def test_write_exists_remove_in_a_new_output_dir(tmp_path):
    out = tmp_path / "out"
    marker = layout.own_path(str(out), "shared-check-1")
    assert _files("write", marker, "job-1", str(out)).returncode == 0
    assert (out / layout.OWN_DIR / "shared-check-1").read_text() == "job-1"
    assert _files("exists", marker).stdout.strip() == "seen"
    assert _files("remove", marker).returncode == 0
    assert _files("exists", marker).stdout.strip() == "missing"


def test_a_folder_of_the_users_gets_nothing(tmp_path):
    """The output_dir check comes first: not even the marker is written into a folder that
    holds files tpuctl did not write, and the refusal is one `error:` line, exit 2."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    proc = _files("write", layout.own_path(str(out), "shared-check-2"), "job-2", str(out))
    assert proc.returncode == 2 and proc.stdout.startswith("error: "), proc
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


