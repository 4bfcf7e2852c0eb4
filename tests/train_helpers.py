"""Tiny runs for the training tests: the real tokenizer and prepare stages on the bundled
corpus, once per family per session, copied for each test.

    out = make_run_dir(tmp_path, "roberta")        # output_dir with tokenizer/ and data/
    config = run_config(out, "roberta", steps=40)  # a validated RunConfig
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from payload.config import parse_config
from tests.conftest import payload_env, run_payload

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "payload" / "data" / "corpus.txt.gz"
SEQ_LEN = 32
VOCAB = 600
_CACHE = Path(tempfile.mkdtemp(prefix="tpuctl-train-tests-"))
atexit.register(shutil.rmtree, _CACHE, True)


def make_run_dir(root: Path, family: str) -> Path:
    """A fresh output_dir holding a tokenizer and prepared shards for `family`."""
    cached = _CACHE / family
    if not (cached / "data" / "manifest.json").exists():
        config = write_config(cached, family)
        for stage in ("tokenizer", "prepare"):
            result = run_stage(stage, config)
            if result.returncode != 0:
                raise AssertionError(f"{stage} failed:\n{result.stderr[-3000:]}")
    out = root / f"run-{family}"
    shutil.copytree(cached, out)
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
        "cluster": {"provider": "local", "workers": 1},
        "data": {
            "corpus": [str(CORPUS)],
            "document_split": "blank_line",
            "seq_len": SEQ_LEN,
            "validation_fraction": 0.05,
            "records_per_shard": 4000,
        },
        "tokenizer": {"kind": "bpe", "vocab_size": VOCAB, "sample_mb": None},
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
    """The run's config file, beside output_dir (tpuctl refuses a folder holding other files)."""
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(config_dict(out, family, **train)))
    return path


def stage_command(stage: str, config: Path, *args: str) -> list[str]:
    """The payload's command line for a stage, as the launcher runs it."""
    return [sys.executable, "-m", "payload", stage, "--config", str(config), *args]


def run_stage(stage: str, config: Path, *args: str, env=None, timeout: float = 300):
    return run_payload(stage, "--config", str(config), *args, check=False,
                       env=env or payload_env(), timeout=timeout)
