"""Weights files and model folders the weights-file tests write (tests/fast and
tests/integration).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from payload.config import parse_config
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
