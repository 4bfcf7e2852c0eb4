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




def test_a_weighted_corpus_is_prepared_source_by_source_and_drawn_by_weight(
        tmp_path, marked_corpus, tokenizer_dir):
    # Two corpora weighted 0.8/0.2 (issue 34's acceptance): prepare keeps each apart, in both
    # splits, on every worker; training draws each global batch from them by weight, and
    # metrics.json names each by its data.corpus entry.
    import re

    import numpy as np
    from tokenizers import Tokenizer

    from payload.data.objectives import CausalLM
    from payload.data.reader import Reader
    from payload.data.stream import Segment, TrainStream
    from payload.training.inputs import data_weights

    lines = marked_corpus.read_text().splitlines(keepends=True)
    web, code = tmp_path / "web.txt", tmp_path / "code.txt"
    web.write_text("".join(lines[:500]))
    code.write_text("".join(lines[500:]))
    corpus = [{"path": str(web), "weight": 0.8}, {"path": str(code), "weight": 0.2}]
    config = base_config(tmp_path / "run", [], tokenizer={"path": str(tokenizer_dir)})
    config["data"]["corpus"] = corpus
    path = write_config(tmp_path / "run.yaml", config)
    payload_main("tokenizer", "--config", path, check=True)
    for worker in ("0", "1"):
        payload_main("prepare", "--config", path, "--worker-index", worker, "--num-workers", "2",
                     check=True)
    run, manifest = tmp_path / "run", manifest_of(tmp_path / "run")
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    for split in ("train", "validation"):
        reader = Reader.of(manifest, str(run / "data"), split)
        assert list(reader.sources) == [str(web), str(code)], split
        for name, lo, hi in ((str(web), 0, 500), (str(code), 500, 700)):
            ids = reader.rows(name, np.arange(reader.sources[name].records))
            marks = {int(m) for row in ids
                     for m in re.findall(r"zq(\d{4})x", tok.decode(row.tolist()).replace(" ", ""))}
            assert marks and all(lo <= m < hi for m in marks), (split, name)
    # Each shard's rows are the writer's; the workers' shards of both sources are all there.
    assert {e.name.split("-")[1] for e in manifest.splits["train"].shards} == {
        "w00000of00002", "w00001of00002"}

    config = load_config(path)
    weights = data_weights(config, manifest)
    assert weights == {str(web): 0.8, str(code): 0.2}
    reader, steps, batch = Reader.of(manifest, str(run / "data"), "train"), 60, 8
    stream = TrainStream(reader, [Segment(step=0, consumed=dict.fromkeys(weights, 0),
                                          batch_size=batch, weights=weights, seed=0, data="d")],
                         CausalLM(pad_id=0), 0)
    drawn = {config.data.source_name(n): c for n, c in stream.consumed(steps).items()}
    assert drawn.keys() == {str(web), str(code)}
    for name, weight in ((str(web), 0.8), (str(code), 0.2)):
        assert abs(drawn[name] / (steps * batch) - weight) <= 0.02, drawn


def test_a_corpus_other_than_the_prepared_one_is_refused_before_training(tmp_path):
    from payload.config import parse_config
    from payload.core.errors import UserError
    from payload.data import shards
    from payload.training.inputs import data_weights

    (tmp_path / "a.txt").write_text("a\n")
    (tmp_path / "b.txt").write_text("b\n")
    pooled = shards.Manifest(
        format=shards.FORMAT, seq_len=8, record_len=8, dtype="uint16", family="gpt2",
        vocab_size=9, tokenizer_fingerprint="", data_fingerprint="", num_workers=1, documents=1,
        invalid_utf8_lines=0, splits={"train": shards.SplitSummary(shards=[
            shards.ShardEntry("x", 1, 8, 9, "", "")])})
    raw = base_config(tmp_path / "run", [tmp_path / "a.txt"])
    raw["data"]["corpus"] = [str(tmp_path / "a.txt"), {"path": str(tmp_path / "b.txt"),
                                                       "weight": 0.5}]
    with pytest.raises(UserError, match=r"does not keep apart.*b\.txt"):
        data_weights(parse_config(raw), pooled)
