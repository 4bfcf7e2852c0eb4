"""A model or tokenizer folder crafted by someone else (issue 32, items 2 and 3): what tpuctl
reads of it is a private copy of the folder's own files, read from the descriptor that was
checked, so the fingerprint, prepare, train and export all see the same bytes; keys that point
elsewhere are dropped; and every reader of a user file refuses what is not a plain file, or is
too deep, in one line, without waiting on a pipe. The bad-input catalogues
(tests/fast/test_payload_bad_inputs.py, tests/fast/test_bad_inputs.py) run every crafted folder
of tests/support/crafted through the pre-flight and `train --dry-run`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from payload.config import load_config, parse_config
from payload.core import reading
from payload.core.errors import UserError
from payload.core.families import check_shape
from payload.core.stages import Stage
from payload.training.preflight import check_before_start
from tests.support.configs import base_config, line_corpus, write_config
from tests.support.crafted import deep_json
from tests.support.weights_files import model_folder, run_config

SECRET = b"the user's private notes: nothing of this may be read\n"


def _tokenizer(vocab_size: int, texts: int) -> str:
    from payload.core.families import FAMILIES
    from payload.data.tokenizer import train_tokenizer

    tok = train_tokenizer("bpe", [f"line {i} about the {i % 7} seas and {i % 13} winds"
                                  for i in range(texts)], vocab_size=vocab_size,
                          family=FAMILIES["roberta"])
    return tok.to_str()


def test_a_tokenizer_config_pointing_elsewhere_is_dropped_and_every_stage_reads_the_same_bytes(
        tmp_path, caplog):
    """`tokenizer_file` (and its kin) in tokenizer_config.json made transformers load another
    tokenizer.json than the one prepare encoded with and the fingerprint named (274 tokens
    prepared, 673 trained); now every reader takes the folder's own, and no file tpuctl writes
    carries the outside path."""
    from payload.data import tokenizer as data_tokenizer
    from payload.training import model as model_lib

    folder = model_folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "tokenizer.json").write_text(_tokenizer(700, 400))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "model_max_length": 32, "tokenizer_file": str(elsewhere / "tokenizer.json"),
        "fast_tokenizer_files": ["../elsewhere/tokenizer.json"],
        "auto_map": {"AutoTokenizer": ["x--y.Tok", None]},
        "special_tokens_map_file": str(elsewhere / "special_tokens_map.json")}))
    config = run_config(tmp_path, folder)

    encoder, prepared = data_tokenizer.load_tokenizer(config)  # what prepare encodes with
    trained, fingerprint = model_lib.load_tokenizer(config)  # what train and export load
    own = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    assert encoder.get_vocab_size() == len(trained) == len(own)
    assert data_tokenizer.planned_vocab_size(config) == len(own)
    assert prepared == fingerprint
    assert "tokenizer_file" in caplog.text and "ignored" in caplog.text

    files = data_tokenizer.read_tokenizer_files(config)  # what output_dir and model/ get
    settings = json.loads(files["tokenizer_config.json"])
    assert settings == {"model_max_length": 32}
    assert not any(str(elsewhere).encode() in data for data in files.values())


def test_a_config_json_pointing_at_code_elsewhere_is_not_carried_into_the_run(tmp_path):
    from payload.training.pretrained import pretrained_config

    folder = model_folder(tmp_path)
    settings = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(
        {**settings, "auto_map": {"AutoConfig": "someone/else--config.Config"}}))
    hf = pretrained_config(str(folder), family="roberta", vocab_size=300)
    assert "auto_map" not in hf.to_dict()  # so not in the exported config.json either


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_hard_link_to_a_file_elsewhere_is_refused_by_every_reader(tmp_path, name):
    from payload.data.tokenizer import read_tokenizer_files
    from payload.training import pretrained

    folder = model_folder(tmp_path)
    outside = tmp_path / f"outside-{name}"
    os.replace(folder / name, outside)
    os.link(outside, folder / name)
    config = run_config(tmp_path, folder)
    with pytest.raises(UserError, match=f"model.init_from .*: {name} has 2 hard links"):
        check_before_start(config, stages={Stage.TRAIN}, resume=False, overwrite=False)
    with pytest.raises(UserError, match=f"{name} has 2 hard links"):  # the stages' readers
        if name == "config.json":
            pretrained.pretrained_config(str(folder), family="roberta", vocab_size=300)
        elif name == "tokenizer.json":
            read_tokenizer_files(config)
        else:
            with pretrained.opened_weights(str(folder), name):
                pass
    assert not (tmp_path / "out").exists()


def test_a_folder_file_is_read_from_the_descriptor_that_was_checked(tmp_path, monkeypatch):
    """The race in the old check-then-read (a file swapped for a link between the check and
    the copy) cannot happen: the name is opened once, without following a link, and the bytes
    come from that descriptor. Swapping the name for a link to a secret right after the open
    changes nothing read."""
    folder = model_folder(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    original = (folder / "tokenizer.json").read_bytes()
    read_fd = reading._read_fd

    def swapped_then_read(fd, **kwargs):
        link = folder / "tokenizer.json"
        if not link.is_symlink():
            link.unlink()
            link.symlink_to(secret)
        return read_fd(fd, **kwargs)

    monkeypatch.setattr(reading, "_read_fd", swapped_then_read)
    files = reading.read_folder(str(folder), ["tokenizer.json"], source="model.init_from f")
    assert files == {"tokenizer.json": original}
    # The next read opens the name again and meets the link: refused.
    with pytest.raises(UserError, match=r"tokenizer\.json is a symbolic link"):
        reading.read_folder(str(folder), ["tokenizer.json"], source="model.init_from f")


def test_weights_are_read_through_the_file_that_was_opened(tmp_path):
    folder = model_folder(tmp_path)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(SECRET)
    original = (folder / "model.safetensors").read_bytes()
    with reading.opened_in_folder(str(folder), "model.safetensors", source="m") as path:
        (folder / "model.safetensors").unlink()
        (folder / "model.safetensors").symlink_to(secret)
        assert Path(path).read_bytes() == original


@pytest.mark.timeout(60)  # a reader that waits on the pipe fails here, not after 600 s
@pytest.mark.parametrize("kind", ["pipe", "folder", "deep", "huge"])
def test_every_reader_of_a_user_file_refuses_what_is_not_a_plain_file(tmp_path, kind):
    """tpuctl.yaml, model.config, data/manifest.json, checkpoints/run.json and TensorFlow's
    checkpoint index: one line each, nothing waited on."""
    from payload.core.engines import engine_spec
    from payload.data.shards import load_manifest
    from payload.training.checkpoints import read_identity
    from payload.training.model import check_model_config_file

    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    (out / "checkpoints").mkdir()
    files = {"run.yaml": tmp_path / "run.yaml", "config.json": tmp_path / "config.json",
             "manifest": out / "data" / "manifest.json",
             "identity": out / "checkpoints" / "run.json",
             "index": out / "checkpoints" / "checkpoint"}
    for path in files.values():
        if kind == "pipe":
            os.mkfifo(path)
        elif kind == "folder":
            path.mkdir()
        elif kind == "deep":
            path.write_text(deep_json())
        else:
            with open(path, "wb") as f:
                f.truncate(reading.JSON_LIMIT + 1)  # sparse: larger than any reader takes
    readers = {
        "run.yaml": lambda: load_config(files["run.yaml"]),
        "config.json": lambda: check_model_config_file(str(files["config.json"]), "gpt2"),
        "manifest": lambda: load_manifest(str(out)),
        "identity": lambda: read_identity(str(out)),
    }
    if kind == "deep":  # the index is text, not JSON; YAML's nesting is the config's rule
        del readers["run.yaml"]
    else:
        readers["index"] = lambda: engine_spec("tensorflow").listed_steps(str(out))
    for name, read in readers.items():
        with pytest.raises(UserError) as info:
            read()
        line = str(info.value)
        assert "\n" not in line
        expected = {"pipe": "is a named pipe, not a file", "folder": "a folder",
                    "deep": "nest", "huge": "larger than"}[kind]
        assert expected in line, (name, line)


def test_the_preflight_checks_the_shape_the_stages_build(tmp_path):
    """Heads that do not divide the hidden size, or too few positions for data.seq_len, in a
    model.config file: refused before start, as the train stage would."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "n_head": 3,
                                "n_positions": 64, "n_layer": 1}))
    raw = base_config(tmp_path / "out", line_corpus(tmp_path))
    raw["model"] = {"family": "gpt2", "config": str(path)}
    config = load_config(write_config(tmp_path / "run.yaml", raw))
    with pytest.raises(UserError, match="3 heads do not divide hidden size 32"):
        check_before_start(config, stages={Stage.TRAIN}, resume=False, overwrite=False)


