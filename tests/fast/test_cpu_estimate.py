"""The time a run on this machine's CPU will take, stage by stage, from the measured figures in
launcher/cpu_times.json (a table given here, so that recalibrating changes no test): the
training's start-up, steps and evaluations at the calibrated speed, the tokenizer by its kind
and the corpus's size, prepare, export; stages whose output is there count nothing."""

from __future__ import annotations

import gzip
import os

import pytest
import yaml

from launcher import estimate
from payload.config import load_config
from payload.core import ownership
from payload.training import runplan
from payload.training.strategy import CPU
from tests.support.runners import tpuctl

TABLE = {
    "measured": "2026-01-02", "machine": {"cores": os.cpu_count() or 1},
    "tokenizer": {"start_s": 1.0, "s_per_mb": {"bpe": 2.0, "sentencepiece": 5.0}},
    "prepare": {"start_s": 1.0, "s_per_mb_per_worker": 1.5},
    "train": {"jax": {"gpt2": {"start_s": 20.0, "model_flops_per_s": 1e10},
                      "bert": {"start_s": 25.0, "model_flops_per_s": 2e10}}},
    "export_s": {"jax": {"gpt2": 8.0, "bert": 9.0}},
}


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(estimate, "calibration", lambda: TABLE)
    return TABLE


def write_run(tmp_path, *, family="gpt2", kind="bpe", corpus_bytes=2_000_000, gz=False):
    text = ("word " * 19 + "last\n") * (corpus_bytes // 100)  # 100 bytes a line
    corpus = tmp_path / ("c.txt.gz" if gz else "c.txt")
    corpus.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    raw = {"name": "est", "output_dir": str(tmp_path / "out"),
           "cluster": {"provider": "local", "workers": 2},
           "data": {"corpus": str(corpus), "seq_len": 128},
           "tokenizer": {"kind": kind, "vocab_size": 4000},
           "model": {"family": family, "hidden_size": 128, "num_layers": 2, "num_heads": 2,
                     "intermediate_size": 512},
           "train": {"engine": "jax", "steps": 300, "batch_size": 32, "learning_rate": 1e-3,
                     "eval_every": 100}}
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def time_lines(tmp_path, path, *extra) -> list[str]:
    result = tpuctl("train", "-c", path, "--local", "--dry-run", *extra, cwd=tmp_path,
                    env={"TPUCTL_HOME": str(tmp_path / "home")})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  time:"))
    return lines[at:]


def test_every_stage_is_timed_from_the_table(tmp_path, table):
    path = write_run(tmp_path)
    config = load_config(path)
    plan = runplan.run_plan(config, hardware=CPU, num_workers=2)
    # 300 steps, and 4 evaluations (0, 100, 200, 300) of 20 batches at a third of a step.
    assert plan.evaluations == 4
    train = 20.0 + (plan.total_flops + 4 * 20 * plan.flops_per_step / 3) / 1e10
    mb = 2_000_000 / 1e6
    tokenizer = 1.0 + 2.0 * mb
    prepare = 1.0 + 1.5 * mb / min(2, os.cpu_count() or 1)
    lines = time_lines(tmp_path, path)
    # Each part at the unit of the whole; the whole is the sum of the parts as said.
    grain = runplan._grain(train + tokenizer + prepare + 8.0)
    parts = [runplan._on_grain(s, grain) for s in (20.0, train - 20.0, tokenizer, prepare, 8.0)]
    said = [runplan._duration(s, grain) for s in (sum(parts), sum(parts[:2]), tokenizer, prepare)]
    assert lines[0] == f"  time: about {said[0]} on CPU for the stages that run"
    assert lines[1].startswith(f"    train: {said[1]}: {runplan._duration(20.0, grain)} to start")
    assert "gpt2 training on the jax engine reached when calibrated" in lines[1]
    assert lines[2] == (f"    tokenizer: {said[2]} (bpe at 2.0 s/MB measured "
                        f"on a {TABLE['machine']['cores']}-core machine, 2026-01-02)")
    assert lines[3].startswith(f"    prepare: {said[3]} (2.0 MB of text")
    assert lines[4].startswith("    export: 8s (")
    # Only the stages asked for (prepare's input, the tokenizer, made by an earlier run).
    out = tmp_path / "out"
    ownership.claim_output_dir(str(out))
    (out / "tokenizer").mkdir(parents=True)
    (out / "tokenizer" / "tokenizer.json").write_text("{}")
    assert [line.split(":")[0].strip() for line in time_lines(
        tmp_path, path, "--stages", "prepare,train,export")[1:4]] == ["train", "prepare",
                                                                     "export"]


def test_what_is_there_already_counts_nothing(tmp_path, table):
    path = write_run(tmp_path, kind="sentencepiece")
    out = tmp_path / "out"
    ownership.claim_output_dir(str(out))  # an earlier run's output_dir
    (out / "tokenizer").mkdir(parents=True)
    (out / "tokenizer" / "tokenizer.json").write_text("{}")
    lines = time_lines(tmp_path, path)
    assert "    tokenizer: 0s (trained already)" in lines


def test_a_gzip_corpus_counts_the_text_it_holds(tmp_path, table):
    path = write_run(tmp_path, gz=True)
    assert os.path.getsize(tmp_path / "c.txt.gz") < 100_000
    assert estimate.corpus_megabytes(load_config(path), read_remote=False) == pytest.approx(2.0)


def test_a_family_or_engine_without_figures_is_said_not_estimated(tmp_path, table):
    # RoBERTa computes as BERT does: BERT's figures.
    lines = time_lines(tmp_path, write_run(tmp_path, family="roberta"))
    assert "roberta training on the jax engine" in lines[1] and "25s to start" in lines[1]
    lines = time_lines(tmp_path, write_run(tmp_path, family="t5", kind="sentencepiece"))
    assert lines[0].startswith("  time: not estimated (no calibrated figure for t5 on the jax "
                               "engine (launcher/cpu_times.json))")


def test_the_shipped_table_covers_every_engine_and_family():
    table = estimate.calibration()
    assert table is not None
    for engine in ("tensorflow", "jax"):
        for family in ("gpt2", "bert", "t5"):
            figures = table["train"][engine][family]
            assert figures["model_flops_per_s"] > 0 and figures["start_s"] >= 0
            assert table["export_s"][engine][family] > 0
    assert set(table["tokenizer"]["s_per_mb"]) == {"bpe", "wordpiece", "sentencepiece",
                                                   "unigram"}
