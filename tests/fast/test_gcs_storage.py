"""payload/core/storage.py on gs:// paths, against the sandbox's fake Cloud Storage (the one
TensorFlow's gs:// writes to): every public function, and the same answers as on a local disk
for the same tree, folder placeholders left by TensorFlow's makedirs included."""

from __future__ import annotations

import os

import pytest

from payload.core import storage
from tests.support.gcs_tree import BUCKET, PLACEHOLDERS, ROOT, TREE


@pytest.fixture(scope="module")
def gcs(gcs_sandbox):
    """payload.core.storage pointed at the sandbox's fake (as STORAGE_EMULATOR_HOST does inside)."""
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = gcs_sandbox.url
    storage._client = None
    gcs_sandbox.make_bucket(BUCKET)
    try:
        yield gcs_sandbox
    finally:
        storage._client = None
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved


@pytest.fixture(scope="module")
def trees(gcs, tmp_path_factory):
    """(local root, gs:// root) holding the same TREE."""
    local = tmp_path_factory.mktemp("tree")
    remote = f"{ROOT}/trees"
    for name, data in TREE.items():
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
        gcs.write_bytes(f"{remote}/{name}", data)
    (local / "tree" / "empty").mkdir()
    for name in PLACEHOLDERS:
        gcs.write_bytes(f"{remote}/{name}", b"")
    return str(local), remote


def test_sandbox_says_why_it_cannot_start(monkeypatch):
    from testbed.fakes import gcs

    monkeypatch.setattr(gcs.os, "geteuid", lambda: 1000)
    assert "needs root" in gcs.unavailable_reason()
    monkeypatch.setattr(gcs.os, "geteuid", lambda: 0)
    monkeypatch.setattr(gcs.shutil, "which", lambda tool: None if tool == "nsenter" else tool)
    assert "nsenter" in gcs.unavailable_reason()


def test_sizes_leaves_out_files_that_go_while_it_lists(tmp_path, monkeypatch):
    # Another worker's temporary file is renamed (and an old file removed) between the listing
    # and the size of each entry: what is gone is left out, temporaries are never counted.
    for name in ("kept.json", "gone.json", ".tmp-abc-part.json"):
        (tmp_path / name).write_bytes(b"12345")
    listing = os.scandir

    def racing_scandir(path):
        for entry in listing(path):
            if entry.name in ("gone.json", ".tmp-abc-part.json"):
                os.remove(entry.path)
            yield entry

    monkeypatch.setattr(storage.os, "scandir", racing_scandir)
    assert storage.sizes(str(tmp_path)) == {"kept.json": 5}
