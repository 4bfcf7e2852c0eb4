"""Stage `prepare`: shards that are complete, disjoint, resumable and checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from payload.config import load_config
from tests.support.configs import base_config, write_config
from tests.support.prepared_shards import manifest_of, rows_of
from tests.support.runners import assert_user_error, payload_main


@pytest.fixture(scope="module")
def marked_corpus(tmp_path_factory, documents) -> Path:
    """Documents that each start with a unique marker word, so rows show where text came from."""
    path = tmp_path_factory.mktemp("marked") / "marked.txt"
    lines = [f"zq{i:04d}x " + " ".join(d.split()) for i, d in enumerate(documents[:700])]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, marked_corpus) -> Path:
    out = tmp_path_factory.mktemp("tok")
    config = base_config(out / "run", marked_corpus, tokenizer={"kind": "bpe", "vocab_size": 800})
    payload_main("tokenizer", "--config", str(write_config(out / "run.yaml", config)), check=True)
    return out / "run" / "tokenizer"






def test_t5_rows_have_the_expanded_length(tmp_path, marked_corpus):
    config = base_config(tmp_path / "t5", marked_corpus, model={"family": "t5"},
                         tokenizer={"kind": "sentencepiece", "vocab_size": 600})
    path = write_config(tmp_path / "t5.yaml", config)
    payload_main("tokenizer", "--config", path, check=True)
    payload_main("prepare", "--config", path, check=True)
    manifest = manifest_of(tmp_path / "t5")
    assert manifest.record_len == load_config(path).record_len > 32
    rows = rows_of(tmp_path / "t5", "train")
    assert rows.shape[1] == manifest.record_len
    assert (rows == 2).any()  # documents end with </s>


def tiny_run(tmp_path: Path, text: str, tokenizer_dir: Path) -> Path:
    """A run config over a corpus of `text`, with its tokenizer in place; the config's path."""
    tiny = tmp_path / "tiny.txt"
    tiny.write_text(text)
    config = base_config(tmp_path / "run", tiny, tokenizer={"path": str(tokenizer_dir)})
    path = write_config(tmp_path / "run.yaml", config)
    payload_main("tokenizer", "--config", path, check=True)
    return path


def test_more_workers_than_documents(tmp_path, tokenizer_dir):
    path = tiny_run(tmp_path, "just one document here\nand a second one\n", tokenizer_dir)
    outcomes = [payload_main("prepare", "--config", path, "--worker-index", str(i),
                            "--num-workers", "3") for i in range(3)]
    failed = [p for p in outcomes if p.returncode != 0]
    assert failed
    assert_user_error(failed[0], "has no documents", "fewer workers")


def test_too_little_text_for_one_row(tmp_path, tokenizer_dir):
    path = tiny_run(tmp_path, "few words\n", tokenizer_dir)
    assert_user_error(payload_main("prepare", "--config", path),
                      "no full training row", "seq_len")


def test_prepare_without_a_tokenizer(tmp_path, marked_corpus):
    config = base_config(tmp_path / "run", marked_corpus)
    path = write_config(tmp_path / "run.yaml", config)
    assert_user_error(payload_main("prepare", "--config", path), "no tokenizer", "tokenizer stage")


def test_unwritable_output_dir(tmp_path, marked_corpus):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out in (blocker, blocker / "sub"):
        config = base_config(out, marked_corpus)
        path = write_config(tmp_path / "run.yaml", config)
        proc = payload_main("tokenizer", "--config", path)
        assert_user_error(proc, str(blocker))


