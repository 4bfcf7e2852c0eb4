"""What publish uploads names no path of the machine it ran on and no bucket (issue 27, item 7):
model/'s export note gives its checkpoint relative to output_dir, and a reused tokenizer's
config loses the paths older transformers wrote into it (where it was loaded from, its files).
A tiny TF run, trained and exported in this process."""

from __future__ import annotations

import json
import shutil
import socket

import pytest

pytest.importorskip("tensorflow")

from payload.config import parse_config
from payload.core import layout
from payload.stages.export import checkpoint_name, run_export
from payload.stages.publish import _local_copy
from payload.stages.train import run_train
from tests.support.configs import training_config
from tests.support.runs import prepared_run


def test_nothing_publish_uploads_names_a_local_path_or_the_host(tmp_path):
    out = prepared_run(tmp_path, "gpt2")
    # The run reuses its tokenizer from a folder of the user's, whose tokenizer_config.json
    # an older transformers wrote with the paths it was loaded from.
    private = tmp_path / "alice-private" / "tok"
    shutil.copytree(out / "tokenizer", private)
    settings = json.loads((private / "tokenizer_config.json").read_text())
    settings.update(name_or_path=str(private), tokenizer_file=str(private / "tokenizer.json"),
                    special_tokens_map_file=str(private / "special_tokens_map.json"))
    (private / "tokenizer_config.json").write_text(json.dumps(settings))
    raw = training_config(out, "gpt2", steps=2, warmup_steps=1, checkpoint_every=2, eval_every=2)
    raw["tokenizer"] = {"path": str(private)}
    config = parse_config(raw)
    run_train(config)
    run_export(config)
    model = out / "model"
    note = json.loads((model / layout.EXPORT_NOTE).read_text())
    assert note == {"checkpoint": "checkpoints/ckpt-2"}
    _, uploaded = _local_copy(str(model))  # what publish sends, besides its model card
    assert "tpuctl_export.json" in uploaded and "tokenizer_config.json" in uploaded
    assert not [n for n in uploaded if n.startswith(".")]  # the completeness marker stays
    for name in uploaded:
        data = (model / name).read_bytes()
        for secret in (str(tmp_path), "alice-private"):
            assert secret.encode() not in data, f"{name} names {secret}"
        if name in ("tpuctl_export.json", "config.json", "tokenizer_config.json"):
            # tpuctl's own notes and settings: no value is the host's name (the vocabulary and
            # the weights may hold any short string by chance)
            assert f'"{socket.gethostname()}"' not in data.decode(), name
    kept = json.loads((model / "tokenizer_config.json").read_text())
    assert kept["model_input_names"] == ["input_ids", "attention_mask"]


@pytest.mark.parametrize(("output_dir", "checkpoint", "name"), [
    ("/data/runs/a", "/data/runs/a/checkpoints/30", "checkpoints/30"),
    ("/data/runs/a/", "/data/runs/a/checkpoints/ckpt-6", "checkpoints/ckpt-6"),
    ("gs://bucket/runs/a", "gs://bucket/runs/a/checkpoints/40", "checkpoints/40"),
    ("runs/a", "/elsewhere/checkpoints/ckpt-2", "checkpoints/ckpt-2"),  # never the full path
])
def test_a_checkpoint_is_named_relative_to_output_dir(output_dir, checkpoint, name):
    assert checkpoint_name(output_dir, checkpoint) == name
