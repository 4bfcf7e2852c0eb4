"""payload/core/storage.py on gs:// paths, against the sandbox's fake Cloud Storage (the one
TensorFlow's gs:// writes to): every public function, and the same answers as on a local disk
for the same tree, folder placeholders left by TensorFlow's makedirs included."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from payload.core import ownership, storage
from payload.core.errors import UserError
from tests.support.gcs_tree import BUCKET, PLACEHOLDERS, ROOT, TREE
from tests.support.runners import payload_env


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


def _relative(paths, root: str) -> list[str]:
    return [p[len(root):].lstrip("/") for p in paths]


def test_write_read_exists_size(gcs):
    path = f"{ROOT}/rw/data.bin"
    assert not storage.exists(path)
    storage.write_bytes(path, b"\x00\x01" * 1000)
    assert storage.exists(path) and storage.size(path) == 2000
    assert storage.read_bytes(path) == b"\x00\x01" * 1000
    storage.write_text(f"{ROOT}/rw/t.txt", "héllo\n")
    assert storage.read_text(f"{ROOT}/rw/t.txt") == "héllo\n"
    assert gcs.read_bytes(f"{ROOT}/rw/t.txt") == "héllo\n".encode()
    storage.write_bytes(path, b"replaced")
    assert storage.read_bytes(path) == b"replaced"


def test_open_read_streams_across_chunks(gcs):
    data = os.urandom(9 << 20)  # more than one of open_read's 8 MiB chunks
    gcs.write_bytes(f"{ROOT}/stream/big.bin", data)
    with storage.open_read(f"{ROOT}/stream/big.bin") as f:
        head = f.read(100)
        rest = f.read()
    assert head + rest == data


def test_staging_file_then_publish(gcs):
    target = f"{ROOT}/published/shard.tfrecord"
    f, tmp = storage.staging_file(target)
    with f:
        f.write(b"shard bytes")
    assert not storage.exists(target)  # nothing visible before the publish
    storage.publish_file(tmp, target)
    assert not os.path.exists(tmp)
    assert gcs.read_bytes(target) == b"shard bytes"


def test_remove_and_remove_tree(gcs):
    for name in ("rm/one.txt", "rm/tree/a", "rm/tree/deep/b", "rm/tree2/c", "rm/tree/"):
        gcs.write_bytes(f"{ROOT}/{name}", b"x")
    storage.remove(f"{ROOT}/rm/one.txt")
    storage.remove(f"{ROOT}/rm/never-there.txt")  # no error
    assert not gcs.exists(f"{ROOT}/rm/one.txt")
    storage.remove_tree(f"{ROOT}/rm/tree")
    assert gcs.list(f"{ROOT}/rm/") == [f"{ROOT}/rm/tree2/c"]  # a sibling sharing the prefix stays
    storage.remove_tree(f"{ROOT}/rm/not-there")


def test_makedirs_is_a_no_op_and_check_writable_leaves_nothing(gcs):
    storage.makedirs(f"{ROOT}/made/a/b")
    assert gcs.list(f"{ROOT}/made/") == []
    ownership.check_writable(f"{ROOT}/made")
    assert gcs.list(f"{ROOT}/made/") == []


def test_check_writable_names_a_missing_bucket(gcs):
    with pytest.raises(UserError, match="no-such-bucket"):
        ownership.check_writable("gs://no-such-bucket/run")


def test_listdir_matches_local(trees):
    local, remote = trees
    for folder in ("tree", "tree/sub", "tree/sub/deep", "tree/empty", "missing"):
        want = _relative(storage.listdir(os.path.join(local, folder)), local)
        got = _relative(storage.listdir(storage.join(remote, folder)), remote)
        assert got == want, folder
    assert _relative(storage.listdir(f"{remote}/tree/"), remote) == [
        "tree/.hidden", "tree/a.txt", "tree/b.json"]  # no folder marker, nothing nested


@pytest.mark.parametrize("pattern", [
    "tree/*.txt", "tree/*", "tree/*/*.txt", "tree/**/*.txt", "tree/**", "tree/sub/**/*.bin",
    "tree/s?b/c.txt", "tree/[ab].*", "tree/[!a]*", "tree/.*", "tree*", "*.txt", "*/*/*/*",
    "tree/sub/deep/d.txt",
])
def test_glob_matches_local(trees, pattern):
    local, remote = trees
    want = _relative(storage.glob(os.path.join(local, pattern)), local)
    got = _relative(storage.glob(storage.join(remote, pattern)), remote)
    assert got == want


def test_walk_files_and_is_dir_match_local(trees):
    local, remote = trees
    for folder in ("tree", "tree/sub", "tree/empty"):
        want = _relative(storage.walk_files(os.path.join(local, folder)), local)
        got = _relative(storage.walk_files(storage.join(remote, folder)), remote)
        assert got == want, folder
    for folder in ("tree", "tree/sub", "tree/sub/deep", "tree/a.txt", "missing"):
        assert storage.is_dir(storage.join(remote, folder)) == os.path.isdir(
            os.path.join(local, folder)), folder
    assert storage.exists(f"{remote}/tree/a.txt") and not storage.exists(f"{remote}/tree/sub")


def test_storage_inside_the_sandbox_sees_tensorflow_objects(gcs):
    """In one process inside the sandbox: TensorFlow writes through its gs://, payload.core.storage
    (STORAGE_EMULATOR_HOST from sandbox.env) reads, and the other way round."""
    code = (
        "import tensorflow as tf\n"
        "from payload.core import storage\n"
        f"root = '{ROOT}/inside'\n"
        "tf.io.gfile.makedirs(root + '/dir')\n"
        "with tf.io.gfile.GFile(root + '/dir/tf.txt', 'w') as f: f.write('tf')\n"
        "storage.write_text(root + '/dir/st.txt', 'st')\n"
        "print(storage.listdir(root + '/dir'), storage.read_text(root + '/dir/tf.txt'),\n"
        "      tf.io.gfile.GFile(root + '/dir/st.txt').read(), storage.is_dir(root + '/dir'))\n"
    )
    proc = gcs.run([sys.executable, "-c", code], env=payload_env(), timeout=120, check=True)
    assert proc.stdout.split("\n")[-2] == (
        f"['{ROOT}/inside/dir/st.txt', '{ROOT}/inside/dir/tf.txt'] tf st True")


def test_sandbox_leaves_nothing_behind():
    """A second sandbox, with a command still running inside: closing it kills the command,
    and its namespace, veth and files are gone; this machine's /etc/hosts is untouched."""
    from testbed.fakes.gcs import GcsSandbox, unavailable_reason

    if reason := unavailable_reason():
        pytest.skip(reason)
    hosts = Path("/etc/hosts").read_text()
    with GcsSandbox() as sandbox:
        sleeper = sandbox.popen(["sleep", "300"], stdout=subprocess.DEVNULL)
        assert sandbox.run(["cat", "/etc/hosts"]).stdout.count("googleapis.com") >= 2
        assert sleeper.pid in sandbox.processes() and sandbox.started_in_s < 10
        root, veth = sandbox.root, sandbox.veth
    assert sleeper.wait(timeout=10) != 0
    assert sandbox.processes() == []
    assert not root.exists()
    link = subprocess.run(["ip", "link", "show", veth], capture_output=True, text=True)
    assert link.returncode != 0
    assert Path("/etc/hosts").read_text() == hosts


def test_sizes_matches_local(trees):
    local, remote = trees
    for folder in ("tree", "tree/sub", "tree/empty", "missing"):
        assert storage.sizes(storage.join(remote, folder)) == storage.sizes(
            os.path.join(local, folder)), folder
    assert storage.sizes(os.path.join(local, "tree")) == {".hidden": 1, "a.txt": 1, "b.json": 2}


