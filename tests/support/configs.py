"""Run configs for tests, as dicts (change what a test is about) or files (what users write).

    raw = base_config(tmp_path / "out", corpus, tokenizer={"vocab_size": 800})
    path = write_config(tmp_path / "run.yaml", raw)
    path = tiny_config(tmp_path, output_dir=str(tmp_path / "out"), cluster={...})   # launcher
    raw = training_config(out, "gpt2", steps=20)            # the training tests' model and data
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.paths import BUNDLED

# The training tests' shapes: tiny, but big enough to learn from the bundled corpus.
SEQ_LEN = 32
VOCAB = 600


def base_config(output_dir: Path, corpus, **sections) -> dict:
    """A one-worker local run on `corpus` (a path or a list of them); `sections` override."""
    config = {
        "name": "test",
        "output_dir": str(output_dir),
        "cluster": {"provider": "local", "workers": 1},
        "data": {"corpus": [str(c) for c in (corpus if isinstance(corpus, list) else [corpus])],
                 "seq_len": 32, "validation_fraction": 0.1, "records_per_shard": 200},
        "tokenizer": {"kind": "bpe", "vocab_size": 600, "sample_mb": None},
        "model": {"family": "roberta", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"steps": 10, "batch_size": 8, "learning_rate": 1e-3},
    }
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(config.get(section), dict):
            config[section] = {**config[section], **values}
        else:
            config[section] = values
    return config


def write_config(path: Path, config: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def tiny_config(folder: Path, *, output_dir: str, cluster: dict, name: str = "t",
                corpus: str | None = None, **sections) -> Path:
    """A valid launcher config small enough for the real stages to finish in seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    if corpus is None:
        corpus_file = folder / "corpus.txt"
        corpus_file.write_text("".join(f"line {i} of a tiny corpus for tests\n"
                                       for i in range(200)))
        corpus = str(corpus_file)
    raw = {
        "name": name,
        "output_dir": output_dir,
        "cluster": cluster,
        "data": {"corpus": corpus, "seq_len": 32, "validation_fraction": 0.1,
                 "records_per_shard": 50},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"steps": 4, "batch_size": 4, "learning_rate": 1e-3, "checkpoint_every": 2,
                  "eval_every": 2, "eval_batches": 1},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def training_config(out: Path, family: str, **train) -> dict:
    """The training tests' run: a 2-layer model of `family` on the bundled corpus."""
    model = {"family": family, "hidden_size": 32, "num_layers": 2, "num_heads": 2,
             "intermediate_size": 64, "dropout": 0.0}
    return {
        "name": "test",
        "output_dir": str(out),
        "cluster": {"provider": "local", "workers": 1},
        "data": {"corpus": [str(BUNDLED)], "document_split": "blank_line", "seq_len": SEQ_LEN,
                 "validation_fraction": 0.05, "records_per_shard": 4000},
        "tokenizer": {"kind": "bpe", "vocab_size": VOCAB, "sample_mb": None},
        "model": model,
        "train": {"steps": 40, "batch_size": 16, "learning_rate": 3e-3, "warmup_steps": 4,
                  "checkpoint_every": 20, "eval_every": 20, "eval_batches": 4, **train},
    }


def training_run_config(out: Path, family: str, **train):
    """training_config, parsed: a validated RunConfig."""
    from payload.config import parse_config

    return parse_config(training_config(out, family, **train))


def write_training_config(out: Path, family: str, **train) -> Path:
    """The run's config file, beside output_dir (tpuctl refuses a folder holding other files)."""
    return write_config(out.parent / f"{out.name}.yaml", training_config(out, family, **train))


def line_corpus(root: Path, lines: int = 100) -> Path:
    """root/texts/a.txt: `lines` short numbered lines."""
    path = root / "texts" / "a.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"line {i} of a small corpus\n" for i in range(lines)))
    return path


def init_from_config(root: Path, weights: str, engine: str = "tensorflow") -> Path:
    """A run continuing from a roberta model folder (1 layer, hidden size 32) whose weights
    are `weights`: another family's, a wider model's, a deeper model's, or tf_model.h5 alone."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    folder = root / "pretrained"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "roberta", "vocab_size": 600, "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 40}))
    embeddings, layer = "roberta.embeddings.word_embeddings.weight", "roberta.encoder.layer."
    tensors = {
        "gpt2": {"transformer.wte.weight": (600, 32), "transformer.h.0.ln_1.weight": (32,)},
        "wide": {embeddings: (600, 64), f"{layer}0.output.dense.weight": (64, 64)},
        "deep": {embeddings: (600, 32), **{f"{layer}{i}.output.dense.weight": (32, 32)
                                           for i in range(3)}},
    }.get(weights)
    if tensors:
        save_file({k: np.zeros(v, np.float32) for k, v in tensors.items()},
                  str(folder / "model.safetensors"), metadata={"format": "pt"})
    else:
        (folder / "tf_model.h5").write_bytes(b"\x89HDF\r\n\x1a\n")
    raw = base_config(root / "out", line_corpus(root), train={"engine": engine})
    raw["model"] = {"family": "roberta", "init_from": str(folder)}
    del raw["tokenizer"]  # the folder's own
    return write_config(root / "run.yaml", raw)


def plan_config(**over) -> dict:
    """A gcp run on a v5litepod-16 with a GPT-2 of 4 layers: what the run-plan tests vary."""
    raw = {
        "name": "plan",
        "output_dir": "/tmp/unused-plan-out",
        "cluster": {"provider": "gcp", "project": "my-project", "zone": "us-central1-a",
                    "accelerator_type": "v5litepod-16", "provisioning": "spot"},
        "data": {"corpus": "gs://b/c.txt", "seq_len": 512},
        "tokenizer": {"kind": "bpe", "vocab_size": 32_000},
        "model": {"family": "gpt2", "hidden_size": 512, "num_layers": 4, "num_heads": 8,
                  "intermediate_size": 2048},
        "train": {"steps": 1_000_000, "batch_size": 64, "learning_rate": 1e-3, "bf16": True},
    }
    for key, value in over.items():
        merge = isinstance(value, dict) and key not in ("model", "cluster")
        raw[key] = {**raw[key], **value} if merge else value
    return raw
