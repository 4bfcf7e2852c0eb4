"""The train stage on the JAX engine (`train.engine: jax`), through `python -m payload train`:
each objective learns from the shared input pipeline, checkpoints are Orbax step folders under
the same checkpoints/ rules as the TF engine's, and a resume never crosses engines."""

import json
import math

import pytest

pytest.importorskip("optax")
pytest.importorskip("tensorflow")

import yaml

from payload.cloud import goodput
from payload.core import folders, layout, ledger, ownership, storage
from payload.core.engines import engine_spec
from payload.core.errors import UserError
from payload.training import checkpoints
from tests.support.configs import training_config
from tests.support.golden import assert_golden
from tests.support.jax import checkpoint_variables, jax_config
from tests.support.jax import train_stage as train
from tests.support.runners import assert_user_error
from tests.support.runs import prepared_run, run_stage


def assert_learned(out, *, every: int, steps: int, golden: str) -> dict:
    """The evaluations came every `every` steps, the first near a uniform guess over the 600
    tokens, and the curve is the recorded one (tests/support/golden.py): it falls, and it is
    what this training computed when recorded."""
    metrics = json.loads((out / "metrics.json").read_text())
    evals = metrics["evals"]
    assert [e["step"] for e in evals] == list(range(0, steps + 1, every))
    first, last = evals[0]["loss"], evals[-1]["loss"]
    assert first < math.log(600) + 1.5 and last < first, evals  # vocabulary: 600
    assert_golden(golden, evals)
    return metrics


# A few dozen steps against the recorded curve, where a few hundred were trained to pass the
# unigram floor (~0.85 x the first loss).
def test_gpt2_learns_on_jax_and_leaves_what_the_tf_engine_leaves(tmp_path):
    out = prepared_run(tmp_path, "gpt2")
    result = train(jax_config(out, "gpt2", steps=40, learning_rate=5e-3, eval_every=20,
                              checkpoint_every=20))
    metrics = assert_learned(out, every=20, steps=40, golden="gpt2-jax")
    assert metrics["engine"] == "jax" and metrics["strategy"] == "cpu"
    assert metrics["final"]["step"] == 40 and metrics["final"]["tokens_per_s"] > 0
    assert "perplexity" in metrics["final"]["eval"] and 0 < metrics["final"]["mfu"] < 1
    assert "finished at step 40; weights sha256" in result.stdout
    # Orbax step folders directly in checkpoints/, beside tpuctl's own files.
    folder = out / "checkpoints"
    names = {p.name for p in folder.iterdir()}
    assert {"20", "40", "run.json", "schedule.json", layout.COMPLETE} <= names, names
    assert not any(n.startswith("ckpt-") or n == "checkpoint" for n in names)
    assert json.loads((folder / "run.json").read_text())["engine"] == "jax"
    assert engine_spec("jax").newest_step(str(out)) == 40
    assert engine_spec("tensorflow").newest_step(str(out)) is None
    assert list((out / "logs" / "tensorboard").iterdir())
    # Issue 37: what the steps waited for their batches is the goodput's data loading.
    events = ledger.read(str(out))
    steps = [e for e in events if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 20, 40]
    assert steps[0]["input_wait_s"] == 0  # the batch the step was compiled for: no wait
    assert sum(e["input_wait_s"] for e in steps) > 0
    assert goodput.account(events)["buckets"]["data_loading"]["seconds"] == pytest.approx(
        sum(e["input_wait_s"] for e in steps), abs=1e-3)
    assert metrics["goodput"]["seconds"]["data_loading"] > 0


# RoBERTa learns on JAX in the slow tier: the same objective and model as BERT's here.
@pytest.mark.parametrize("family", ["bert", pytest.param("roberta", marks=pytest.mark.slow),
                                    "t5"])
def test_each_other_objective_learns_on_jax(tmp_path, family):
    out = prepared_run(tmp_path, family)
    train(jax_config(out, family, steps=60, learning_rate=5e-3, eval_every=20,
                     checkpoint_every=30, model={"hidden_size": 64, "intermediate_size": 128}),
          timeout=900)
    metrics = assert_learned(out, every=20, steps=60, golden=f"{family}-64-jax")
    key = "accuracy" if family in ("bert", "roberta") else "perplexity"
    assert key in metrics["final"]["eval"]


def fake_checkpoints(out, files: dict[str, str]) -> None:
    ownership.claim_output_dir(str(out))
    for name, text in files.items():
        path = out / "checkpoints" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_fresh_start_removes_checkpoint_files_of_either_engine_and_nothing_else(tmp_path,
                                                                                   caplog):
    out = tmp_path / "run"
    fake_checkpoints(out, {
        "200/commit_success.txt": "", "200/default/manifest.ocdbt": "x",
        "300.orbax-checkpoint-tmp-17/default/d/abc": "x",  # a save cut short
        "checkpoint": 'model_checkpoint_path: "ckpt-5"', "ckpt-5.index": "x",
        "run.json": "{}", "notes.txt": "mine", "300/notes.txt.bak/keep": "mine too?",
    })
    jax_files = engine_spec("jax").checkpoint_files(storage.list_tree(str(out / "checkpoints")))
    assert jax_files[0] == "200/commit_success.txt"  # the step stops counting first
    assert "300/notes.txt.bak/keep" in jax_files  # inside a step folder: Orbax's
    with caplog.at_level("INFO"):
        checkpoints.start_fresh(str(out), {"engine": "jax"})
    left = set(storage.list_tree(str(out / "checkpoints")))
    assert left == {"notes.txt", "run.json", layout.COMPLETE}, left
    assert "removing an earlier run's checkpoints from" in caplog.text


