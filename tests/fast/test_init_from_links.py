"""What tpuctl takes from a model folder it did not make (issue 27, item 4; issue 32, item 2):
`model.init_from` (and `tokenizer.path`) give only the known tokenizer and model files, each
the folder's own plain file; a symbolic link among them (out of the folder or not) or a hard
link is refused in one line before anything is written, and a tokenizer_config.json key that
points elsewhere is dropped, so nothing from outside the folder reaches output_dir/tokenizer,
model/ or the Hub, and what is loaded is what was fingerprinted. In-process: the stage through
`payload.__main__.main`, the launcher's pre-flight, the readers themselves."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from payload.config import parse_config
from payload.core.errors import UserError
from payload.core.stages import Stage
from payload.training.preflight import check_before_start
from tests.support.configs import base_config

SECRET = "the user's private notes: nothing of this may leave the machine\n"


def model_folder(root: Path) -> Path:
    """A roberta model folder (1 layer, hidden size 32, 600 ids) with a trained tokenizer: what
    a Hub checkpoint or an earlier export holds."""
    from safetensors.numpy import save_file

    from payload.core.families import FAMILIES
    from payload.data.tokenizer import train_tokenizer

    folder = root / "pretrained"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "roberta", "vocab_size": 600, "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 40}))
    layer = "roberta.encoder.layer.0.output.dense.weight"
    save_file({"roberta.embeddings.word_embeddings.weight": np.zeros((600, 32), np.float32),
               layer: np.zeros((32, 32), np.float32)},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    texts = [f"document {i} about the weather and the sea" for i in range(200)]
    tok = train_tokenizer("bpe", texts, vocab_size=300, family=FAMILIES["roberta"])
    (folder / "tokenizer.json").write_text(tok.to_str())
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32}))
    return folder


def run_config(root: Path, folder: Path) -> Path:
    corpus = root / "texts" / "a.txt"
    corpus.parent.mkdir()
    corpus.write_text("".join(f"line {i} of a small corpus\n" for i in range(100)))
    raw = base_config(root / "out", corpus)
    raw["model"] = {"family": "roberta", "init_from": str(folder)}
    del raw["tokenizer"]  # the folder's own
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def stage(tmp_path, monkeypatch, capsys):
    """Run a stage in this process as `python -m payload STAGE --config C` would; returns (exit
    status, the `error:` lines on stderr). The stage's private temporary folder and state stay
    under tmp_path."""
    monkeypatch.setenv("TPUCTL_HOME", str(tmp_path / "home"))
    # What a stage sets for itself (KERAS_HOME) is set here first, so it goes with the test.
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "home" / "keras"))
    monkeypatch.setenv("TMPDIR", tempfile.gettempdir())
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.delenv("TPUCTL_DEBUG", raising=False)

    def run(*argv: str) -> tuple[int, list[str]]:
        from payload.__main__ import main

        capsys.readouterr()
        status = main(list(argv))
        err = capsys.readouterr().err
        assert "Traceback" not in err, err
        return status, [line for line in err.splitlines() if line.startswith("error:")]

    return run


def files_under(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text(errors="replace")
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_only_the_known_tokenizer_files_are_taken_from_the_folder(tmp_path, stage):
    folder = model_folder(tmp_path)
    secret = tmp_path / "home-secret.txt"
    secret.write_text(SECRET)
    (folder / "vocab_notes.txt").symlink_to(secret)  # a tokenizer-looking name, a link out
    (folder / "notes.txt").write_text(SECRET)  # a plain file of the folder, not the tokenizer's
    (folder / "vocab.json").write_text(json.dumps({"<s>": 0}))  # a known file: taken
    config = run_config(tmp_path, folder)
    status, errors = stage("tokenizer", "--config", str(config))
    assert (status, errors) == (0, [])
    out = tmp_path / "out"
    assert sorted(p.name for p in (out / "tokenizer").iterdir() if not p.name.startswith(".")
                  ) == ["tokenizer.json", "tokenizer_config.json", "vocab.json"]
    leaked = [name for name, text in files_under(out).items() if "private notes" in text]
    assert not leaked, leaked
    # The export's copy into model/ is the same read, over the same names.
    from payload.data.tokenizer import read_tokenizer_files, write_tokenizer_files

    model = tmp_path / "model-copy"
    model.mkdir()
    write_tokenizer_files(read_tokenizer_files(parse_config(yaml.safe_load(config.read_text()))),
                          str(model))
    assert sorted(p.name for p in model.iterdir()) == [
        "tokenizer.json", "tokenizer_config.json", "vocab.json"]


@pytest.mark.parametrize("name", ["vocab.txt", "tokenizer_config.json", "tokenizer.json"])
def test_a_tokenizer_file_linked_out_of_the_folder_is_one_line_and_nothing_written(
        tmp_path, stage, name):
    folder = model_folder(tmp_path)
    secret = tmp_path / "elsewhere" / name
    secret.parent.mkdir()
    if name == "vocab.txt":
        secret.write_text(SECRET)
    else:  # the real file moved out of the folder, a link left in its place
        os.replace(folder / name, secret)
    (folder / name).unlink(missing_ok=True)
    (folder / name).symlink_to(secret)
    config = run_config(tmp_path, folder)
    status, errors = stage("tokenizer", "--config", str(config))
    assert status == 2 and len(errors) == 1, errors
    for needle in ("model.init_from", f"{name} is a symbolic link to {secret}",
                   "never through a link", "replace the link with a copy"):
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    assert not (tmp_path / "out").exists()  # nothing written
    with pytest.raises(UserError, match=f"{name} is a symbolic link"):
        check_before_start(parse_config(yaml.safe_load(config.read_text())),
                           stages={Stage.TOKENIZER, Stage.PREPARE, Stage.TRAIN},
                           resume=False, overwrite=False)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_model_file_linked_out_of_the_folder_is_refused_by_every_reader(tmp_path, name):
    from payload.training import pretrained

    folder = model_folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.replace(folder / name, elsewhere / name)
    (folder / name).symlink_to(elsewhere / name)
    config = parse_config(yaml.safe_load(run_config(tmp_path, folder).read_text()))
    with pytest.raises(UserError, match=f"{name} is a symbolic link to .*never through a link"):
        check_before_start(config, stages={Stage.TRAIN}, resume=False, overwrite=False)
    # What the train stage reads the folder with, whichever engine.
    with pytest.raises(UserError, match=f"{name} is a symbolic link"):
        if name == "config.json":
            pretrained.pretrained_config(str(folder), family="roberta", vocab_size=300)
        else:
            with pretrained.opened_weights(str(folder), name):
                pass
    assert not (tmp_path / "out").exists()


def test_a_link_that_stays_inside_the_folder_is_refused_too(tmp_path, stage):
    """No link is followed (O_NOFOLLOW): a link inside the folder could be swapped for one out
    of it between a check and the read, so the folder's files must be its own plain files."""
    folder = model_folder(tmp_path)
    (folder / "versions").mkdir()
    os.replace(folder / "tokenizer_config.json", folder / "versions" / "tokenizer_config.json")
    (folder / "tokenizer_config.json").symlink_to(Path("versions") / "tokenizer_config.json")
    config = run_config(tmp_path, folder)
    status, errors = stage("tokenizer", "--config", str(config))
    assert status == 2 and len(errors) == 1, errors
    assert "tokenizer_config.json is a symbolic link to versions/tokenizer_config.json" in errors[0]
    assert not (tmp_path / "out").exists()


def test_the_folder_itself_may_be_reached_through_a_link(tmp_path, stage):
    folder = model_folder(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "current").symlink_to(folder)
    config = run_config(tmp_path, tmp_path / "models" / "current")
    assert stage("tokenizer", "--config", str(config)) == (0, [])
