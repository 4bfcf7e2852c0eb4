"""Every setting a run will not use is named in one line, and the run goes on: the tokenizer
keys beside model.init_from or tokenizer.path, train.bf16 on CPU workers, and the engine an
export alone is asked for when the checkpoints are another engine's."""

from __future__ import annotations

import json

import pytest
import yaml

from payload.config import ignored_settings, load_config
from payload.core import folders, ownership
from tests.support.configs import init_from_config
from tests.support.runners import tpuctl


def dry_run(tmp_path, path, *extra):
    return tpuctl("train", "-c", path, "--local", "--dry-run", *extra, cwd=tmp_path,
                  env={"TPUCTL_HOME": str(tmp_path / "home")})


def init_from_folder(tmp_path):
    """A run continuing from a roberta folder (config.json, tf_model.h5, tokenizer.json)."""
    from payload.core.families import FAMILIES
    from payload.data.tokenizer import train_tokenizer

    path = init_from_config(tmp_path, "h5")
    texts = [f"words {i} of a small corpus to learn pieces from" for i in range(200)]
    tok = train_tokenizer("bpe", texts, vocab_size=400, family=FAMILIES["roberta"])
    tok.save(str(tmp_path / "pretrained" / "tokenizer.json"))
    return path


def warnings_of(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning: ")]


def test_tokenizer_keys_beside_init_from_are_named_as_ignored(tmp_path):
    path = init_from_folder(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["tokenizer"] = {"kind": "sentencepiece", "vocab_size": 4000}
    path.write_text(yaml.safe_dump(raw))
    result = dry_run(tmp_path, path)
    assert result.returncode == 0, result.stderr
    [line] = [w for w in warnings_of(result) if "tokenizer." in w]
    assert line == (f"warning: tokenizer.kind and tokenizer.vocab_size are ignored: "
                    f"model.init_from {tmp_path / 'pretrained'} brings its own tokenizer, "
                    "vocabulary and all; remove them from the config")
    # What the file does not say is not named: the defaults are nobody's choice.
    del raw["tokenizer"]
    path.write_text(yaml.safe_dump(raw))
    assert ignored_settings(load_config(path)) == []
    assert not [w for w in warnings_of(dry_run(tmp_path, path)) if "tokenizer." in w]


def test_what_the_file_says_survives_the_limits_given_on_the_command_line(tmp_path):
    path = init_from_folder(tmp_path)
    raw = yaml.safe_load(path.read_text())
    raw["tokenizer"] = {"vocab_size": 4000}
    path.write_text(yaml.safe_dump(raw))
    result = dry_run(tmp_path, path, "--max-hours", "2")  # the config is checked again
    assert [w for w in warnings_of(result) if w.startswith("warning: tokenizer.vocab_size is "
                                                           "ignored: model.init_from")]


@pytest.mark.parametrize(("engine", "words"), [
    ("jax", "train.bf16 is ignored on CPU: the JAX engine computes in float32 there"),
    ("tensorflow", "train.bf16 on CPU: TensorFlow runs bfloat16 products there, no faster"),
])
def test_bf16_on_cpu_workers_is_a_note_of_the_plan(tmp_path, engine, words):
    (tmp_path / "c.txt").write_text("".join(f"some text {i}\n" for i in range(20)))
    raw = {"name": "bf", "output_dir": str(tmp_path / "out"),
           "cluster": {"provider": "local", "workers": 2},
           "data": {"corpus": str(tmp_path / "c.txt"), "seq_len": 64},
           "tokenizer": {"kind": "bpe", "vocab_size": 1000},
           "model": {"family": "gpt2", "size": "tiny"},
           "train": {"engine": engine, "steps": 10, "batch_size": 8, "learning_rate": 1e-3,
                     "bf16": True}}
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = dry_run(tmp_path, path)
    assert result.returncode == 0, result.stderr
    assert any(line.startswith(f"  note: {words}") for line in result.stdout.splitlines())
    raw["train"]["bf16"] = False
    path.write_text(yaml.safe_dump(raw))
    assert "train.bf16" not in dry_run(tmp_path, path).stdout


def test_an_export_of_another_engines_checkpoints_says_the_engine_asked_for_is_not_used(
        tmp_path):
    (tmp_path / "c.txt").write_text("".join(f"some text {i}\n" for i in range(20)))
    out = tmp_path / "out"
    raw = {"name": "ex", "output_dir": str(out), "cluster": {"provider": "local", "workers": 1},
           "data": {"corpus": str(tmp_path / "c.txt"), "seq_len": 64},
           "tokenizer": {"kind": "bpe", "vocab_size": 1000},
           "model": {"family": "gpt2", "size": "tiny"},
           "train": {"steps": 10, "batch_size": 8, "learning_rate": 1e-3}}
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    # What a TensorFlow run leaves: its checkpoint index, run.json naming the engine.
    ownership.claim_output_dir(str(out))
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "checkpoint").write_text('model_checkpoint_path: "ckpt-10"\n')
    (out / "checkpoints" / "run.json").write_text(json.dumps({"engine": "tensorflow"}))
    for name in ("ckpt-10.index", "ckpt-10.data-00000-of-00001"):
        (out / "checkpoints" / name).write_bytes(b"")
    folders.mark_complete(str(out / "checkpoints"), {})
    (out / "tokenizer").mkdir()
    (out / "tokenizer" / "tokenizer.json").write_text("{}")
    result = tpuctl("train", "-c", path, "--local", "--dry-run", "--stages", "export",
                    "--engine", "jax", cwd=tmp_path, env={"TPUCTL_HOME": str(tmp_path / "h")})
    assert result.returncode == 0, result.stderr
    assert warnings_of(result) == [
        "warning: --engine jax does not apply to this export: the checkpoints were written by "
        "the tensorflow engine (checkpoints/run.json), and the export reads them with it"]
    # The same engine, or a run that trains first: nothing to say.
    for extra in (("--stages", "export", "--engine", "tensorflow"), ("--engine", "jax")):
        again = tpuctl("train", "-c", path, "--local", "--dry-run", *extra, cwd=tmp_path,
                       env={"TPUCTL_HOME": str(tmp_path / "h")})
        assert not [w for w in warnings_of(again) if "does not apply" in w], again.stderr


def test_model_dropout_of_a_family_without_it_is_named_as_ignored(tmp_path):
    """Llama has dropout only on the attention weights: a model.dropout the file sets above 0
    does nothing there, and is said so; the default, 0, and other families say nothing."""
    (tmp_path / "c.txt").write_text("some text\n")
    path = tmp_path / "tpuctl.yaml"

    def ignored(family, **model):
        raw = {"name": "dr", "output_dir": str(tmp_path / "out"),
               "data": {"corpus": str(tmp_path / "c.txt")},
               "tokenizer": {"kind": "bpe", "vocab_size": 1000},
               "model": {"family": family, "size": "tiny", **model},
               "train": {"engine": "jax", "steps": 10, "batch_size": 8, "learning_rate": 1e-3}}
        path.write_text(yaml.safe_dump(raw))
        return ignored_settings(load_config(path))

    assert ignored("llama", dropout=0.2) == [
        "model.dropout is ignored: Llama has dropout only on the attention weights "
        "(model.attention_dropout); remove it from the config"]
    assert ignored("llama") == ignored("llama", dropout=0.0) == []
    assert ignored("llama", attention_dropout=0.1) == ignored("gpt2", dropout=0.2) == []
