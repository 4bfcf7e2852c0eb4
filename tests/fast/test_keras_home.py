"""Keras writes keras.json into its home when it loads: a stage's Keras home is tpuctl's local
state, never ~/.keras, so a run writes nothing outside output_dir and ~/.tpuctl (issue 38,
item 8)."""

from __future__ import annotations

import os

import payload.data.tokenizer as tokenizer_stage
from tests.support.configs import base_config, write_config
from tests.support.runners import payload_main


def test_a_stages_keras_home_is_tpuctls_state(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(tokenizer_stage, "run_tokenizer",
                        lambda config, overwrite: seen.append(os.environ.get("KERAS_HOME")))
    monkeypatch.delenv("KERAS_HOME", raising=False)
    path = write_config(tmp_path / "run.yaml", base_config(tmp_path / "out", tmp_path / "c.txt"))
    home = tmp_path / "state"
    payload_main("tokenizer", "--config", path, env={"TPUCTL_HOME": str(home)}, check=True)
    assert seen == [str(home / "keras")]
    # One the user set is kept.
    payload_main("tokenizer", "--config", path, check=True,
                 env={"TPUCTL_HOME": str(home), "KERAS_HOME": str(tmp_path / "mine")})
    assert seen[-1] == str(tmp_path / "mine")
