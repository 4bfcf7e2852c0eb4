"""Staging a local corpus to a bucket: content-addressed, skipped when unchanged, resumable."""

from __future__ import annotations

import os

import pytest

from launcher import staging
from payload.core import storage
from tests.support.cloud import storage_server


@pytest.fixture
def bucket(monkeypatch):
    with storage_server(default_bucket="stage-test") as url:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        monkeypatch.setattr(storage, "_client", None)
        yield "stage-test"


def corpus(tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for i in range(3):
        (folder / f"part-{i}.txt").write_text(f"document {i}\n" * (2000 + i))
    (folder / "notes.jsonl").write_text('{"text": "a json document"}\n')
    return folder


def test_staging_uploads_once_and_keeps_corpus_order(tmp_path, bucket):
    folder = corpus(tmp_path)
    events = []
    staged = staging.stage_corpus([str(folder / "part-*.txt"), "gs://other/x.txt",
                                   str(folder / "notes.jsonl")], bucket=bucket,
                                  on_event=events.append)
    assert [s.rsplit("/", 1)[-1] for s in staged] == [
        "part-0.txt", "part-1.txt", "part-2.txt", "x.txt", "notes.jsonl"]
    assert staged[3] == "gs://other/x.txt"
    for path in staged[:3] + staged[4:]:
        assert path.startswith(f"gs://{bucket}/corpus/")
        name = path.rsplit("/", 1)[-1]
        assert storage.read_bytes(path) == (folder / name).read_bytes()
    assert "4 files, 4 uploaded, 0 already there" in events[-1]
    assert any("MB" in e for e in events[:-1])
    again = []
    assert staging.stage_corpus([str(folder / "part-*.txt"), "gs://other/x.txt",
                                 str(folder / "notes.jsonl")], bucket=bucket,
                                on_event=again.append) == staged
    assert "0 uploaded, 4 already there" in again[-1]
    # A changed file goes to a new place; the others stay where they are.
    (folder / "part-1.txt").write_text("changed\n")
    changed = staging.stage_corpus([str(folder / "part-*.txt")], bucket=bucket)
    assert changed[0] == staged[0] and changed[2] == staged[2] and changed[1] != staged[1]


def test_an_interrupted_staging_finishes_on_the_next_run(tmp_path, bucket, monkeypatch):
    folder = corpus(tmp_path)
    from google.cloud.storage import Blob

    real = Blob.upload_from_filename
    calls = {"n": 0}

    def flaky(self, filename, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("network dropped")
        return real(self, filename, *args, **kwargs)

    monkeypatch.setattr(staging, "PARALLEL", 1)
    monkeypatch.setattr(Blob, "upload_from_filename", flaky)
    with pytest.raises(staging.UserError, match="rerun: files already uploaded are kept"):
        staging.stage_corpus([str(folder / "part-*.txt")], bucket=bucket)
    monkeypatch.setattr(Blob, "upload_from_filename", real)
    events = []
    staged = staging.stage_corpus([str(folder / "part-*.txt")], bucket=bucket,
                                  on_event=events.append)
    assert "3 files, 1 uploaded, 2 already there" in events[-1]  # the one that failed
    assert all(storage.exists(p) for p in staged)
    assert os.path.basename(staged[1]) == "part-1.txt"


def test_a_staged_config_names_each_copy_as_its_entry_was_written(tmp_path, bucket):
    """metrics.json's examples_per_source names the pool of plain entries by what the config
    wrote, not by the staged gs:// copies; a weighted gs:// entry beside them is kept."""
    from payload.config import load_config

    corpus(tmp_path)
    (tmp_path / "run.yaml").write_text(
        "name: r\noutput_dir: gs://stage-test/run\n"
        "cluster: {provider: gcp, project: my-project, zone: us-central2-b,\n"
        "          accelerator_type: v4-8, bucket: stage-test}\n"
        "data:\n  corpus:\n    - texts/part-*.txt\n    - texts/notes.jsonl\n"
        "    - {path: gs://other/code/*.txt, weight: 0.25}\n"
        "model: {family: gpt2, size: tiny}\ntrain: {steps: 4, batch_size: 8, learning_rate: 0.001}\n")
    config = load_config(tmp_path / "run.yaml")
    assert config.data.source_name("") == "texts/part-*.txt + texts/notes.jsonl"
    staged = staging.staged_config(config)
    assert len(staged.data.corpus) == 5 and staged.data.corpus[-1] == config.data.corpus[-1]
    assert all(p.startswith("gs://stage-test/corpus/") for p in staged.data.paths[:4])
    assert staged.data.source_name("") == "texts/part-*.txt + texts/notes.jsonl"
    assert staged.data.source_name("gs://other/code/*.txt") == "gs://other/code/*.txt"
