"""Nothing the user owns is deleted or orphaned (issue 8): output_dir ownership, overlap with
the corpus, what --overwrite may remove, the tokenizer that shards and checkpoints need,
complete folders and crash-safe replacement, file modes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from payload.core import folders, layout
from tests.support.data_safety import NEW, OLD, contents, old_folder, run_config
from tests.support.runners import payload_env


@pytest.fixture(scope="module")
def texts(tmp_path_factory, documents) -> Path:
    """A corpus folder of its own (so outputs never lie inside it)."""
    folder = tmp_path_factory.mktemp("texts")
    (folder / "a.txt").write_text("\n".join(" ".join(d.split()) for d in documents[:600]) + "\n")
    return folder




# --- 1. prepare --overwrite deletes only what prepare wrote; corpus and output_dir apart -----


# --- 2. the tokenizer that shards and checkpoints were made with is never silently replaced ---


# --- 4. output_dir: tpuctl's own folder, or a new or empty one ----------------------------------


# --- 3. complete folders; replacement that survives a kill at every point ----------------------

_REPLACE = """
import os, sys
from payload.core import folders, storage
if sys.argv[2] == "rename":
    folders._exchange = lambda a, b: False  # the two-rename path (NFS, macOS)
with folders.replacing_folder(sys.argv[1], {"stage": "test"}) as folder:
    for name in ("weights.bin", "config.json", "sub/extra.txt"):
        storage.write_bytes(os.path.join(folder, name), b"new " + name.encode())
"""




def _replace(target: Path, how: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _REPLACE, str(target), how],
                          env=payload_env(**env), capture_output=True, text=True, timeout=60)




@pytest.mark.parametrize("how", ["exchange", "rename"])
def test_replacing_a_folder_survives_a_kill_at_every_point(tmp_path, how):
    log = tmp_path / "changes.log"
    target = old_folder(tmp_path / "run")
    assert _replace(target, how, TPUCTL_TEST_WRITE_LOG=str(log)).returncode == 0
    assert contents(target) == NEW  # stale.txt was tpuctl's (in the old marker's list)
    points = len(log.read_text().splitlines())
    assert points >= 6, log.read_text()
    seen_missing = False
    for point in range(1, points + 1):
        target = old_folder(tmp_path / "run")
        killed = _replace(target, how, TPUCTL_TEST_KILL_AT=str(point))
        assert killed.returncode == -9, (point, killed.stderr)
        if target.exists():
            assert contents(target) in (OLD, NEW), point
            assert folders.is_complete(str(target)), point
        else:  # only between the two renames, and the next run puts one back
            assert how == "rename", point
            seen_missing = True
            folders.recover_folder(str(target))
            assert contents(target) in (OLD, NEW), point
        assert _replace(target, how).returncode == 0, point
        assert contents(target) == NEW, point
        assert sorted(p.name for p in target.parent.iterdir()) == ["model"], point
        assert json.loads((target / layout.COMPLETE).read_text())["stage"] == "test"
    assert seen_missing == (how == "rename")


def test_replacing_a_folder_keeps_files_tpuctl_did_not_write(tmp_path):
    target = old_folder(tmp_path / "run")
    (target / "README.md").write_text("my model card\n")
    assert _replace(target, "exchange").returncode == 0
    assert (target / "README.md").read_text() == "my model card\n"
    assert contents(target) == {**NEW, "README.md": b"my model card\n"}


# --- 5. files written through storage honour the umask ---------------------------------------


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*")
            if ".tpuctl-" not in p.name}


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755),
                                                              (0o077, 0o600, 0o700)])
def test_files_honour_the_umask(tmp_path, texts, umask, file_mode, dir_mode):
    out = tmp_path / "run"
    path = run_config(tmp_path, out, texts / "a.txt", data={"records_per_shard": 100})
    for stage in ("tokenizer", "prepare"):
        proc = subprocess.run([sys.executable, "-m", "payload", stage, "--config", str(path)],
                              env=payload_env(), capture_output=True, text=True, timeout=300,
                              preexec_fn=lambda: os.umask(umask))
        assert proc.returncode == 0, proc.stderr[-2000:]
    modes = _modes(out)
    for name in ("config.yaml", "data/manifest.json", "tokenizer/tokenizer.json",
                 ".tpuctl/owner", "data/parts/worker-00000of00001.json"):
        assert modes[name] == file_mode, (name, oct(modes[name]))
    shards = [n for n in modes if n.endswith(".tfrecord")]
    assert shards and all(modes[n] == file_mode for n in shards)
    assert modes["tokenizer"] == dir_mode and modes["data/train"] == dir_mode
    wrong = {n: oct(m) for n, m in modes.items() if m not in (file_mode, dir_mode)}
    assert not wrong


# --- the same markers on gs:// (a Cloud Storage emulator) ------------------------------------


# -- symbolic links inside output_dir (issue 16.8) -------------------------------------------


