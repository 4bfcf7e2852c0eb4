"""Multi-process JAX through the launcher, for real: `tpuctl train --local --workers 2` with
`train.engine: jax` runs every stage (tokenizer, prepare, train, export), both workers train as
one JAX program (gloo collectives, the coordinator on worker 0's per-job port), the run computes
what one process over two CPU devices computes from the same global batches, and the exported
model/ gives in PyTorch transformers 5.x the logits of the JAX model of the final checkpoint."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("optax")
pytest.importorskip("tensorflow")

from typer.testing import CliRunner

from launcher.cli import app
from tests.support.configs import tiny_config
from tests.support.jax import (
    JAX_REFERENCE,
    assert_export_gives_the_checkpoints_logits_in_pytorch,
    checkpoint_variables,
    worker_env,
)
from tests.support.paths import SCRIPTS, TORCH_PYTHON, TORCH_READY

STEPS = 20


def corpus(folder: Path) -> Path:
    path = folder / "corpus.txt"
    path.write_text("".join(f"sentence {i} about {' '.join(['rivers', 'stones'][i % 2:])} "
                            f"and light {i % 13}\n" for i in range(800)))
    return path


def jax_config(folder: Path, out: Path, workers: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return tiny_config(folder, name="jax-local", corpus=str(corpus(folder)), output_dir=str(out),
                       cluster={"provider": "local", "workers": workers},
                       model={"family": "gpt2", "dropout": 0.1},
                       train={"engine": "jax", "steps": STEPS, "batch_size": 8,
                              "learning_rate": 5e-3, "checkpoint_every": 10, "eval_every": 10,
                              "eval_batches": 2})


@pytest.mark.slow  # the whole pipeline on two workers, the reference, PyTorch: ~2 min here
def test_two_local_jax_workers_compute_what_one_process_over_two_devices_computes(
        tmp_path, tpuctl_home):
    out = tmp_path / "out"
    config = jax_config(tmp_path / "run", out, workers=2)
    result = CliRunner().invoke(app, ["train", "-c", str(config), "--local"])  # every stage
    assert result.exit_code == 0, result.output
    # Every worker trained (one program over both processes) and ended with the same weights.
    hashes = re.findall(r"worker-(\d) \| .*finished at step 20; weights sha256 (\w+)",
                        result.output)
    assert sorted(w for w, _ in hashes) == ["0", "1"], result.output
    assert hashes[0][1] == hashes[1][1]
    multi = json.loads((out / "metrics.json").read_text())
    assert multi["engine"] == "jax" and multi["strategy"] == "cpu-multi-worker"
    assert multi["replicas"] == 2

    # The reference: the same shards and tokenizer, one process over two CPU devices, reading
    # the same global batches (payload.data.stream).
    ref = tmp_path / "ref"
    shutil.copytree(out, ref, ignore=shutil.ignore_patterns("checkpoints", "metrics.json",
                                                            "logs", "model"))
    ref_config = jax_config(tmp_path / "ref-run", ref, workers=1)
    single = subprocess.run([sys.executable, str(JAX_REFERENCE), "--config", str(ref_config)],
                            env=worker_env(2),
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-3000:]
    assert "JAX on 2 cpu device(s) in 1 process(es)" in single.stdout, single.stdout[-2000:]
    one = json.loads((ref / "metrics.json").read_text())
    assert one["replicas"] == 2 and one["strategy"] == "cpu"
    for key in ("train", "evals"):
        assert [r["step"] for r in multi[key]] == [r["step"] for r in one[key]]
        np.testing.assert_allclose([r["loss"] for r in multi[key]],
                                   [r["loss"] for r in one[key]], rtol=0, atol=1e-5)
    assert one["evals"][-1]["loss"] < one["evals"][0]["loss"]  # it trained, dropout on
    wanted = checkpoint_variables(ref / "checkpoints" / str(STEPS))
    got = checkpoint_variables(out / "checkpoints" / str(STEPS))
    assert sorted(got) == sorted(wanted)
    for name, value in wanted.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-5, err_msg=name)


    assert_export_gives_the_checkpoints_logits_in_pytorch(config, out, tmp_path / "torch",
                                                          steps=STEPS)


LLAMA_STEPS = 30


@pytest.mark.slow  # two pipelines on two workers and PyTorch: ~7 min on a loaded 2-core box
def test_a_two_worker_llama_run_learns_exports_and_loads_in_pytorch(tmp_path, tpuctl_home):
    """Family llama, size tiny, on two local JAX workers: the evaluation loss falls; the export
    is a LlamaForCausalLM folder PyTorch transformers 5.x loads without a missing or unused
    weight, whose loss on the run's evaluation rows is within 2% of the run's last evaluation,
    and which generates; a run with model.init_from that folder starts where it ended."""
    import yaml

    from payload.config import load_config
    from payload.training.inputs import check_inputs

    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    out = tmp_path / "out"
    config = tiny_config(
        tmp_path / "run", name="llama-local", corpus=str(corpus(tmp_path)), output_dir=str(out),
        cluster={"provider": "local", "workers": 2},
        model={"family": "llama", "size": "tiny", "hidden_size": None, "num_layers": None,
               "num_heads": None, "intermediate_size": None},
        train={"engine": "jax", "steps": LLAMA_STEPS, "batch_size": 8, "learning_rate": 5e-3,
               "checkpoint_every": LLAMA_STEPS, "eval_every": 15, "eval_batches": 2})
    result = CliRunner().invoke(app, ["train", "-c", str(config), "--local"])  # every stage
    assert result.exit_code == 0, result.output
    evals = json.loads((out / "metrics.json").read_text())["evals"]
    assert [e["step"] for e in evals] == [0, 15, LLAMA_STEPS]
    assert evals[-1]["loss"] < evals[0]["loss"] - 1.0  # it learned
    settings = json.loads((out / "model" / "config.json").read_text())
    assert settings["architectures"] == ["LlamaForCausalLM"]
    assert not (out / "model" / "tf_model.h5").exists()  # transformers has no TF Llama

    # The run's evaluation rows: the first eval_batches global batches of the validation
    # split, each two workers' pipelines side by side, as the loop evaluates.
    run = load_config(config)
    inputs = check_inputs(run)
    rows = {"input_ids": [], "attention_mask": []}
    for worker in range(2):
        batches = inputs.pipeline(run, inputs.validation_files, shuffle=False, start_batch=0,
                                  batch_size=4, pipeline_id=worker, num_pipelines=2)
        for batch, _ in zip(batches.as_numpy_iterator(), range(2), strict=False):
            for key in rows:
                rows[key].append(batch[key])
    np.savez(tmp_path / "rows.npz", **{k: np.concatenate(v) for k, v in rows.items()})
    loss = subprocess.run([str(TORCH_PYTHON), str(SCRIPTS / "torch_eval_loss.py"),
                           str(out / "model"), str(tmp_path / "rows.npz")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert loss.returncode == 0, loss.stdout + loss.stderr[-3000:]
    report = json.loads(loss.stdout.strip().splitlines()[-1])
    assert report["transformers"].startswith("5.") and not report["problems"], report
    print(f"llama: the run's last eval {evals[-1]['loss']:.4f}, PyTorch {report['loss']:.4f}")
    assert report["loss"] == pytest.approx(evals[-1]["loss"], rel=0.02)
    usage = subprocess.run([str(TORCH_PYTHON), str(SCRIPTS / "torch_usage.py"),
                            str(out / "model"), "llama", "sentence 3 about rivers and"],
                           capture_output=True, text=True, timeout=300, check=False)
    assert usage.returncode == 0, usage.stdout + usage.stderr[-3000:]
    generated = json.loads(usage.stdout.strip().splitlines()[-1])["generated"]
    assert len(generated[0]) > 0

    # Continued pretraining from the folder: the same shards, the folder's own tokenizer.
    cont = tmp_path / "cont"
    shutil.copytree(out, cont, ignore=shutil.ignore_patterns("checkpoints", "metrics.json",
                                                             "logs", "model"))
    raw = yaml.safe_load(config.read_text())
    raw.update(name="llama-cont", output_dir=str(cont))
    raw["model"] = {"family": "llama", "init_from": str(out / "model")}
    raw["train"].update(steps=2, eval_every=2, checkpoint_every=2)
    del raw["tokenizer"]
    (tmp_path / "cont.yaml").write_text(yaml.safe_dump(raw))
    continued = CliRunner().invoke(app, ["train", "-c", str(tmp_path / "cont.yaml"), "--local",
                                         "--stages", "train"])
    assert continued.exit_code == 0, continued.output
    started = json.loads((cont / "metrics.json").read_text())["evals"][0]
    assert started["step"] == 0
    assert started["loss"] == pytest.approx(evals[-1]["loss"], abs=1e-4)
