"""The bucket tree the gs:// storage tests share (tests/fast and tests/e2e)."""

from __future__ import annotations

BUCKET = "storage-checks"


ROOT = f"gs://{BUCKET}"


# One tree, written both locally and on gs://. `sub/` and `deep/` also get the empty
# placeholder objects TensorFlow's makedirs leaves ("dir/"), which local disks do not need.
TREE = {
    "tree/a.txt": b"a",
    "tree/b.json": b"{}",
    "tree/.hidden": b"h",
    "tree/sub/c.txt": b"c",
    "tree/sub/deep/d.txt": b"d",
    "tree/sub/deep/e.bin": b"e",
    "tree/sub2/f.txt": b"f",
    "treetop.txt": b"not under tree/",
}


PLACEHOLDERS = ["tree/sub/", "tree/sub/deep/", "tree/empty/"]
