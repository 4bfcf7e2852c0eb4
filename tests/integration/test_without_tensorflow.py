"""The JAX route in a Python without TensorFlow: tokenizer, prepare, train (train.engine jax)
and export each run as a process in which `tensorflow` and `tf_keras` cannot be imported
(tests/support/no_tensorflow), and PyTorch transformers 5.x loads the exported model.safetensors with every weight in place."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("optax")

from tests.support.configs import tiny_config
from tests.support.paths import NO_TENSORFLOW, REPO, SCRIPTS, torch_python
from tests.support.runners import payload_env
from tests.support.runs import run_stage

STEPS = 4


def without_tensorflow() -> dict:
    return payload_env(PYTHONPATH=os.pathsep.join([str(NO_TENSORFLOW), str(REPO),
                                                   os.environ.get("PYTHONPATH", "")]))


@pytest.mark.torch
def test_the_jax_route_runs_where_tensorflow_cannot_be_imported(tmp_path):
    torch = torch_python()
    env = without_tensorflow()
    hidden = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u, transformers.utils as t; "
         "print(u.find_spec('tensorflow'), u.find_spec('tf_keras'), t.is_tf_available())"],
        env=env, capture_output=True, text=True, timeout=120, check=True)
    assert hidden.stdout.split() == ["None", "None", "False"], hidden.stderr[-2000:]

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"sentence {i} about rivers and light {i % 13}\n"
                              for i in range(400)))
    out = tmp_path / "out"
    config = tiny_config(tmp_path, name="no-tf", corpus=str(corpus), output_dir=str(out),
                         cluster={"provider": "local", "workers": 1},
                         train={"engine": "jax", "steps": STEPS})
    for stage in ("tokenizer", "prepare", "train", "export"):
        result = run_stage(stage, config, env=env)
        assert result.returncode == 0, f"{stage}:\n{result.stderr[-3000:]}"

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["engine"] == "jax" and metrics["step"] == STEPS
    # TensorBoard's events, written without TensorFlow (tests/integration/test_utilisation.py
    # reads such files with TensorFlow's own reader).
    assert list((out / "logs" / "tensorboard").glob("events.out.tfevents.*"))

    model = out / "model"
    assert {p.name for p in model.iterdir()} >= {"config.json", "model.safetensors",
                                                 "tokenizer.json"}
    assert not (model / "tf_model.h5").exists()
    usage = subprocess.run([str(torch), str(SCRIPTS / "torch_usage.py"), str(model),
                            "gpt2", "sentence 3 about"],
                           capture_output=True, text=True, timeout=300, check=False)
    assert usage.returncode == 0, usage.stdout + usage.stderr[-3000:]
    report = json.loads(usage.stdout.strip().splitlines()[-1])
    assert not report["problems"] and len(report["generated"][0]) > 0, report
