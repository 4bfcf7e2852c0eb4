"""What the JAX engine's tests share: small architectures and inputs, the tiny worker program
run as processes, reading Orbax steps back, the TF engine's batches as numpy.

    raw = architecture("gpt2", vocab_size=96, **SMALL)
    inputs = model_inputs(raw, np.random.default_rng(0))
    env = worker_env(devices=2)          # for scripts/jax_worker.py processes
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.support.paths import SCRIPTS
from tests.support.runners import payload_env

JAX_WORKER = SCRIPTS / "jax_worker.py"
JAX_REFERENCE = SCRIPTS / "jax_reference.py"
SMALL = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64}


def architecture(family: str, *, vocab_size: int, seq_len: int = 64, **model) -> dict:
    """The transformers config a run derives from its `model` section (payload.core.sizes), with
    the padding id payload.training.model.model_config gives it."""
    from payload.config import ModelConfig
    from payload.core.sizes import ROBERTA_POSITION_PADDING, transformers_config

    raw = transformers_config(ModelConfig(family=family, **model), vocab_size=vocab_size,
                              seq_len=seq_len)
    raw["pad_token_id"] = ROBERTA_POSITION_PADDING if family == "roberta" else 0
    return raw


def model_inputs(raw: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Three right-padded rows of different lengths (and for T5, padded decoder rows that
    start with the decoder start id, the pad id)."""
    pad = raw["pad_token_id"]

    def rows(lengths, width, first=None):
        ids = rng.integers(5, raw["vocab_size"], (len(lengths), width))
        mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
        if first is not None:
            ids[:, 0] = first
        return np.where(mask > 0, ids, pad).astype(np.int64), mask

    input_ids, attention_mask = rows([12, 9, 5], 12)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if raw["model_type"] == "t5":
        decoder_ids, decoder_mask = rows([7, 4, 6], 7, first=pad)
        inputs |= {"decoder_input_ids": decoder_ids, "decoder_attention_mask": decoder_mask}
    return inputs


def checkpoint_variables(folder) -> dict:
    """Every array of an Orbax step folder (weights, optimizer moments, the step count), read
    onto this process's first device whatever devices wrote it."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    reader = ocp.StandardCheckpointer()
    saved = reader.metadata(folder / "default").item_metadata
    here = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    tree = reader.restore(folder / "default", jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here), saved))
    return {jax.tree_util.keystr(path): np.asarray(value)
            for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]}



def reader_batches(config, inputs, split: str):
    """Numpy batches of the neutral reader and objective (payload.data.stream), as one process
    reads them: the training order from step 0, or the validation batches."""
    if split == "validation":
        return inputs.eval_batches(host=0, num_hosts=1)
    from payload.training.inputs import with_data_order

    ordered = with_data_order(config, inputs, resume=False, start=0)
    return ordered.train_batches(0, host=0, num_hosts=1)


def worker_env(devices: int) -> dict:
    env = payload_env(JAX_PLATFORMS="cpu")
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    if devices > 1:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    env["XLA_FLAGS"] = " ".join(flags)
    return env


def tiny_program(n_embd: int = 16):
    """A one-layer GPT-2 train program over this process's devices (4 steps of AdamW); another
    `n_embd` gives another run's state."""
    from types import SimpleNamespace

    import jax

    from payload.core.fit.sharding import plan_sharding
    from payload.engines.jax import step as jax_step

    raw = {"model_type": "gpt2", "vocab_size": 32, "n_embd": n_embd, "n_layer": 1, "n_head": 2,
           "n_positions": 8}
    cfg = SimpleNamespace(learning_rate=1e-2, warmup_steps=1, steps=4, weight_decay=0.01,
                          max_grad_norm=1.0, optimizer="adamw", bf16=False, seed=0)
    plan = plan_sharding(1, num_devices=len(jax.devices()), hbm_bytes_per_chip=1 << 30)
    return jax_step.TrainProgram(raw, family="gpt2", train_cfg=cfg,
                                 mesh=jax_step.make_mesh(plan))


def jax_config(out, family: str, *, model=None, **train):
    """The training tests' run of `family` on the JAX engine, written beside output_dir."""
    import yaml

    from tests.support.configs import training_config

    raw = training_config(out, family, engine="jax", **train)
    raw["model"].update(model or {})
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def train_stage(config, *args, **kwargs):
    """`python -m payload train` as a process; it must succeed."""
    from tests.support.runs import run_stage

    result = run_stage("train", config, *args, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def startup_program(tmp_path, family="gpt2"):
    """(architecture, a two-layer train program over this process's devices): the start-up
    tests' model, in their processes and the ones they start."""
    import jax

    from payload.core.fit.sharding import plan_sharding
    from payload.engines.jax import step as jax_step
    from tests.support.configs import training_run_config
    from tests.support.jax import architecture

    raw = architecture(family, vocab_size=64, seq_len=16, hidden_size=32, num_layers=2,
                       num_heads=2, intermediate_size=64)
    train_cfg = training_run_config(tmp_path / "unused", family, steps=4).train
    plan = plan_sharding(1, num_devices=len(jax.devices()), hbm_bytes_per_chip=1 << 30)
    return raw, jax_step.TrainProgram(raw, family=family, train_cfg=train_cfg,
                                      mesh=jax_step.make_mesh(plan))


def assert_export_gives_the_checkpoints_logits_in_pytorch(config: Path, out: Path, work: Path,
                                                          *, steps: int) -> None:
    """model/ loaded by PyTorch transformers 5.x, and the JAX model restored from the newest
    checkpoint by the engine's own program: the same logits (<= 1e-4) for padded rows."""
    import json
    import subprocess

    import pytest
    from flax import nnx

    from payload.config import load_config
    from payload.engines.jax import export as jax_export
    from payload.engines.jax import step as jax_step
    from payload.stages.export import trained_weights
    from tests.support.paths import TORCH_PYTHON, TORCH_READY

    note = json.loads((out / "model" / "tpuctl_export.json").read_text())
    assert note["checkpoint"] == f"checkpoints/{steps}"  # relative: model/ is published
    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    run = load_config(config)
    hf_config = trained_weights(run).hf_config  # the one export wrote config.json from
    program = jax_step.TrainProgram(hf_config.to_dict(), family=run.model.family,
                                    train_cfg=run.train, mesh=jax_export.one_cpu_mesh())
    params = jax_export._restore_params(str(out / note["checkpoint"]), program)
    model = nnx.merge(program.graphdef, params)
    raw = json.loads((out / "model" / "config.json").read_text())
    inputs = model_inputs({**raw, "pad_token_id": raw.get("pad_token_id") or 0},
                          np.random.default_rng(0))
    ours = np.asarray(model(**inputs))
    work.mkdir()
    np.savez(work / "inputs.npz", **inputs)
    jobs = [{"folder": str(out / "model"), "family": run.model.family, "inputs": str(work / "inputs.npz"),
             "output": str(work / "torch.npy")}]
    (work / "jobs.json").write_text(json.dumps(jobs))
    torch = subprocess.run([str(TORCH_PYTHON), str(SCRIPTS / "torch_forward.py"),
                            str(work / "jobs.json")], capture_output=True, text=True,
                           timeout=300, check=False)
    assert torch.returncode == 0, torch.stdout + torch.stderr[-3000:]
    assert json.loads(torch.stdout.strip().splitlines()[-1])["transformers"].startswith("5.")
    difference = float(np.abs(ours - np.load(work / "torch.npy")).max())
    print(f"exported model/ in PyTorch vs the JAX checkpoint: max |logit difference| "
          f"{difference:.2e}")
    assert difference <= 1e-4
