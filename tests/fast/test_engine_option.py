"""`tpuctl train --engine NAME`: one run of any config with another engine, as the dry run shows.

    tpuctl train --local --engine jax --dry-run    # "engine: jax"; the set-up checks jax too
"""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from launcher.cli import app

runner = CliRunner()


def _config(tmp_path, cluster: dict, train: dict | None = None) -> str:
    (tmp_path / "corpus.txt").write_text("".join(f"line {i} of the corpus\n" for i in range(8)))
    raw = {
        "name": "t",
        "output_dir": str(tmp_path / "out"),
        "cluster": cluster,
        "data": {"corpus": str(tmp_path / "corpus.txt")},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2},
        "train": {"steps": 4, "batch_size": 4, "learning_rate": 1e-3, **(train or {})},
    }
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _set_up_line(output: str) -> str:
    return next(line for line in output.splitlines() if line.strip().startswith("set-up:"))


def test_the_engine_option_overrides_the_file_for_this_run(tmp_path, tpuctl_home):
    config = _config(tmp_path, {"provider": "local", "workers": 2})
    plain = runner.invoke(app, ["train", "--local", "--dry-run", "-c", config])
    assert plain.exit_code == 0, plain.output
    assert "engine: tensorflow" in plain.output.splitlines()
    assert "jax==" not in _set_up_line(plain.output)
    jax = runner.invoke(app, ["train", "--local", "--dry-run", "--engine", "jax", "-c", config])
    assert jax.exit_code == 0, jax.output
    assert "engine: jax" in jax.output.splitlines()
    # The workers' environment is the engine's: the set-up checks JAX's pinned packages.
    assert "jax==" in _set_up_line(jax.output) and "flax==" in _set_up_line(jax.output)
    # The file is the user's: the option changes the run, never the config.
    assert "engine" not in yaml.safe_load((tmp_path / "tpuctl.yaml").read_text())["train"]
    assert not (tmp_path / "out").exists()


def test_a_v6e_config_written_for_tensorflow_trains_with_jax_through_the_option(
        tmp_path, tpuctl_home):
    """The option is applied before the cluster is checked: v6e, refused for tensorflow, has
    its JAX route when the run says --engine jax."""
    config = _config(tmp_path, {"provider": "gcp", "project": "my-project", "zone": "us-east5-b",
                                "accelerator_type": "v6e-8",
                                "ssh_source_ranges": ["203.0.113.7/32"]},
                     train={"batch_size": 16})  # 2 rows per chip
    refused = runner.invoke(app, ["train", "--dry-run", "-c", config])
    # (The real entry point makes this one line, exit 2: tests/test_bad_inputs.py.)
    assert "set train.engine: jax" in str(refused.exception), refused.output
    dry = runner.invoke(app, ["train", "--dry-run", "--engine", "jax", "-c", config])
    assert dry.exit_code == 0, dry.output
    assert "engine: jax" in dry.output.splitlines()
    # The JAX route: a CPython for jax[tpu] brought by uv, and the state laid over the chips.
    set_up = _set_up_line(dry.output)
    assert "cpython-3.11" in set_up and "jax" in set_up, set_up
    assert "sharding: data parallel" in dry.output, dry.output
