"""Nothing the user owns is deleted or orphaned (issue 8): output_dir ownership, overlap with
the corpus, what --overwrite may remove, the tokenizer that shards and checkpoints need,
complete folders and crash-safe replacement, file modes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from payload.config import load_config
from payload.core import folders, layout, ownership, storage
from payload.core.errors import UserError
from payload.training.preflight import check_before_start
from tests.support.configs import base_config, write_config
from tests.support.data_safety import NEW, OLD, contents, old_folder, run_config
from tests.support.runners import assert_user_error, payload_main


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file and folder under root with its mode, size and content."""
    found = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        body = path.read_bytes() if path.is_file() else b""
        found[str(path.relative_to(root))] = (st.st_mode, st.st_size, body)
    return found


@pytest.fixture(scope="module")
def texts(tmp_path_factory, documents) -> Path:
    """A corpus folder of its own (so outputs never lie inside it)."""
    folder = tmp_path_factory.mktemp("texts")
    (folder / "a.txt").write_text("\n".join(" ".join(d.split()) for d in documents[:600]) + "\n")
    return folder




# --- 1. prepare --overwrite deletes only what prepare wrote; corpus and output_dir apart -----


def test_prepare_overwrite_keeps_the_users_files_in_data(tmp_path, texts):
    out = tmp_path / "run"
    path = run_config(tmp_path, out, texts / "a.txt", data={"records_per_shard": 40})
    payload_main("tokenizer", "--config", path, check=True)
    payload_main("prepare", "--config", path, check=True)
    mine = {out / "data" / "train" / "README.md": "what these shards are\n",
            out / "data" / "validation" / "held-out.tfrecord": "not a tpuctl name\n",
            out / "data" / "parts" / "notes.txt": "my notes\n",
            out / "data" / "parts" / "worker-notes.json": "{}\n"}
    for file, text in mine.items():
        file.write_text(text)
    old_shards = sorted(p.name for p in (out / "data" / "train").glob("train-*.tfrecord"))
    path = run_config(tmp_path, out, texts / "a.txt", "longer",
                      data={"records_per_shard": 40, "seq_len": 48})
    assert_user_error(payload_main("prepare", "--config", path), "seq_len 32")
    payload_main("prepare", "--config", path, "--overwrite", check=True)
    for file, text in mine.items():
        assert file.read_text() == text, f"{file} was touched"
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["seq_len"] == 48
    listed = {e["name"] for s in ("train", "validation") for e in manifest["splits"][s]["shards"]}
    on_disk = {str(p.relative_to(out / "data")) for p in (out / "data").rglob("*-w*.tfrecord")}
    assert on_disk == listed and old_shards


@pytest.mark.parametrize("layout", ["same", "out-in-corpus", "corpus-in-out", "corpus-in-data",
                                    "glob-reaches-out"])
def test_output_dir_and_corpus_must_not_overlap(tmp_path, texts, layout):
    root = tmp_path / "root"
    (root / "texts").mkdir(parents=True)
    (root / "texts" / "a.txt").write_text((texts / "a.txt").read_text())
    corpus, out = {
        "same": (root / "texts", root / "texts"),
        "out-in-corpus": (root / "texts", root / "texts" / "run"),
        "corpus-in-out": (root / "texts" / "a.txt", root),
        "corpus-in-data": (root / "run" / "data" / "a.txt", root / "run"),
        "glob-reaches-out": (f"{root}/**/*.txt", root / "run"),
    }[layout]
    if layout == "corpus-in-data":
        (root / "run" / "data").mkdir(parents=True)
        (root / "run" / "data" / "a.txt").write_text("some text for the corpus\n" * 50)
    tok = tmp_path / "tok.yaml"
    path = write_config(tok, base_config(out, corpus))
    before = snapshot(root)
    for stage in ("tokenizer", "prepare"):
        line = assert_user_error(payload_main(stage, "--config", path),
                                 str(out), str(corpus))
        assert "output_dir" in line and "corpus" in line
    with pytest.raises(UserError, match="output_dir"):
        check_before_start(load_config(path), stages={"tokenizer", "prepare"}, resume=False,
                           overwrite=False)
    assert snapshot(root) == before, "something was written"


# --- 2. the tokenizer that shards and checkpoints were made with is never silently replaced ---


