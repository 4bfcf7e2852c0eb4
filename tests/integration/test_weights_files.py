"""A broken weights file or config.json in a model folder (issue 27, item 5) is one line naming
the file and what is wrong, before anything starts and nothing written: every entry of a
model.safetensors header is checked as the safetensors reader checks it (the launcher's
pre-flight and the train stage's readers alike), and config.json must be a JSON object whose
sizes are whole numbers. A well-formed file still loads, to the byte."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from payload.config import parse_config
from payload.core.errors import UserError
from tests.support.configs import base_config

EMBEDDINGS = "roberta.embeddings.word_embeddings.weight"
LAYER = "roberta.encoder.layer.0.output.dense.weight"
CONFIG = {"model_type": "roberta", "vocab_size": 600, "hidden_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 40}


def header_and_data() -> tuple[dict, bytes]:
    """The header entries and data of a well-formed file of the model CONFIG describes."""
    tensors = {EMBEDDINGS: np.arange(600 * 32, dtype=np.float32).reshape(600, 32),
               LAYER: np.ones((32, 32), np.float32)}
    header, data, at = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, array in tensors.items():
        raw = array.tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [at, at + len(raw)]}
        data, at = data + raw, at + len(raw)
    return header, data


def safetensors_bytes(header, data: bytes, *, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def model_folder(root: Path, weights: bytes | None = None, config: str | None = None) -> Path:
    from payload.core.families import FAMILIES
    from payload.data.tokenizer import train_tokenizer

    folder = root / "pretrained"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG) if config is None else config)
    header, data = header_and_data()
    (folder / "model.safetensors").write_bytes(
        safetensors_bytes(header, data) if weights is None else weights)
    tok = train_tokenizer("bpe", [f"text number {i}" for i in range(50)], vocab_size=300,
                          family=FAMILIES["roberta"])
    (folder / "tokenizer.json").write_text(tok.to_str())
    return folder


def run_config(root: Path, folder: Path):
    corpus = root / "a.txt"
    corpus.write_text("".join(f"line {i} of a small corpus\n" for i in range(100)))
    raw = base_config(root / "out", corpus)
    raw["model"] = {"family": "roberta", "init_from": str(folder)}
    del raw["tokenizer"]
    return parse_config(raw)


def test_a_broken_tf_model_h5_is_one_line(tmp_path):
    """The TF engine's other weights file: not HDF5 at all (integration: builds the TF
    model)."""
    pytest.importorskip("tensorflow")
    from payload.engines.tensorflow.model import build_model
    from payload.engines.tensorflow.pretrained import load_weights
    from payload.training.model import TokenIds, model_config

    folder = model_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "tf_model.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    settings = run_config(tmp_path, folder)
    vocab = TokenIds(vocab_size=600, special=(0, 1, 2, 3, 4), pad=1, unk=3, mask=4, bos=0, eos=2)
    model = build_model(model_config(settings.model, vocab=vocab, seq_len=32))
    with pytest.raises(UserError, match=r"tf_model\.h5 cannot be read"):
        load_weights(model, str(folder))
