"""The run configs the JAX plan tests share (tests/fast and tests/integration)."""

from __future__ import annotations

from tests.support.paths import REPO


def config(tmp_path, **sections) -> dict:
    raw = {
        "name": "speed",
        "output_dir": str(tmp_path / "out"),
        "cluster": {"provider": "local", "workers": 1},
        "data": {"corpus": str(REPO / "payload" / "data" / "corpus.txt.gz"), "seq_len": 128},
        "tokenizer": {"kind": "bpe", "vocab_size": 8000},
        "model": {"family": "bert", "size": "tiny"},
        "train": {"engine": "jax", "steps": 100, "batch_size": 32, "learning_rate": 5e-4},
    }
    for key, value in sections.items():
        raw[key] = {**raw[key], **value} if key in ("train", "model", "data") else value
    return raw


V6E = {"provider": "gcp", "project": "my-project", "zone": "us-east5-b",
       "accelerator_type": "v6e-8"}