def test_tokenizer_is_not_replaced_under_its_shards_or_checkpoints(tmp_path, texts):
    out = tmp_path / "run"
    path = run_config(tmp_path, out, texts / "a.txt")
    payload_main("tokenizer", "--config", path, check=True)
    tokenizer_json = out / "tokenizer" / "tokenizer.json"
    first = tokenizer_json.read_bytes()
    payload_main("prepare", "--config", path, check=True)
    bigger = run_config(tmp_path, out, texts / "a.txt", "bigger", tokenizer={"vocab_size": 700})
    for flags in ((), ("--resume",)):
        line = assert_user_error(payload_main("tokenizer", "--config", str(bigger), *flags), "would be replaced", "shards",
                                 "--overwrite")
        assert str(out / "tokenizer") in line
    with pytest.raises(UserError, match="would be replaced"):
        check_before_start(load_config(bigger), stages={"tokenizer", "prepare"}, resume=False,
                           overwrite=False)
    assert tokenizer_json.read_bytes() == first
    # Checkpoints made with it count too (what a train stage records in run.json).
    from payload.data.tokenizer import fingerprint

    (out / "data" / "manifest.json").unlink()
    for part in (out / "data" / "parts").iterdir():
        part.unlink()
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "run.json").write_text(json.dumps({"tokenizer": fingerprint(first)}))
    assert_user_error(payload_main("tokenizer", "--config", str(bigger)),
                      "would be replaced", "checkpoints")
    assert tokenizer_json.read_bytes() == first
    payload_main("tokenizer", "--config", str(bigger), "--overwrite", check=True)
    assert tokenizer_json.read_bytes() != first
    assert folders.is_complete(str(out / "tokenizer"))
    # A changed setting with nothing made from the tokenizer yet retrains without a word.
    (out / "checkpoints" / "run.json").unlink()
    proc = payload_main("tokenizer", "--config", path, check=True)
    assert json.loads((out / "tokenizer" / "training.json").read_text())["vocab_size"] == 600, \
        proc.stdout


# --- 4. output_dir: tpuctl's own folder, or a new or empty one ----------------------------------


def test_a_folder_of_the_user_is_never_written_to(tmp_path, texts):
    out = tmp_path / "mine"
    (out / "data").mkdir(parents=True)
    (out / "notes.txt").write_text("mine\n")
    (out / "data" / "train").mkdir()
    (out / "data" / "train" / "keep.bin").write_bytes(b"\x01\x02")
    path = run_config(tmp_path, out, texts / "a.txt")
    before = snapshot(out)
    for stage, flags in [("tokenizer", ()), ("tokenizer", ("--overwrite",)),
                         ("prepare", ("--overwrite",)), ("train", ("--overwrite",)),
                         ("export", ())]:
        line = assert_user_error(payload_main(stage, "--config", path, *flags), str(out), "did not write",
                                 "new or empty folder")
        assert "notes.txt" in line
    with pytest.raises(UserError, match="did not write"):
        check_before_start(load_config(path), stages={"prepare"}, resume=False, overwrite=True)
    assert snapshot(out) == before


def test_output_dir_is_marked_and_an_earlier_run_is_adopted(tmp_path, texts):
    out = tmp_path / "run"
    # What the launcher leaves before the stages run is tpuctl's own.
    (out / ".tpuctl" / "jobs").mkdir(parents=True)
    (out / "logs").mkdir()
    (out / "logs" / "worker-0.log").write_text("started\n")
    path = run_config(tmp_path, out, texts / "a.txt")
    payload_main("tokenizer", "--config", path, check=True)
    owner = json.loads((out / ".tpuctl" / "owner").read_text())
    assert owner["tool"] == "tpuctl"
    # A run made before the marker existed: its config.yaml names this very output_dir.
    (out / ".tpuctl" / "owner").unlink()
    payload_main("prepare", "--config", path, check=True)
    assert (out / ".tpuctl" / "owner").is_file()
    # Deleting needs the marker, whatever the caller.
    (out / ".tpuctl" / "owner").unlink()
    with pytest.raises(UserError, match="refusing to delete"):
        ownership.remove_owned(str(out), [str(out / "data" / "manifest.json")])
    assert (out / "data" / "manifest.json").is_file()


# --- 3. complete folders; replacement that survives a kill at every point ----------------------







def test_a_failed_replacement_leaves_the_old_folder(tmp_path):
    target = old_folder(tmp_path / "run")
    with pytest.raises(RuntimeError), folders.replacing_folder(str(target), {}) as folder:
        (Path(folder) / "weights.bin").write_bytes(b"half")
        raise RuntimeError("disk gone")
    assert contents(target) == OLD
    assert sorted(p.name for p in target.parent.iterdir()) == ["model"]


# --- 5. files written through storage honour the umask ---------------------------------------


# --- the same markers on gs:// (a Cloud Storage emulator) ------------------------------------


