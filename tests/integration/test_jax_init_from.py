"""model.init_from through the train stage on the JAX engine: a run continuing from a folder the
TF engine exported, or one the JAX engine exported, starts from those weights (its step-0
evaluation is the source run's last one, on the same validation shards), and `--resume` of it
continues from its own checkpoint, not from the folder.

    source (tf or jax, 60 steps) -> export -> jax run with model.init_from: source/model
"""

import json

import numpy as np
import pytest

pytest.importorskip("optax")
pytest.importorskip("tensorflow")

import yaml

from tests.support.configs import training_config
from tests.support.jax import checkpoint_variables
from tests.support.runs import prepared_run, run_stage, trained_run

pytestmark = pytest.mark.slow  # two source runs, four JAX runs: ~3 minutes here
SOURCE_STEPS = 60


def stage(name: str, config, *args: str) -> str:
    result = run_stage(name, config, *args, timeout=600)
    assert result.returncode == 0, f"{name}: " + result.stderr[-3000:]
    return result.stdout


def write(out, raw: dict):
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def evals(out) -> list[dict]:
    return json.loads((out / "metrics.json").read_text())["evals"]


def trained_source(engine: str, tmp_path_factory):
    """A GPT-2 trained by `engine` on the shared shards, then exported (made once per session:
    tests.support.runs.trained_run): a copy of its output_dir."""
    return trained_run(tmp_path_factory.mktemp(f"source-{engine}"), "gpt2", export=True,
                       engine=engine, steps=SOURCE_STEPS, eval_every=SOURCE_STEPS,
                       checkpoint_every=SOURCE_STEPS)


@pytest.fixture(scope="module", params=["tensorflow", "jax"])
def source(request, tmp_path_factory):
    return request.param, trained_source(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def tf_source(tmp_path_factory):
    return trained_source("tensorflow", tmp_path_factory)


def continued(tmp_path, name: str, folder, **train):
    """A JAX run of the same shards (and the same tokenizer) from `folder`'s weights."""
    out = prepared_run(tmp_path / name, "gpt2")
    raw = training_config(out, "gpt2", engine="jax", eval_every=10, checkpoint_every=10, **train)
    raw["model"] = {"family": "gpt2", "init_from": str(folder), "dropout": 0.0}
    del raw["tokenizer"]  # the folder's own (a copy of the one the shards were made with)
    return out, write(out, raw), raw


def test_a_jax_run_starts_from_the_exported_weights_of_either_engine(source, tmp_path):
    engine, source_out = source
    before = evals(source_out)
    assert [e["step"] for e in before] == [0, SOURCE_STEPS]
    scratch, trained = before[0]["loss"], before[-1]["loss"]
    out, config, _ = continued(tmp_path, "continued", source_out / "model", steps=10)
    stage("train", config)
    after = evals(out)
    started = after[0]["loss"]
    print(f"from {engine}: from scratch {scratch:.4f}, source's last eval {trained:.4f}, "
          f"the jax run's step-0 eval {started:.4f}")
    assert after[0]["step"] == 0
    # The same weights on the same validation batches: the source's own last evaluation.
    assert started == pytest.approx(trained, abs=1e-4)
    assert started < scratch - 0.5


def test_a_resume_of_an_init_from_run_continues_its_own_checkpoint(tf_source, tmp_path):
    """Killed just after its step-10 checkpoint and resumed: the same step-30 checkpoint,
    variable for variable, as the run left alone (a resume that reloaded the folder's weights
    would not end there)."""
    import signal
    import subprocess
    import time

    from tests.support.runners import payload_env
    from tests.support.runs import stage_command

    # (One source is enough here: the folder is read the same way whichever engine wrote it.)
    source_out = tf_source
    cut, cut_config, _ = continued(tmp_path, "cut", source_out / "model", steps=30)
    whole, whole_config, _ = continued(tmp_path, "whole", source_out / "model", steps=30)
    victim = subprocess.Popen(stage_command("train", cut_config), env=payload_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = cut / "checkpoints" / "10" / "commit_success.txt"
        deadline = time.monotonic() + 300
        while not first.exists() and victim.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        output = victim.communicate(timeout=60)[0]
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert victim.returncode == -signal.SIGKILL, output[-3000:]  # killed before it finished
    newest = max(int(p.name) for p in (cut / "checkpoints").iterdir()
                 if (p / "commit_success.txt").exists())
    assert newest in (10, 20)
    stage("train", whole_config)
    resumed = stage("train", cut_config, "--resume")
    assert f"resuming from {cut}/checkpoints/{newest}" in resumed, resumed[-2000:]
    assert [e["step"] for e in evals(cut)] == [0, 10, 20, 30]
    wanted, got = (checkpoint_variables(out / "checkpoints" / "30") for out in (whole, cut))
    assert sorted(got) == sorted(wanted) and len(wanted) > 10
    for name, value in wanted.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
