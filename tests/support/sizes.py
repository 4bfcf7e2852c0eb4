"""The published vocabularies and run config the size tests share (tests/fast and
tests/integration).
"""

from __future__ import annotations

from payload.config import parse_config
from payload.core.families import FAMILIES

# The vocabularies the published models were counted with.
PUBLISHED_VOCAB = {"bert": 30522, "roberta": 50265, "gpt2": 50257, "t5": 32128,
                   "llama": 49152}  # SmolLM's (TinyLlama's is 32,000)


def run_config(model: dict, **data):
    return parse_config({
        "name": "m",
        "output_dir": "/tmp/m",
        "data": {"corpus": ["a.txt"], "seq_len": 128, **data},
        "model": model,
        # The default engine where it trains the family (Llama: JAX only).
        "train": {"steps": 1, "batch_size": 8, "learning_rate": 1e-3,
                  **({} if "tensorflow" in FAMILIES[model["family"]].engines
                     else {"engine": "jax"})},
    })
