"""`--overwrite` means one thing everywhere: every stage that runs is done again over its
earlier outputs, even ones made with the same settings, says in one line what goes, and removes
only what tpuctl wrote (issue 38, item 1). Train's fresh start is tested with the checkpoints
(tests/fast/test_checkpoint_preflight.py, tests/integration/test_train.py); here the stages
that load no framework, and the launcher handing the flag to each stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.plan import Stage
from tests.support.configs import base_config, write_config
from tests.support.launch_plans import plan
from tests.support.runners import payload_main


@pytest.fixture(scope="module")
def texts(tmp_path_factory, documents) -> Path:
    path = tmp_path_factory.mktemp("texts") / "a.txt"
    path.write_text("\n".join(" ".join(d.split()) for d in documents[:500]) + "\n")
    return path


def _inodes(folder: Path, pattern: str) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_ino for p in folder.glob(pattern)}


def test_overwrite_trains_the_same_tokenizer_again(tmp_path, texts):
    out = tmp_path / "run"
    path = write_config(tmp_path / "run.yaml", base_config(
        out, texts, tokenizer={"kind": "bpe", "vocab_size": 600}))
    payload_main("tokenizer", "--config", path, check=True)
    folder = out / "tokenizer"
    (folder / "notes.txt").write_text("mine\n")
    before = _inodes(folder, "*.json")
    kept = payload_main("tokenizer", "--config", path, check=True)
    assert "already trained with these settings" in kept.stdout
    assert _inodes(folder, "*.json") == before

    again = payload_main("tokenizer", "--config", path, "--overwrite", check=True)
    line = next(ln for ln in again.stdout.splitlines() if "--overwrite" in ln)
    assert line.endswith(f"--overwrite: training the tokenizer again, replacing in {folder}: "
                         "special_tokens_map.json, tokenizer.json, tokenizer_config.json, "
                         "training.json (files tpuctl did not write stay)"), line
    assert "already trained" not in again.stdout
    after = _inodes(folder, "*.json")
    assert after.keys() == before.keys() and all(after[n] != before[n] for n in before)
    assert (folder / "notes.txt").read_text() == "mine\n"  # not tpuctl's: it stays


def test_overwrite_prepares_the_same_share_again(tmp_path, texts):
    out = tmp_path / "run"
    path = write_config(tmp_path / "run.yaml", base_config(
        out, texts, tokenizer={"kind": "bpe", "vocab_size": 600},
        data={"records_per_shard": 40}))
    payload_main("tokenizer", "--config", path, check=True)
    for worker in (0, 1):
        payload_main("prepare", "--config", path, "--worker-index", worker, "--num-workers", 2,
                     check=True)
    data = out / "data"
    manifest = (data / "manifest.json").read_text()
    (data / "train" / "README.md").write_text("mine\n")
    mine_0 = sorted(data.glob("*/*-w00000of00002-*.tfrecord"))
    good = {p: p.read_bytes() for p in mine_0}
    for shard in mine_0:  # spoilt after the fact: only a prepare done again mends them
        shard.write_bytes(b"stale")
    theirs = _inodes(data, "*/*-w00001of00002-*")
    kept = payload_main("prepare", "--config", path, "--num-workers", 2, check=True)
    assert "already prepared its share" in kept.stdout
    assert all(p.read_bytes() == b"stale" for p in mine_0)

    again = payload_main("prepare", "--config", path, "--num-workers", 2, "--overwrite",
                         check=True)
    assert "already prepared" not in again.stdout
    line = next(ln for ln in again.stdout.splitlines() if "--overwrite" in ln)
    assert (f"--overwrite: removing what prepare wrote in {data} for worker 0 of 2: "
            f"manifest.json, {len(mine_0)} shards, {len(mine_0)} receipts, 1 part") in line, line
    assert sorted(data.glob("*/*-w00000of00002-*.tfrecord")) == mine_0
    assert {p: p.read_bytes() for p in mine_0} == good
    assert _inodes(data, "*/*-w00001of00002-*") == theirs  # another worker's share: its own
    assert (data / "train" / "README.md").read_text() == "mine\n"
    # The same settings make the same shards: the manifest the last worker writes is the same.
    assert json.loads((data / "manifest.json").read_text()) == json.loads(manifest)


def test_the_launcher_hands_overwrite_to_every_stage_that_runs():
    steps = plan(2, overwrite=True).steps
    names = {step.name for step in steps}
    assert {Stage.TOKENIZER.value, Stage.PREPARE.value, Stage.TRAIN.value} <= names
    for step in steps:
        if step.name in (Stage.TOKENIZER.value, Stage.PREPARE.value, Stage.TRAIN.value):
            assert all("--overwrite" in command.argv for command in step.commands), step
