"""The real TPU compiler on this machine (libtpu, `make setup-libtpu`): the run's JAX steps
compiled for TPU slices of every generation, with splash attention (causal and padding), FSDP
and rematerialisation, and a program too big for its chips refused in one line. One compile in
the default suite; the rest are slow (a compile takes 10 s to minutes on two cores)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from tests.support.jax_plans import config
from tests.support.paths import REPO, SCRIPTS, libtpu
from tests.support.runners import payload_env, run_cli

V5E_4 = {"provider": "gcp", "project": "my-project", "zone": "us-west4-a",
         "accelerator_type": "v5litepod-4"}
TINY = {"size": None, "hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128}


def _write(tmp_path, raw: dict, *, output_dir: bool = False):
    """The config file; without output_dir unless asked (a gcp run's default is its bucket)."""
    raw = {key: value for key, value in raw.items() if output_dir or key != "output_dir"}
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _offline(tmp_path) -> dict:
    return {"TPU_LIBRARY_PATH": str(libtpu()), "TPUCTL_HOME": str(tmp_path / "home"),
            "HOME": str(tmp_path), "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no.json")}


def test_a_gpt2_step_compiles_for_v5e_with_splash_attention_and_says_its_memory(tmp_path):
    path = _write(tmp_path, config(
        tmp_path, cluster=V5E_4, data={"seq_len": 256},
        tokenizer={"kind": "bpe", "vocab_size": 1000},
        model={"family": "gpt2", **TINY}, train={"batch_size": 8, "bf16": True}))
    result = run_cli("train", "--dry-run", "--compile", "-c", path, env=_offline(tmp_path),
                     timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "compile: v5litepod-4 = 4 TPU v5 lite devices (v5e:2x2), mesh data 4 x fsdp 1" in out
    memory = re.search(r"compiled train step: ([\d.]+) GiB HBM per chip \(arguments ([\d.]+) GiB "
                       r"\+ temporaries ([\d.]+) GiB \+ outputs ([\d.]+) GiB - aliased ([\d.]+) "
                       r"GiB\) of 16 GiB; the plan estimated ([\d.]+) GiB", out)
    assert memory, out
    total, *parts, _ = (float(x) for x in memory.groups())
    assert total > 0 and abs(total - (parts[0] + parts[1] + parts[2] - parts[3])) <= 0.02
    # The causal self-attention became splash's Pallas kernels: forward, dq and dkv per layer.
    kernels = re.search(r"attention in the compiled program: splash \(Pallas TPU kernels: (\d+)",
                        out)
    assert kernels and int(kernels.group(1)) >= 3 * TINY["num_layers"], out
    assert re.search(r"FLOPs per step: \S+ by the compiler \(all devices\), \S+ by the "
                     r"project's formula \(x[\d.]+\)", out), out
    # Nothing of libtpu's start-up talk reaches the terminal, and nothing was written.
    assert "InitGoogle" not in result.stdout + result.stderr
    assert not (tmp_path / "home").exists() or list((tmp_path / "home").rglob("*")) == []


def _stage(tmp_path, raw: dict, *target) -> dict:
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "payload.stages.tpu_compile", "-c",
         _write(tmp_path, raw, output_dir=True),
         *target, "--report", report], capture_output=True, text=True, timeout=1800,
        env=payload_env(TPU_LIBRARY_PATH=str(libtpu())), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(report.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("family, target, remat, devices, splash", [
    # Padding masks (BERT) on v4's megacore devices, every layer recomputed.
    ("bert", ("--accelerator", "v4-8"), "full", 4, True),
    # Causal (GPT-2) on v6e with products kept.
    ("gpt2", ("--accelerator", "v6e-4"), "dots", 4, True),
    # T5 on v5p: every attention the reference (its self-attentions add a learned bias; its
    # cross-attention has model.dropout on the weights, and a target length splash cannot tile).
    ("t5", ("--accelerator", "v5p-8"), "none", 4, False),
    # TPU7x, a Compute Engine slice: two devices a chip.
    ("gpt2", ("--machine-type", "tpu7x-standard-4t", "--topology", "2x2x1"), "none", 8, True),
])
def test_each_generation_compiles_the_run_as_its_trainer_would(tmp_path, family, target, remat,
                                                               devices, splash):
    report = _stage(tmp_path, config(
        tmp_path, data={"seq_len": 256}, tokenizer={"kind": "bpe", "vocab_size": 1000},
        model={"family": family, **TINY}, train={"batch_size": 8, "bf16": True,
                                                 "remat": remat}), *target)
    assert (report["devices"], report["remat"]) == (devices, remat)
    assert report["train"]["fits"] and report["train"]["hbm_bytes"] > 0
    assert bool(report["train"]["kernels"].get("splash")) == splash
    assert report["eval"]["hbm_bytes"] > 0
    assert report["train"]["flops"] > 0


@pytest.mark.slow
def test_fsdp_and_a_program_too_big_for_its_chips_through_the_compiler(tmp_path):
    # The script compiles a tiny GPT-2 split FSDP over 2 of v5e:2x2's devices, then the run
    # plan's arrangement against chips of 1 MiB: the compiler's figure refuses it, after trying
    # the other train.remat policies, in one line.
    result = subprocess.run([sys.executable, SCRIPTS / "tpu_compile_fsdp.py"],
                            capture_output=True, text=True, timeout=1800,
                            env=payload_env(TPU_LIBRARY_PATH=str(libtpu())), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads(result.stdout.strip().splitlines()[-1])
    assert said["fsdp_sharded_arguments"] < said["replicated_arguments"]
    assert said["all_gathers"] > 0
    assert said["refusal"].startswith("the TPU compiler says the training step does not fit "
                                      "v5litepod-4: with train.remat none and no FSDP")
    assert "\n" not in said["refusal"] and "use " in said["refusal"]
