"""Local CPU runs this machine's memory cannot hold are refused before anything starts, in one
line: what the training processes need, what the machine has, and what would fit."""

from __future__ import annotations

import pytest
import yaml

from launcher import estimate
from payload.config import parse_config
from payload.core.engines import ENGINES, JAX
from payload.training import runplan
from tests.support.runners import tpuctl

GIB = 1 << 30
MACHINE = int(23.5 * GIB)  # this machine's kind: 2 cores, 23.5 GiB


def local_config(tmp_path, model: dict, **train) -> dict:
    (tmp_path / "c.txt").write_text("".join(f"some text {i}\n" for i in range(20)))
    return {"name": "mem", "output_dir": str(tmp_path / "out"),
            "cluster": {"provider": "local", "workers": 2},
            "data": {"corpus": str(tmp_path / "c.txt"), "seq_len": 128},
            "tokenizer": {"kind": "bpe", "vocab_size": 50257},
            "model": {"family": "gpt2", **model},
            "train": {"engine": "jax", "steps": 300, "batch_size": 32, "learning_rate": 1e-4,
                      **train}}


def dry_run(tmp_path, raw, monkeypatch, memory=MACHINE):
    monkeypatch.setattr(estimate, "machine_memory_bytes", lambda: memory)
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return tpuctl("train", "-c", path, "--local", "--dry-run", cwd=tmp_path,
                  env={"TPUCTL_HOME": str(tmp_path / "home")})


def test_gpt2_xl_on_two_local_workers_is_refused_naming_what_would_fit(tmp_path, monkeypatch):
    result = dry_run(tmp_path, local_config(tmp_path, {"size": "xl"}), monkeypatch)
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    # 1,557.6M parameters x 16 bytes of AdamW state (23.2 GiB) x 1.2, what the JAX engine's
    # processes were measured to hold of it: 27.9 GiB in each of the two.
    assert line.startswith("error: gpt2 xl (1,557.6M parameters) needs about "), line
    assert "adamw moments and their working copies 27.9 GiB" in line
    assert "for 2 local training processes, but this machine has 23.5 GiB of memory" in line
    assert "use model.size: small (about " in line and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "home" / "jobs").exists()


def test_what_would_fit_is_checked_by_the_same_arithmetic(tmp_path, monkeypatch):
    raw = local_config(tmp_path, {"size": "large"})
    config = parse_config(raw)
    arch = runplan.run_architecture(config)
    two, one = (runplan.cpu_memory(config, arch, processes=n).total for n in (2, 1))
    # Each process holds the whole state; one process computes the whole batch.
    assert one < two < 2 * one
    # A machine between the two: one worker fits, and is what the line says to use.
    memory = int((one + (two - one) / 2) / runplan.USABLE_SHARE_OF_MEMORY)
    result = dry_run(tmp_path, raw, monkeypatch, memory=memory)
    assert result.returncode == 2
    assert f"use --workers 1 (about {one / GIB:,.1f} GiB)" in result.stderr, result.stderr
    # With the room for both, the dry run goes on to its plan.
    roomy = dry_run(tmp_path, raw, monkeypatch, memory=int(two / runplan.USABLE_SHARE_OF_MEMORY)
                    + GIB)
    assert roomy.returncode == 0, roomy.stderr
    assert "run plan: gpt2 large" in roomy.stdout


@pytest.mark.parametrize("optimizer", ["adamw", "adafactor"])
def test_the_state_is_counted_per_optimizer(tmp_path, optimizer):
    config = parse_config(local_config(tmp_path, {"size": "small"}, optimizer=optimizer))
    memory = runplan.cpu_memory(config, runplan.run_architecture(config), processes=2)
    params = 124_439_808  # GPT-2 small with its 50,257-token vocabulary
    factor = ENGINES[JAX].cpu_memory_factors[0]
    assert memory.state == int(params * {"adamw": 16, "adafactor": 8}[optimizer] * factor)
    assert memory.rows == 16 and memory.base == runplan.CPU_PROCESS_BASE_BYTES
