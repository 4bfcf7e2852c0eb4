"""Checkpoints and model/ are replaced safely (issue 8): export swaps model/ whole and refuses
a tokenizer other than the checkpoints', train --overwrite names and removes only checkpoint
files, and every reader of checkpoints requires the folder's completeness marker."""

import logging
import os
import resource
import signal
import stat
import subprocess

import pytest

pytest.importorskip("tensorflow")

from payload.core import folders, layout
from payload.core.errors import UserError
from payload.stages.export import run_export
from payload.stages.train import run_train
from payload.training.checkpoints import removal_summary
from tests.support.configs import training_run_config, write_training_config
from tests.support.runners import assert_user_error, payload_env
from tests.support.runs import prepared_run, stage_command


def test_export_refuses_a_tokenizer_other_than_the_checkpoints(tmp_path):
    out = prepared_run(tmp_path, "roberta")
    config = training_run_config(out, "roberta", steps=2, warmup_steps=0)
    run_train(config)
    # Another tokenizer with the same vocabulary size and special tokens: the model settings
    # agree, only the fingerprint the checkpoints recorded tells them apart.
    tokenizer = out / "tokenizer" / "tokenizer.json"
    text = tokenizer.read_text()
    assert '"lstrip": false' in text
    tokenizer.write_text(text.replace('"lstrip": false', '"lstrip": true', 1))
    with pytest.raises(UserError, match=r"not the one the checkpoints were trained with"):
        run_export(config)
    assert not (out / "model").exists()


def _export(config, *, umask=0o022, file_limit=None):
    def limits():
        os.umask(umask)
        if file_limit:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    return subprocess.run(stage_command("export", config), env=payload_env(),
                          capture_output=True, text=True, timeout=300, preexec_fn=limits)


def test_export_swaps_model_whole_and_a_full_disk_keeps_the_old_one(tmp_path):
    # Training in this process (the stage's own process is not the point here); the exports as
    # processes of their own, under a umask and a file-size limit.
    out = prepared_run(tmp_path, "gpt2")
    run_train(training_run_config(out, "gpt2", steps=2, warmup_steps=0, checkpoint_every=2,
                                  eval_every=2))
    config = write_training_config(out, "gpt2", steps=2, warmup_steps=0, checkpoint_every=2,
                                   eval_every=2)
    proc = _export(config)
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = out / "model"
    assert folders.is_complete(str(model))
    # Teammates can read it: the umask decides the modes, not the temporary files' 0600.
    assert stat.S_IMODE(model.stat().st_mode) == 0o755
    assert {stat.S_IMODE(p.stat().st_mode) for p in model.iterdir()} == {0o644}
    first = (model / "model.safetensors").read_bytes()
    (model / "README.md").write_text("my model card\n")
    run_train(training_run_config(out, "gpt2", steps=4, warmup_steps=0, checkpoint_every=2,
                                  eval_every=2), resume=True)
    # A disk that fills while the new model is written (a file-size limit gives the same EFBIG).
    proc = _export(config, file_limit=(model / "tf_model.h5").stat().st_size // 2)
    assert_user_error(proc, "no space left", str(model))
    assert (model / "model.safetensors").read_bytes() == first, "the old model is gone"
    assert folders.is_complete(str(model))
    assert sorted(p.name for p in out.iterdir() if "model" in p.name) == ["model"]
    run_export(training_run_config(out, "gpt2", steps=4, warmup_steps=0, checkpoint_every=2,
                                   eval_every=2))
    assert (model / "model.safetensors").read_bytes() != first
    assert (model / "README.md").read_text() == "my model card\n"  # not tpuctl's: kept
    assert "README.md" not in folders.read_complete(str(model))["files"]
    assert sorted(p.name for p in out.iterdir() if "model" in p.name) == ["model"]


def test_train_overwrite_names_what_it_removes_and_removes_only_checkpoint_files(tmp_path,
                                                                                  caplog):
    caplog.set_level(logging.INFO)
    out = prepared_run(tmp_path, "gpt2")
    run_train(training_run_config(out, "gpt2", steps=2, warmup_steps=0, checkpoint_every=1,
                         eval_every=2))
    ckpts = out / "checkpoints"
    written = sorted(p.name for p in ckpts.iterdir())
    assert {"checkpoint", "ckpt-2.index", "run.json", layout.COMPLETE} <= set(written)
    (ckpts / "notes.txt").write_text("which run this was\n")
    (ckpts / "ckpt-best").mkdir()
    (ckpts / "ckpt-best" / "weights.npz").write_bytes(b"mine")
    caplog.clear()
    run_train(training_run_config(out, "gpt2", steps=2, warmup_steps=0, checkpoint_every=1,
                         eval_every=2), overwrite=True)
    said = [r.getMessage() for r in caplog.records if "removing" in r.getMessage()]
    assert len(said) == 1, said
    # Exactly what was there, named before it went, in the one readable line: the checkpoints
    # by name with the count of their files, then tpuctl's own files; never the user's.
    engine_files = [n for n in written if n == "checkpoint" or n.startswith("ckpt-")]
    own = [n for n in written if n not in engine_files]
    assert said[0].split(": ", 1)[1] == removal_summary(engine_files, own), said[0]
    assert "ckpt-1, ckpt-2" in said[0] and f"({len(engine_files)} files)" in said[0], said[0]
    assert "notes.txt" not in said[0] and "ckpt-best" not in said[0], said[0]
    assert (ckpts / "notes.txt").read_text() == "which run this was\n"
    assert (ckpts / "ckpt-best" / "weights.npz").read_bytes() == b"mine"
    assert folders.is_complete(str(ckpts))


def test_checkpoint_readers_require_the_complete_marker(tmp_path):
    out = prepared_run(tmp_path, "gpt2")
    config = training_run_config(out, "gpt2", steps=2, warmup_steps=0)
    run_train(config)
    with pytest.raises(UserError, match="contradict"):
        run_train(config, resume=True, overwrite=True)
    (out / "checkpoints" / layout.COMPLETE).unlink()  # a clearing that was cut short
    with pytest.raises(UserError, match=r"--resume: the checkpoints in .* are incomplete"):
        run_train(training_run_config(out, "gpt2", steps=4, warmup_steps=0), resume=True)
    with pytest.raises(UserError, match=r"nothing to export: the checkpoints .* incomplete"):
        run_export(config)
    assert not (out / "model").exists()
