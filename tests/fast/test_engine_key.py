"""train.engine as easy to find as model.family: `tpuctl init` writes it, and an `engine` (or any
key) written in the wrong section is one line naming where it belongs."""

from __future__ import annotations

import copy

import pytest
import yaml

from payload.config import load_config, parse_config
from payload.core.errors import UserError
from tests.support.configs import base_config
from tests.support.runners import tpuctl

GOOD = base_config("out", "corpus.txt")


def test_init_writes_the_engine_beside_the_other_train_keys(tmp_path):
    assert tpuctl("init", tmp_path).returncode == 0
    text = (tmp_path / "tpuctl.yaml").read_text()
    train = yaml.safe_load(text)["train"]
    assert train["engine"] == "tensorflow" and "steps" in train
    assert "tensorflow | jax" in text
    # Switching the engine is editing that one line.
    (tmp_path / "tpuctl.yaml").write_text(text.replace("engine: tensorflow", "engine: jax"))
    assert load_config(tmp_path / "tpuctl.yaml").train.engine == "jax"


@pytest.mark.parametrize("where", [(), ("model",), ("cluster",), ("data",), ("tokenizer",)])
def test_an_engine_in_the_wrong_section_points_at_train_engine(where):
    raw = copy.deepcopy(GOOD)
    section = raw
    for name in where:
        section = section[name]
    section["engine"] = "jax"
    with pytest.raises(UserError) as info:
        parse_config(raw)
    [line] = str(info.value).splitlines()
    key = ".".join((*where, "engine"))
    assert f"unknown key '{key}' (engine belongs in train: did you mean 'train.engine'?" in line


def test_a_key_in_the_wrong_section_is_not_also_reported_missing():
    raw = copy.deepcopy(GOOD)
    raw["model"]["steps"] = raw["train"].pop("steps")
    with pytest.raises(UserError) as info:
        parse_config(raw)
    [line] = str(info.value).splitlines()
    assert "unknown key 'model.steps' (steps belongs in train: did you mean 'train.steps'?" in line
    raw = copy.deepcopy(GOOD)
    raw["train"]["output_dir"] = raw.pop("output_dir")
    with pytest.raises(UserError, match=r"output_dir is a top-level key: did you mean "
                                        r"'output_dir'\?"):
        parse_config(raw)