def test_positions_are_checked_for_the_families_that_have_them():
    check_shape({"d_model": 30, "num_heads": 4}, "t5", seq_len=4096, what="c")  # relative
    with pytest.raises(UserError, match=r"has 512 positions, too few for data\.seq_len 1024"):
        check_shape({"n_positions": 512}, "gpt2", seq_len=1024, what="c")
    with pytest.raises(UserError, match="a roberta model needs 514"):
        check_shape({"max_position_embeddings": 512}, "roberta", seq_len=512, what="c")


def test_a_tokenizer_path_folder_is_read_the_same_way(tmp_path):
    """tokenizer.path gets the same private copy as model.init_from."""
    from payload.data.tokenizer import read_tokenizer_files

    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(_tokenizer(300, 50))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_file": "/etc/hosts"}))
    raw = base_config(tmp_path / "out", line_corpus(tmp_path))
    raw["tokenizer"] = {"path": str(folder)}
    config = parse_config(yaml.safe_load(yaml.safe_dump(raw)))
    assert json.loads(read_tokenizer_files(config)["tokenizer_config.json"]) == {}
    os.replace(folder / "tokenizer.json", tmp_path / "t.json")
    (folder / "tokenizer.json").symlink_to(tmp_path / "t.json")
    with pytest.raises(UserError, match=r"tokenizer\.path .*tokenizer\.json is a symbolic link"):
        read_tokenizer_files(config)
