"""A broken weights file or config.json in a model folder (issue 27, item 5) is one line naming
the file and what is wrong, before anything starts and nothing written: every entry of a
model.safetensors header is checked as the safetensors reader checks it (the launcher's
pre-flight and the train stage's readers alike), and config.json must be a JSON object whose
sizes are whole numbers. A well-formed file still loads, to the byte."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from payload.core.errors import UserError
from payload.core.stages import Stage
from payload.training.preflight import check_before_start
from tests.support.weights_files import (
    CONFIG,
    EMBEDDINGS,
    LAYER,
    header_and_data,
    model_folder,
    run_config,
    safetensors_bytes,
)


def with_entry(name: str, **changes):
    def change(header: dict, data: bytes):
        entry = {k: v for k, v in {**header[name], **changes}.items() if v is not None}
        return safetensors_bytes({**header, name: entry}, data)
    return change


# (id, the file from the well-formed header and data, what the line says)
BROKEN = [
    ("entry-not-an-object", lambda h, d: safetensors_bytes({"w": 1}, b""),
     ["entry 'w' is 1, not an object"]),
    ("entry-without-dtype", with_entry(EMBEDDINGS, dtype=None), [f"{EMBEDDINGS}' has no dtype"]),
    ("shape-a-number", with_entry(EMBEDDINGS, shape=5), ["has shape 5, not a list of sizes"]),
    ("shape-negative", with_entry(EMBEDDINGS, shape=[-600, 32]), ["not a list of sizes"]),
    ("offsets-out-of-range", with_entry(LAYER, data_offsets=[76800, 10 ** 9]),
     ["data_offsets [76800, 1000000000]", "outside the file's 80896 bytes of data"]),
    ("offsets-not-numbers", with_entry(LAYER, data_offsets=["0", "4"]), ["data_offsets"]),
    ("offsets-short-of-the-shape", with_entry(LAYER, shape=[32, 64]),
     ["spans 4096 bytes but its shape [32, 64] of F32 needs 8192"]),
    ("entries-overlap", lambda h, d: safetensors_bytes(
        {**h, LAYER: {**h[LAYER], "data_offsets": [0, 4096]}}, d),
     ["starts at byte 0 of the data, not at 4096"]),
    ("bytes-after-the-entries", lambda h, d: safetensors_bytes(h, d + b"\0" * 8),
     ["its entries hold 80896 bytes but the file has 80904"]),
    ("header-length-past-the-file", lambda h, d: safetensors_bytes(h, d, length=10 ** 7),
     ["its header length 10000000 runs past the end of the file"]),
    ("header-length-zero", lambda h, d: safetensors_bytes(b"", d, length=0),
     ["a header length of 0"]),
    ("header-not-json", lambda h, d: safetensors_bytes(b"{not json", d),
     ["its header is not JSON"]),
    ("header-an-array", lambda h, d: safetensors_bytes(b"[1, 2]", b""),
     ["its header is not a JSON object"]),
    ("metadata-not-strings", lambda h, d: safetensors_bytes({**h, "__metadata__": {"a": 1}}, d),
     ["__metadata__ is not an object of strings"]),
    ("shorter-than-a-length", lambda h, d: b"\x01\x02", ["no header (the file is 2 bytes)"]),
    ("bfloat16", with_entry(LAYER, dtype="BF16", data_offsets=[76800, 78848]),
     ["holds BF16 values, which tpuctl does not read", "float32"]),
]






def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def refused_before_start(root: Path, config) -> str:
    before = tree(root)
    with pytest.raises(UserError) as info:
        check_before_start(config, stages={Stage.TOKENIZER, Stage.PREPARE, Stage.TRAIN},
                           resume=False, overwrite=False)
    assert tree(root) == before, "something was written"
    line = str(info.value)
    assert "\n" not in line
    return line


def test_the_well_formed_file_is_accepted_and_loads_to_the_byte(tmp_path):
    from safetensors.numpy import load_file

    from payload.core.pytorch_weights import load_tensors, read_header

    folder = model_folder(tmp_path)
    path = str(folder / "model.safetensors")
    check_before_start(run_config(tmp_path, folder), stages={Stage.PREPARE, Stage.TRAIN},
                       resume=False, overwrite=False)
    assert read_header(path) == {EMBEDDINGS: ("F32", (600, 32)), LAYER: ("F32", (32, 32))}
    ours, theirs = load_tensors(path), load_file(path)  # safetensors' reader agrees it is whole
    assert ours.keys() == theirs.keys()
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name])


def test_a_file_the_safetensors_writer_made_is_accepted(tmp_path):
    from safetensors.numpy import save_file

    from payload.core.pytorch_weights import read_header

    path = tmp_path / "model.safetensors"
    save_file({"a": np.zeros((3, 5), np.float16), "b": np.zeros((0,), np.int64),
               "c": np.ones((7,), np.float32)}, str(path), metadata={"format": "pt"})
    assert read_header(str(path)) == {"a": ("F16", (3, 5)), "b": ("I64", (0,)),
                                      "c": ("F32", (7,))}


@pytest.mark.parametrize(("build", "needles"), [c[1:] for c in BROKEN], ids=[c[0] for c in BROKEN])
def test_a_broken_safetensors_file_is_one_line_before_anything_starts(tmp_path, build, needles):
    from payload.core.pytorch_weights import load_tensors

    folder = model_folder(tmp_path, weights=build(*header_and_data()))
    line = refused_before_start(tmp_path, run_config(tmp_path, folder))
    for needle in [str(folder / "model.safetensors"), *needles]:
        assert needle in line, f"{needle!r} not in {line!r}"
    # The train stage's reader (either engine's) says the same, without the pre-flight.
    with pytest.raises(UserError) as info:
        load_tensors(str(folder / "model.safetensors"))
    assert str(info.value) == line


CONFIGS = [
    ("not-json", "hidden_size = 32\n", ["config.json is not JSON"]),
    ("an-array", "[1, 2]", ["config.json is not a JSON object"]),
    ("a-string", '"roberta"', ["config.json is not a JSON object"]),
    ("not-utf8", b"\xff\xfe{}".decode("latin-1"), ["config.json is not JSON"]),
    ("no-model-type", json.dumps({k: v for k, v in CONFIG.items() if k != "model_type"}),
     ["config.json has no model_type"]),
    ("size-a-string", json.dumps({**CONFIG, "vocab_size": "600"}),
     ["config.json's vocab_size is \"600\", not a whole number above 0"]),
    ("size-negative", json.dumps({**CONFIG, "num_hidden_layers": -1}),
     ["num_hidden_layers is -1"]),
]


@pytest.mark.parametrize(("text", "needles"), [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_a_broken_config_json_is_one_line_for_every_reader(tmp_path, text, needles):
    from payload.core.sizes import architecture
    from payload.training.pretrained import pretrained_config

    folder = model_folder(tmp_path, config=None)
    (folder / "config.json").write_bytes(text.encode("latin-1"))
    config = run_config(tmp_path, folder)
    line = refused_before_start(tmp_path, config)
    for needle in [f"model.init_from {folder}", *needles]:
        assert needle in line, f"{needle!r} not in {line!r}"
    for reader in (  # the train stage's, and the launcher's estimate of the model's size
            lambda: pretrained_config(str(folder), family="roberta", vocab_size=300),
            lambda: architecture(config, vocab_size=300)):
        with pytest.raises(UserError) as info:
            reader()
        assert needles[0] in str(info.value)


@pytest.mark.parametrize("text", ["garbage", "[1]", '{"model": {}}', '{"model": {"vocab": 5}}'])
def test_a_broken_tokenizer_json_is_one_line_for_the_size_estimate(tmp_path, text):
    """The launcher's plan counts the model's parameters from the reused tokenizer's size
    before the pre-flight reads the tokenizer itself."""
    from payload.data.tokenizer import planned_vocab_size

    folder = model_folder(tmp_path)
    (folder / "tokenizer.json").write_text(text)
    with pytest.raises(UserError, match=r"model\.init_from .*: tokenizer\.json is not a "
                                        r"tokenizer"):
        planned_vocab_size(run_config(tmp_path, folder))


def test_a_missing_model_config_file_is_one_line(tmp_path):
    from payload.core.sizes import read_config_json

    with pytest.raises(UserError, match=r"model\.config .*nothere\.json does not exist"):
        read_config_json(str(tmp_path / "nothere.json"),
                         source=f"model.config {tmp_path / 'nothere.json'}")


