"""Stage `tokenizer`: every kind trains, round-trips text, and loads back in transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from payload.core.families import FAMILIES
from payload.data.tokenizer import train_tokenizer
from tests.support.configs import base_config, write_config
from tests.support.paths import REPO
from tests.support.runners import assert_user_error, payload_main

KINDS = ["unigram", "bpe", "wordpiece", "sentencepiece"]
FAMILY_FOR_KIND = {"unigram": "roberta", "bpe": "gpt2", "wordpiece": "bert", "sentencepiece": "t5"}


@pytest.fixture(scope="module")
def held_out(documents) -> list[str]:
    return [" ".join(d.split()) for d in documents[3000:3200]]


@pytest.fixture(scope="module", params=KINDS)
def trained(request, tmp_path_factory, small_corpus):
    kind = request.param
    family = FAMILY_FOR_KIND[kind]
    out = tmp_path_factory.mktemp(f"tok-{kind}")
    config = base_config(out / "run", small_corpus, tokenizer={"kind": kind, "vocab_size": 1500},
                         model={"family": family}, data={"seq_len": 64})
    payload_main("tokenizer", "--config", str(write_config(out / "run.yaml", config)), check=True)
    return kind, family, out / "run" / "tokenizer"


def test_files_and_special_tokens(trained):
    _kind, family, folder = trained
    assert (folder / "tokenizer.json").is_file()
    assert (folder / "tokenizer_config.json").is_file()
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    # A plain fast tokenizer class: a model-specific one changes behaviour in transformers 5.
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    spec = FAMILIES[family]
    for expected_id, token in enumerate(spec.special_tokens):
        assert tok.convert_tokens_to_ids(token) == expected_id
    assert tok.pad_token == spec.pad and tok.unk_token == spec.unk
    if spec.mask:
        assert tok.mask_token == spec.mask
    if family == "t5":
        assert len(tok.additional_special_tokens) == 100
    assert 1000 <= len(tok) <= 1600


def test_round_trip_and_compression(trained, held_out):
    kind, _family, folder = trained
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    unk = tok.unk_token_id
    exact, total_tokens, total_bytes = 0, 0, 0
    for line in held_out:
        ids = tok(line, add_special_tokens=False)["input_ids"]
        total_tokens += len(ids)
        total_bytes += len(line.encode())
        back = tok.decode(ids)
        if kind == "wordpiece":  # BERT-style decoding re-spaces punctuation
            same = back.replace(" ", "") == line.replace(" ", "")
        else:
            same = back == line
        exact += same or unk in ids
    assert exact / len(held_out) >= 0.98, f"{kind}: only {exact}/{len(held_out)} round-trip"
    # A real subword tokenizer, not characters: well under one token per byte.
    assert total_tokens / total_bytes < 0.45


def test_post_processor_adds_the_family_markers(trained):
    _kind, family, folder = trained
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("hello world")["input_ids"]
    spec = FAMILIES[family]
    if family == "bert":
        assert ids[0] == tok.convert_tokens_to_ids("[CLS]") and ids[-1] == tok.sep_token_id
    elif family == "roberta":
        assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    elif family == "t5":
        assert ids[-1] == tok.convert_tokens_to_ids(spec.eos)
    else:
        assert ids == tok("hello world", add_special_tokens=False)["input_ids"]


def test_sentencepiece_conversion_matches_the_sentencepiece_model(small_corpus, held_out):
    from payload.data.tokenizer import _train_sentencepiece

    texts = small_corpus.read_text().splitlines()
    fast, model_bytes = _train_sentencepiece(texts, vocab_size=1200, family=FAMILIES["t5"])
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model_bytes)
    same = sum(processor.encode(line) == fast.encode(line, add_special_tokens=False).ids
               for line in held_out)
    assert same / len(held_out) >= 0.97, f"{same}/{len(held_out)}"


def test_a_rerun_keeps_the_trained_tokenizer(tmp_path, small_corpus):
    config = base_config(tmp_path / "run", small_corpus,
                         tokenizer={"kind": "wordpiece", "vocab_size": 700})
    path = write_config(tmp_path / "run.yaml", config)
    payload_main("tokenizer", "--config", path, check=True)
    first = (tmp_path / "run" / "tokenizer" / "tokenizer.json").read_bytes()
    proc = payload_main("tokenizer", "--config", path, check=True)
    assert "already trained" in proc.stdout
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").read_bytes() == first
    config["tokenizer"]["vocab_size"] = 800
    payload_main("tokenizer", "--config", str(write_config(path, config)), check=True)
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").read_bytes() != first


def test_special_tokens_are_single_tokens_in_text():
    tok = train_tokenizer("unigram", ["some words here"] * 50 + ["other words there"] * 50,
                          vocab_size=200, family=FAMILIES["roberta"])
    ids = tok.encode("a <mask> b", add_special_tokens=False).ids
    assert 4 in ids  # <mask> is id 4 and is never split


def test_reusing_an_existing_tokenizer(trained, tmp_path, small_corpus):
    _kind, family, folder = trained
    config = base_config(tmp_path / "run", small_corpus, tokenizer={"path": str(folder)},
                         model={"family": family})
    payload_main("tokenizer", "--config", str(write_config(tmp_path / "run.yaml", config)), check=True)
    copied = tmp_path / "run" / "tokenizer" / "tokenizer.json"
    assert copied.read_bytes() == (folder / "tokenizer.json").read_bytes()
    # A tokenizer without the family's special tokens is refused.
    other = "t5" if family != "t5" else "bert"
    config = base_config(tmp_path / "run2", small_corpus, tokenizer={"path": str(folder)},
                         model={"family": other})
    proc = payload_main("tokenizer", "--config", str(write_config(tmp_path / "r2.yaml", config)))
    assert_user_error(proc, "lacks", other)


def test_bad_tokenizer_inputs(tmp_path, small_corpus):
    config = base_config(tmp_path / "out", tmp_path / "nope.txt")
    proc = payload_main("tokenizer", "--config", write_config(tmp_path / "a.yaml", config))
    assert_user_error(proc, "no such file")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n   \n\n")
    config = base_config(tmp_path / "out", blank)
    proc = payload_main("tokenizer", "--config", write_config(tmp_path / "b.yaml", config))
    assert_user_error(proc, "no documents")
    config = base_config(tmp_path / "out", small_corpus, tokenizer={"path": str(tmp_path)})
    proc = payload_main("tokenizer", "--config", write_config(tmp_path / "c.yaml", config))
    assert_user_error(proc, "no tokenizer.json")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": 42}')
    config = base_config(tmp_path / "out", small_corpus, tokenizer={"path": str(broken)})
    path = write_config(tmp_path / "d.yaml", config)
    for stage in ("tokenizer", "prepare"):
        proc = payload_main(stage, "--config", path)
        assert_user_error(proc, "is not a valid tokenizer")


def test_cli_usage_errors(tmp_path):
    proc = payload_main("prepare", "--config", tmp_path / "x.yaml", "--worker-index", "3",
                        "--num-workers", "3", cwd=REPO)
    assert_user_error(proc, "--worker-index 3", "0..2")
    proc = payload_main("prepare", "--config", tmp_path / "x.yaml", cwd=REPO)
    assert_user_error(proc, "no config file")
    assert Path(tmp_path).exists()
