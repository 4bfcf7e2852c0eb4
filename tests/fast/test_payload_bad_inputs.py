"""The payload's bad-input catalogue (issue 8): every input below ends with one line naming the
key or value, exit status 2, no traceback, and nothing created.

Each case builds its inputs under `case/` and runs either a stage (`python -m payload ...`,
checked by exit status and stderr) or the launcher's pre-flight (`check_before_start`, which
raises the one-line `UserError`); everything under the test's folder is compared before and
after.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from payload.config import load_config
from payload.core.errors import UserError
from payload.training.preflight import check_before_start
from tests.support.configs import base_config, init_from_config, line_corpus, write_config
from tests.support.crafted import CRAFTED, crafted_folder
from tests.support.paths import REPO
from tests.support.payload_inputs import config, tree
from tests.support.runners import assert_user_error, payload_main

ALL = ("tokenizer", "prepare", "train", "export")




def _yaml(root: Path, **sections) -> str:
    return yaml.safe_dump(base_config(root / "out", line_corpus(root), **sections), sort_keys=False)


def _model_config(root: Path, kind: str) -> Path:
    """A run whose model.config is a folder (holding a config.json) or a file that is not JSON."""
    if kind == "folder":
        target = root / "model-config"
        target.mkdir()
        (target / "config.json").write_text('{"model_type": "roberta"}')
    else:
        target = root / "config.txt"
        target.write_text("hidden_size = 64\n")
    raw = base_config(root / "out", line_corpus(root))
    raw["model"] = {"family": "roberta", "config": str(target)}
    return write_config(root / "run.yaml", raw)


def _short_model_config(root: Path) -> Path:
    """A run whose model.config has 16 positions for rows of 32 tokens."""
    target = root / "config.json"
    target.write_text('{"model_type": "gpt2", "n_positions": 16, "n_embd": 32, "n_layer": 1, '
                      '"n_head": 2}')
    raw = base_config(root / "out", line_corpus(root))
    raw["model"] = {"family": "gpt2", "config": str(target)}
    return write_config(root / "run.yaml", raw)


def _jsonl(root: Path) -> Path:
    path = root / "texts" / "docs.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f'{{"body": "document {i}"}}\n' for i in range(20)))
    return path


def _output_file(root: Path) -> Path:
    path = root / "out-file"
    path.write_text("not a folder\n")
    return path


def _users_folder(root: Path) -> Path:
    mine = root / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    return write_config(root / "run.yaml", base_config(mine, line_corpus(root)))


def _crafted(root: Path, change) -> Path:
    """A run continuing from a model folder crafted to break a reader (tests/support/crafted)."""
    raw = base_config(root / "out", line_corpus(root))
    raw["model"] = {"family": "roberta", "init_from": str(crafted_folder(root, change))}
    del raw["tokenizer"]  # the folder's own
    return write_config(root / "run.yaml", raw)


# (id, build the config path from the case folder, command, needles). The command is the
# stage's argv after `python -m payload`, or ("preflight", stages, resume, overwrite).
CASES = [
    ("config-is-a-folder", lambda r: r, ("tokenizer",), ["is a folder", "case"]),
    ("learning-rate-inf", lambda r: config(r, raw_text=_yaml(r).replace(
        "learning_rate: 0.001", "learning_rate: .inf")), ("train",),
     ["train.learning_rate", "finite", "inf"]),
    ("learning-rate-nan", lambda r: config(r, raw_text=_yaml(r).replace(
        "learning_rate: 0.001", "learning_rate: .nan")), ("train",),
     ["train.learning_rate", "finite", "nan"]),
    ("sample-mb-inf", lambda r: config(r, raw_text=_yaml(r).replace(
        "sample_mb: null", "sample_mb: .inf")), ("tokenizer",),
     ["tokenizer.sample_mb", "finite", "inf"]),
    ("dropout-nan", lambda r: config(r, model={"dropout": float("nan")}), ("train",),
     ["model.dropout", "finite"]),
    ("two-train-sections", lambda r: config(r, raw_text=_yaml(r) + "train:\n  steps: 5\n"),
     ("prepare",), ["duplicate key 'train'", "line", "first at line"]),
    ("duplicate-nested-key", lambda r: config(r, raw_text=_yaml(r).replace(
        "  seq_len: 32\n", "  seq_len: 32\n  seq_len: 64\n")), ("prepare",),
     ["duplicate key 'seq_len'", "line"]),
    ("mistyped-section", lambda r: config(r, raw_text=_yaml(r).replace("\ntrain:", "\ntrian:")),
     ("train",), ["unknown key 'trian'", "did you mean 'train'"]),
    ("mistyped-key", lambda r: config(r, raw_text=_yaml(r).replace("tokenizer:", "tokeniser:")),
     ("tokenizer",), ["unknown key 'tokeniser'", "did you mean 'tokenizer'"]),
    ("output-dir-s3", lambda r: config(r, out="s3://bucket/x"), ("prepare",),
     ["output_dir", "s3://", "s3://bucket/x"]),
    ("output-dir-root", lambda r: config(r, out="/"), ("tokenizer",),
     ["output_dir", "filesystem root", "'/'"]),
    ("output-dir-home", lambda r: config(r, out="~"), ("tokenizer",),
     ["output_dir", "home folder"]),
    ("output-dir-project", lambda r: config(r, out=str(REPO)), ("tokenizer",),
     ["output_dir", "project's root", str(REPO)]),
    ("output-dir-bucket", lambda r: config(r, out="gs://bucket"), ("tokenizer",),
     ["output_dir", "whole bucket", "gs://bucket"]),
    ("corpus-s3", lambda r: config(r, data={"corpus": ["s3://bucket/a.txt"]}), ("prepare",),
     ["data.corpus", "s3://bucket/a.txt"]),
    ("model-config-folder", lambda r: _model_config(r, "folder"),
     ("preflight", ALL, False, False), ["model.config", "model-config", "is a folder"]),
    ("model-config-not-json", lambda r: _model_config(r, "text"),
     ("preflight", ALL, False, False), ["model.config", "config.txt", "not JSON"]),
    # Issue 16, point 12: accepted, to fail at train (or to train to NaN).
    ("learning-rate-1e308", lambda r: config(r, train={"learning_rate": 1e308}), ("train",),
     ["train.learning_rate must be at most 1.0"]),
    ("steps-1e30", lambda r: config(r, train={"steps": 1e30}), ("prepare",),
     ["train.steps", "at most 1,000,000,000"]),
    ("corpus-gs-one-slash", lambda r: config(r, data={"corpus": ["gs:/bucket/a.txt"]}),
     ("prepare",), ["data.corpus", "'gs:/bucket/a.txt' is not a gs:// URL"]),
    ("model-config-too-few-positions", _short_model_config, ("preflight", ALL, False, False),
     ["model.config", "16 positions", "data.seq_len 32"]),
    ("jsonl-without-text-field", lambda r: write_config(r / "run.yaml", base_config(
        r / "out", _jsonl(r))), ("preflight", ALL, False, False),
     ["docs.jsonl", "no 'text' field", "data.text_column"]),
    ("output-dir-is-a-file", lambda r: write_config(r / "run.yaml", base_config(
        _output_file(r), line_corpus(r))), ("preflight", ALL, False, False),
     ["output_dir", "out-file", "is a file"]),
    ("output-dir-is-a-file-stage", lambda r: write_config(r / "run.yaml", base_config(
        _output_file(r), line_corpus(r))), ("prepare",), ["output_dir", "out-file", "is a file"]),
    ("output-dir-users-folder", _users_folder, ("preflight", ALL, False, False),
     ["output_dir", "mine", "notes.txt", "did not write"]),
    ("output-dir-users-folder-stage", _users_folder, ("tokenizer", "--overwrite"),
     ["output_dir", "mine", "notes.txt", "did not write"]),
    ("corpus-inside-output-dir", lambda r: write_config(r / "run.yaml", base_config(
        r / "texts", line_corpus(r))), ("prepare",), ["output_dir", "texts", "a.txt"]),
    ("usage-unknown-stage", lambda r: config(r), ("prep",), ["invalid choice: 'prep'"]),
    ("usage-no-config", lambda r: config(r), ("prepare", "--no-config"),
     ["--no-config"]),
    ("usage-worker-index-abc", lambda r: config(r), ("prepare", "--worker-index", "abc"),
     ["--worker-index", "'abc'"]),
    ("resume-and-overwrite", lambda r: config(r), ("train", "--resume", "--overwrite"),
     ["--resume", "--overwrite", "contradict"]),
    ("resume-and-overwrite-preflight", lambda r: config(r), ("preflight", ALL, True, True),
     ["--resume", "--overwrite", "contradict"]),
    # model.init_from weights that do not fit: read from the safetensors header alone.
    ("init-from-other-family", lambda r: init_from_config(r, "gpt2"), ("preflight", ALL, False, False),
     ["model.init_from", "holds no roberta weights", "transformer.h.0.ln_1.weight"]),
    ("init-from-other-width", lambda r: init_from_config(r, "wide"), ("preflight", ALL, False, False),
     ["word_embeddings.weight is [600, 64]", "[vocab_size, hidden_size] = [600, 32]"]),
    ("init-from-other-depth", lambda r: init_from_config(r, "deep"), ("preflight", ALL, False, False),
     ["has 3 layers (encoder.layer.N)", "num_hidden_layers 1"]),
    ("init-from-h5-for-jax", lambda r: init_from_config(r, "h5", engine="jax"),
     ("preflight", ALL, False, False), ["has only tf_model.h5", "jax engine does not read"]),
    # Issue 32: a model folder crafted to break a reader, refused before anything starts
    # (every case), and by the tokenizer stage itself where it reads the crafted file.
    *[(f"init-from-{name}", lambda r, c=change: _crafted(r, c), ("preflight", ALL, False, False),
       needles) for name, change, needles in CRAFTED],
    *[(f"init-from-{name}-stage", lambda r, c=change: _crafted(r, c), ("tokenizer",),
       needles) for name, change, needles in CRAFTED
      if name.startswith("tokenizer-")],
]


def _run_stage(argv: tuple[str, ...], config: Path, cwd: Path):
    """The stage as `python -m payload` runs it, in this process: every refusal here comes
    before a framework loads."""
    args = [*argv] if argv[0] not in ALL else [argv[0], "--config", str(config), *argv[1:]]
    return payload_main(*args, cwd=cwd)




@pytest.mark.parametrize(("build", "command", "needles"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path, build, command, needles):
    case = tmp_path / "case"
    case.mkdir()
    config = build(case)
    before = tree(tmp_path)
    if command[0] == "preflight":
        _, stages, resume, overwrite = command
        with pytest.raises(UserError) as info:
            check_before_start(load_config(config), stages=set(stages), resume=resume,
                               overwrite=overwrite)
        line = str(info.value)
        assert "\n" not in line
    else:
        line = assert_user_error(_run_stage(command, config, cwd=tmp_path))
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert tree(tmp_path) == before, "something was created or changed"
    print(f"{command[0]}: {line}")


def test_preflight_reports_every_problem_at_once(tmp_path):
    """Issue 18: a missing corpus file and a model.config with too few positions are refused
    together, one line each, not in two rounds."""
    config = _short_model_config(tmp_path)
    raw = yaml.safe_load(config.read_text())
    raw["data"]["corpus"] = [str(tmp_path / "nothere.txt")]
    write_config(config, raw)
    before = tree(tmp_path)
    with pytest.raises(UserError) as info:
        check_before_start(load_config(config), stages=set(ALL), resume=False, overwrite=False)
    lines = str(info.value).splitlines()
    assert len(lines) == 2, lines
    assert "data.corpus: no such file" in lines[0] and "nothere.txt" in lines[0]
    assert "model.config" in lines[1] and "16 positions" in lines[1]
    assert tree(tmp_path) == before


