"""Model folders crafted to break a reader (issue 32): the good roberta folder of
tests/support/weights_files with one thing changed, and what the one line refusing it says.
Both bad-input catalogues (the payload's pre-flight, the launcher's `train --dry-run`) run
every case."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tests.support.weights_files import CONFIG, header_and_data, safetensors_bytes

DEEP = 100_000  # levels of JSON nesting: Python's own parser gives up near 1,000


def deep_json(inner: str = "1") -> str:
    return "[" * DEEP + inner + "]" * DEEP


def _config(folder: Path, **changes) -> None:
    (folder / "config.json").write_text(json.dumps({**CONFIG, **changes}))


def _replace(folder: Path, name: str, how: str) -> None:
    path = folder / name
    path.unlink()
    if how == "folder":
        path.mkdir()
        (path / "inside.json").write_text("{}")
    else:
        os.mkfifo(path)


def _deep_header(folder: Path) -> None:
    header, data = header_and_data()
    raw = json.dumps(header)[:-1] + ', "x": ' + deep_json() + "}"
    (folder / "model.safetensors").write_bytes(safetensors_bytes(raw.encode(), data))


def _hard_link(folder: Path) -> None:
    outside = folder.parent / "elsewhere.json"
    os.replace(folder / "tokenizer.json", outside)
    os.link(outside, folder / "tokenizer.json")


# (id, change the folder, what the line says: the folder's key, model.init_from, and the file
# are named in every line, the safetensors lines by the file's path)
CRAFTED: list[tuple[str, Callable[[Path], None], list[str]]] = [
    ("config-nested-deep", lambda f: (f / "config.json").write_text(
        '{"model_type": "roberta", "x": ' + deep_json() + "}"),
     ["model.init_from", "config.json nests deeper than 64 levels"]),
    ("tokenizer-nested-deep", lambda f: (f / "tokenizer.json").write_text(deep_json()),
     ["model.init_from", "tokenizer.json nests deeper than 64 levels"]),
    ("safetensors-header-nested-deep", _deep_header,
     ["pretrained/model.safetensors is not a readable safetensors file",
      "its header nests deeper"]),
    ("safetensors-a-folder", lambda f: _replace(f, "model.safetensors", "folder"),
     ["model.init_from", "model.safetensors is a folder, not a file"]),
    ("config-a-folder", lambda f: _replace(f, "config.json", "folder"),
     ["model.init_from", "config.json is a folder, not a file"]),
    ("safetensors-a-named-pipe", lambda f: _replace(f, "model.safetensors", "pipe"),
     ["model.init_from", "model.safetensors is a named pipe, not a file"]),
    ("config-a-named-pipe", lambda f: _replace(f, "config.json", "pipe"),
     ["model.init_from", "config.json is a named pipe, not a file"]),
    ("tokenizer-a-named-pipe", lambda f: _replace(f, "tokenizer.json", "pipe"),
     ["model.init_from", "tokenizer.json is a named pipe, not a file"]),
    ("tokenizer-a-hard-link", _hard_link,
     ["model.init_from", "tokenizer.json has 2 hard links", "the folder's own"]),
    ("type-vocab-size-text", lambda f: _config(f, type_vocab_size="x"),
     ["model.init_from", "config.json's type_vocab_size is \"x\", not a whole number above 0"]),
    ("type-vocab-size-negative", lambda f: _config(f, type_vocab_size=-5),
     ["model.init_from", "config.json's type_vocab_size is -5, not a whole number above 0"]),
    ("layer-norm-eps-text", lambda f: _config(f, layer_norm_eps="abc"),
     ["model.init_from", "config.json's layer_norm_eps is \"abc\", not a number above 0"]),
    ("dropout-above-1", lambda f: _config(f, hidden_dropout_prob=1.5),
     ["model.init_from", "config.json's hidden_dropout_prob is 1.5, not a share from 0 up to 1"]),
    ("heads-do-not-divide", lambda f: _config(f, num_attention_heads=3),
     ["model.init_from", "config.json: 3 heads do not divide hidden size 32"]),
    ("too-few-positions", lambda f: _config(f, max_position_embeddings=20),
     ["model.init_from", "config.json has 20 positions, too few for data.seq_len 32", "needs 34"]),
]


def crafted_folder(root: Path, change: Callable[[Path], None]) -> Path:
    """The good model folder (weights, config.json, tokenizer.json) under `root`, changed."""
    from tests.support.weights_files import model_folder

    folder = model_folder(root)
    change(folder)
    return folder
