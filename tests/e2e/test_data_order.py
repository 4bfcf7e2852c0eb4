"""Issue 34's acceptance through the launcher, shortened: the global batch of a step is the same
whatever the worker count and however the run was resumed. metrics.json's `data_digests` agree
between an uninterrupted 2-worker run, a 2-worker run of half the steps resumed on 1 worker
(prepare, run again on 1 worker, serves the data the 2 workers made), and a 3-worker run. (The
issue's 60 steps resumed at 30 passed the same way; 8 and 4 prove it for a fraction of the time.)
Each engine (the TensorFlow engine's digests of one worker against the reader's:
tests/integration/test_train.py)."""

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("optax")

from tests.support.configs import tiny_config
from tests.support.runners import tpuctl

BATCH = 24  # divides over 1, 2 and 3 workers
STEPS, HALF = 8, 4


def corpus(folder: Path) -> Path:
    """One file for every run: prepare's fingerprint names the corpus files."""
    path = folder.parent / "corpus.txt"
    if path.exists():
        return path
    path.write_text("".join(f"line {i} about {['rivers', 'stones', 'light'][i % 3]} and "
                            f"{i % 17} birds\n" for i in range(600)))
    return path


def config(folder: Path, out: Path, *, workers: int, steps: int, engine: str = "jax") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return tiny_config(folder, name="order", corpus=str(corpus(folder)), output_dir=str(out),
                       cluster={"provider": "local", "workers": workers},
                       train={"engine": engine, "steps": steps, "batch_size": BATCH,
                              "learning_rate": 1e-3, "checkpoint_every": HALF,
                              "eval_every": HALF, "eval_batches": 1})


def train(path: Path, workers: int, *flags: str):
    result = tpuctl("train", "-c", path, "--local", "--workers", workers, *flags)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return result


def digests(out: Path) -> dict[str, str]:
    return json.loads((out / "metrics.json").read_text())["data_digests"]


def prepared_copy(source: Path, out: Path) -> Path:
    shutil.copytree(source, out, ignore=shutil.ignore_patterns(
        "checkpoints", "metrics.json", "logs", "model"))
    return out


@pytest.mark.slow  # three short runs over 1-3 worker processes and a resume: ~3-5 min here
@pytest.mark.parametrize("engine", ["jax", "tensorflow"])
def test_every_layout_and_resume_trains_the_same_global_batches(tmp_path, tpuctl_home, engine):
    whole = tmp_path / "whole"
    train(config(tmp_path / "a", whole, workers=2, steps=STEPS, engine=engine), 2,
          "--stages", "tokenizer,prepare,train")
    reference = digests(whole)
    assert sorted(map(int, reference)) == list(range(1, STEPS + 1))
    assert len(set(reference.values())) == STEPS
    examples = json.loads((whole / "metrics.json").read_text())["examples_per_source"]
    assert list(examples.values()) == [STEPS * BATCH]

    resumed = prepared_copy(whole, tmp_path / "resumed")
    train(config(tmp_path / "b", resumed, workers=2, steps=HALF, engine=engine), 2,
          "--stages", "train")
    result = train(config(tmp_path / "b", resumed, workers=1, steps=STEPS, engine=engine), 1,
                   "--stages", "prepare,train", "--resume")
    assert "serves any worker count" in result.stdout + result.stderr
    assert digests(resumed) == reference

    three = prepared_copy(whole, tmp_path / "three")
    train(config(tmp_path / "c", three, workers=3, steps=STEPS, engine=engine), 3,
          "--stages", "train")
    assert digests(three) == reference