@pytest.mark.usefixtures("gcs_emulator")
def test_complete_folders_and_ownership_on_cloud_storage():
    out = "gs://tpuctl-test/own"
    ownership.claim_output_dir(out)
    assert storage.exists(ownership.owner_marker(out))
    target = storage.join(out, "model")
    for name, body in OLD.items():
        storage.write_bytes(storage.join(target, name), body)
    storage.write_bytes(storage.join(target, "README.md"), b"mine")
    folders.mark_complete(target, {"stage": "old", "files": sorted(OLD)})
    with folders.replacing_folder(target, {"stage": "test"}) as folder:
        for name, body in NEW.items():
            (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(folder) / name).write_bytes(body)
    assert folders.is_complete(target)
    names = storage.list_tree(target)
    assert names == sorted([*NEW, "README.md", layout.COMPLETE])  # stale.txt was tpuctl's
    assert {n: storage.read_bytes(storage.join(target, n)) for n in NEW} == NEW
    assert folders.read_complete(target)["files"] == sorted(NEW)
    # A prefix that holds someone else's objects is not taken, nor deleted in.
    storage.write_text("gs://tpuctl-test/theirs/notes.txt", "x")
    with pytest.raises(UserError, match="did not write"):
        ownership.claim_output_dir("gs://tpuctl-test/theirs")
    with pytest.raises(UserError, match="refusing to delete"):
        ownership.remove_owned("gs://tpuctl-test/theirs", ["gs://tpuctl-test/theirs/notes.txt"])
    assert storage.exists("gs://tpuctl-test/theirs/notes.txt")


# -- symbolic links inside output_dir (issue 16.8) -------------------------------------------

def _outside(tmp_path: Path, files: dict[str, str]) -> Path:
    """A folder of the user's, outside output_dir, that a link inside output_dir points to."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_train_overwrite_never_follows_a_linked_checkpoints_folder(tmp_path):
    from payload.training import checkpoints

    out = tmp_path / "run"
    ownership.claim_output_dir(str(out))
    theirs = {"checkpoint": 'model_checkpoint_path: "ckpt-9"\n', "ckpt-9.index": "mine",
              "ckpt-9.data-00000-of-00001": "mine"}
    outside = _outside(tmp_path, theirs)
    (out / "checkpoints").symlink_to(outside)
    before = snapshot(outside)
    with pytest.raises(UserError, match="checkpoints is a symbolic link"):
        checkpoints.check_start(str(out), resume=False, overwrite=True)
    with pytest.raises(UserError, match="checkpoints is a symbolic link"):
        checkpoints.start_fresh(str(out), {"model": "x"})
    assert snapshot(outside) == before


def test_prepare_overwrite_never_follows_a_linked_data_folder(tmp_path, texts):
    out = tmp_path / "run"
    path = run_config(tmp_path, out, texts / "a.txt", data={"records_per_shard": 40})
    payload_main("tokenizer", "--config", path, check=True)
    payload_main("prepare", "--config", path, check=True)
    outside = tmp_path / "elsewhere"
    (out / "data" / "train").rename(outside)  # the user keeps the shards elsewhere, linked
    (out / "data" / "train").symlink_to(outside)
    before = snapshot(outside)
    path = run_config(tmp_path, out, texts / "a.txt", "longer",
                      data={"records_per_shard": 40, "seq_len": 48})
    done = payload_main("prepare", "--config", path, "--overwrite")
    assert_user_error(done, "is a symbolic link")
    assert snapshot(outside) == before


def test_export_never_copies_through_a_linked_model_folder(tmp_path):
    out = tmp_path / "run"
    ownership.claim_output_dir(str(out))
    home = _outside(tmp_path, {".ssh/id_rsa": "PRIVATE KEY\n", "notes.txt": "mine\n"})
    (out / "model").symlink_to(home)
    before = snapshot(home)
    with pytest.raises(UserError, match="model is a symbolic link"), \
            folders.replacing_folder(str(out / "model"), {"stage": "export"}) as folder:
        Path(folder, "config.json").write_text("{}")
    assert snapshot(home) == before
    assert not any("PRIVATE" in p.read_text() for p in out.rglob("*")
                   if p.is_file() and not p.is_symlink() and home not in p.resolve().parents)
    # A real model/ holding a link: the link's target is not copied into the new model/.
    (out / "model").unlink()
    (out / "model").mkdir()
    (out / "model" / "key").symlink_to(home / ".ssh" / "id_rsa")
    with folders.replacing_folder(str(out / "model"), {"stage": "export"}) as folder:
        Path(folder, "config.json").write_text("{}")
    assert sorted(p.name for p in (out / "model").iterdir()) == [".tpuctl-complete",
                                                                  "config.json"]
    assert snapshot(home) == before


def test_a_download_target_that_is_a_link_is_refused_and_linked_leftovers_go(tmp_path):
    from launcher.launch import check_download_target

    mine = _outside(tmp_path, {"weights.bin": "mine\n"})
    target = tmp_path / "model"
    target.symlink_to(mine)
    with pytest.raises(UserError, match="is a symbolic link"):
        check_download_target(target)
    # What an earlier version left: the link, swapped out to the staging name.
    target.unlink()
    leftover = tmp_path / ".model.tpuctl-new"
    leftover.symlink_to(mine)
    with folders.replacing_folder(str(target), {"stage": "download"}) as folder:
        Path(folder, "config.json").write_text("{}")
    assert not os.path.lexists(leftover)
    assert (target / "config.json").exists() and (mine / "weights.bin").read_text() == "mine\n"