def jax_checkpoint_folder(out) -> None:
    """checkpoints/ as a JAX run leaves it: a committed step, run.json, the marker."""
    fake_checkpoints(out, {"20/commit_success.txt": "", "run.json": '{"engine": "jax"}'})
    folders.mark_complete(str(out / "checkpoints"), {})


def test_a_resume_across_engines_is_one_line_naming_both(tmp_path):
    out = tmp_path / "run"
    jax_checkpoint_folder(out)
    with pytest.raises(UserError, match=r"written by the jax engine, but train\.engine is "
                                        "tensorflow") as caught:
        checkpoints.check_start(str(out), resume=True, overwrite=False, engine="tensorflow")
    assert "train.engine: jax" in caught.value.hint
    checkpoints.check_start(str(out), resume=True, overwrite=False, engine="jax")
    # A fresh start over them is refused as over any earlier run's checkpoints.
    with pytest.raises(UserError, match="already holds checkpoints"):
        checkpoints.check_start(str(out), resume=False, overwrite=False, engine="tensorflow")


def test_the_stage_refuses_a_resume_across_engines_and_writes_nothing(tmp_path):
    from payload.config import parse_config
    from payload.training.inputs import check_inputs

    out = prepared_run(tmp_path, "gpt2")
    jax_checkpoint_folder(out)
    raw = training_config(out, "gpt2")  # engine: the default, tensorflow
    check_inputs(parse_config(raw))  # as the earlier run did: the shards' receipt is written
    before = sorted(storage.list_tree(str(out)))
    path = tmp_path / "tf.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert_user_error(run_stage("train", path, "--resume"), "jax engine", "tensorflow")
    assert sorted(storage.list_tree(str(out))) == before


@pytest.mark.slow  # two runs and a resume: 1-2 minutes on a shared 2-core machine
def test_killed_after_a_checkpoint_a_resume_ends_where_an_uninterrupted_run_ends(tmp_path):
    """SIGKILL mid-run, then --resume: the same final checkpoint, variable for variable (the
    data order continues exactly, dropout is keyed by the step)."""
    import signal
    import subprocess
    import time

    import numpy as np

    from tests.support.runners import payload_env
    from tests.support.runs import stage_command

    settings = dict(steps=30, checkpoint_every=10, eval_every=10, learning_rate=5e-3,
                    model={"dropout": 0.1})
    whole, cut = prepared_run(tmp_path / "whole", "gpt2"), prepared_run(tmp_path / "cut", "gpt2")
    runs = [subprocess.Popen(stage_command("train", jax_config(out, "gpt2", **settings)),
                             env=payload_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for out in (cut, whole)]
    victim, uninterrupted = runs
    try:
        first = cut / "checkpoints" / "10" / "commit_success.txt"
        deadline = time.monotonic() + 240
        while not first.exists() and victim.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        victim.send_signal(signal.SIGKILL)
        output = victim.communicate(timeout=60)[0]
        assert victim.returncode == -signal.SIGKILL, output[-3000:]  # killed before it finished
        output = uninterrupted.communicate(timeout=300)[0]
        assert uninterrupted.returncode == 0, output[-3000:]
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert engine_spec("jax").newest_step(str(cut)) in (10, 20)
    resumed = train(jax_config(cut, "gpt2", **settings), "--resume")
    assert "resuming from" in resumed.stdout
    folders = {p.name for p in (cut / "checkpoints").iterdir()}
    assert folders == {p.name for p in (whole / "checkpoints").iterdir()}, folders  # no leftovers
    wanted, got = (checkpoint_variables(out / "checkpoints" / "30") for out in (whole, cut))
    assert sorted(got) == sorted(wanted) and len(wanted) > 20
    for name, value in wanted.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    metrics = json.loads((cut / "metrics.json").read_text())
    assert [e["step"] for e in metrics["evals"]] == [0, 10, 20, 30]


def test_the_launchers_preflight_refuses_a_resume_across_engines(tmp_path):
    from payload.config import parse_config
    from payload.core.stages import Stage
    from payload.training.preflight import check_before_start

    out = tmp_path / "run"
    jax_checkpoint_folder(out)
    tensorflow = parse_config(training_config(out, "gpt2"))
    with pytest.raises(UserError, match="written by the jax engine"):
        check_before_start(tensorflow, stages={Stage.TRAIN}, resume=True, overwrite=False)
    jax = parse_config(training_config(out, "gpt2", engine="jax"))
    with pytest.raises(UserError) as caught:  # the engines agree; what is left: no shards
        check_before_start(jax, stages={Stage.TRAIN}, resume=True, overwrite=False)
    assert str(caught.value).startswith("no shard manifest at"), caught.value


def test_a_stopped_jax_job_names_the_step_of_its_newest_checkpoint(tmp_path):
    from payload.jobs.agent import stop_words

    out = tmp_path / "run"
    jax_checkpoint_folder(out)
    log = tmp_path / "worker.log"
    log.write_text('tpuctl-progress {"kind": "train", "step": 27, "steps": 40}\n')
    words = stop_words(tmp_path, {"log": str(log), "output_dir": str(out)}, "train")
    assert words.endswith("at step 27 (checkpoint of step 20)"), words
