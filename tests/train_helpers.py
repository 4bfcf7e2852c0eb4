"""Tiny runs for the training tests: a small tokenizer, shards and a manifest made the way the
tokenizer and prepare stages lay them out, from the bundled corpus.

    out = make_run_dir(tmp_path, "roberta")        # output_dir with tokenizer/ and data/
    config = run_config(out, "roberta", steps=40)  # a validated RunConfig
"""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from payload import records
from payload.config import parse_config
from payload.families import FAMILIES, t5_expanded_length

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "payload" / "data" / "corpus.txt.gz"
SEQ_LEN = 32
VOCAB = 600


def corpus_lines(limit: int = 4000) -> list[str]:
    with gzip.open(CORPUS, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:limit]


def save_tokenizer(folder: Path, family: str, lines: list[str], vocab_size: int = VOCAB) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    tokenizer = Tokenizer(models.BPE(unk_token=spec.unk))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size + len(spec.special_tokens),
        special_tokens=spec.special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    named = {
        key: getattr(spec, key)
        for key in ("unk", "pad", "mask", "cls", "sep", "bos", "eos")
        if getattr(spec, key)
    }
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **{f"{k}_token": v for k, v in named.items()},
        additional_special_tokens=list(spec.extra) or None,
    )
    fast.save_pretrained(str(folder))


def write_shards(out: Path, family: str, *, train_shards: int = 2) -> None:
    from transformers import PreTrainedTokenizerFast

    spec = FAMILIES[family]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(out / "tokenizer"))
    record_len = t5_expanded_length(SEQ_LEN, 0.15, 3.0) if family == "t5" else SEQ_LEN
    separator = tokenizer.convert_tokens_to_ids(spec.separator)
    stream: list[int] = []
    lines = corpus_lines()
    for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]:
        stream.extend([*ids, separator])
    start = [tokenizer.convert_tokens_to_ids(spec.row_start)] if spec.row_start else []
    body = record_len - len(start)
    rows = np.array(
        [start + stream[i : i + body] for i in range(0, len(stream) - body + 1, body)],
        dtype=np.int64,
    )
    num_validation = max(len(rows) // 20, 16)
    splits = {
        "validation": [rows[:num_validation]],
        "train": np.array_split(rows[num_validation:], train_shards),
    }
    dtype = records.dtype_for_vocab(len(tokenizer))
    summaries = {}
    for split, parts in splits.items():
        summary = records.SplitSummary()
        for index, part in enumerate(parts):
            name = records.shard_name(split, 0, 1, index)
            path = out / "data" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                writer = records.ShardWriter(f, dtype=dtype)
                writer.write_rows(part)
                stats = writer.finish()
            summary.shards.append(
                records.ShardEntry(
                    name=name,
                    records=stats.records,
                    tokens=stats.tokens,
                    bytes=stats.bytes,
                    sha256=stats.sha256,
                )
            )
            summary.records += stats.records
            summary.tokens += stats.tokens
        summaries[split] = summary
    fingerprint = hashlib.sha256((out / "tokenizer" / "tokenizer.json").read_bytes()).hexdigest()
    manifest = records.Manifest(
        format=records.FORMAT,
        seq_len=SEQ_LEN,
        record_len=record_len,
        dtype=dtype,
        family=family,
        vocab_size=len(tokenizer),
        tokenizer_fingerprint=fingerprint,
        data_fingerprint="test",
        num_workers=1,
        documents=len(lines),
        invalid_utf8_lines=0,
        splits=summaries,
    )
    (out / "data" / records.MANIFEST).write_text(manifest.to_json())


def make_run_dir(root: Path, family: str, *, train_shards: int = 2) -> Path:
    out = root / f"run-{family}"
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(out / "tokenizer", family, corpus_lines(1500))
    write_shards(out, family, train_shards=train_shards)
    return out


def config_dict(out: Path, family: str, **train) -> dict:
    model = {
        "family": family,
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 2,
        "intermediate_size": 64,
        "dropout": 0.0,
    }
    return {
        "name": "test",
        "output_dir": str(out),
        "data": {"corpus": [str(CORPUS)], "seq_len": SEQ_LEN},
        "tokenizer": {"kind": "bpe", "vocab_size": VOCAB},
        "model": model,
        "train": {
            "steps": 40,
            "batch_size": 16,
            "learning_rate": 3e-3,
            "warmup_steps": 4,
            "checkpoint_every": 20,
            "eval_every": 20,
            "eval_batches": 4,
            **train,
        },
    }


def run_config(out: Path, family: str, **train):
    return parse_config(config_dict(out, family, **train))


def write_config(out: Path, family: str, **train) -> Path:
    path = out / "run.yaml"
    path.write_text(yaml.safe_dump(config_dict(out, family, **train)))
    return path


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        **extra,
    }
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def stage_command(stage: str, config: Path, *args: str) -> list[str]:
    """The payload's command line for a stage, as the launcher runs it."""
    if (REPO / "payload" / "__main__.py").exists():
        entry = ["-m", "payload"]
    else:
        entry = [str(REPO / "tests" / "stage_runner.py")]
    return [sys.executable, *entry, stage, "--config", str(config), *args]


def run_stage(stage: str, config: Path, *args: str, env=None, timeout: float = 300):
    return subprocess.run(
        stage_command(stage, config, *args),
        env=env or subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
