"""The model sections the model tests share (tests/fast and tests/integration)."""

from __future__ import annotations

from payload.config import parse_config


def model_section(**model):
    return parse_config(
        {
            "name": "m",
            "output_dir": "/tmp/m",
            "data": {"corpus": ["a.txt"], "seq_len": 64},
            "model": model,
            "train": {"steps": 1, "batch_size": 8, "learning_rate": 1e-3},
        }
    ).model
