"""The train stage as real processes: a SIGKILLed run resumed, a user error in one line (two
workers in sync: tests/integration/test_train_exit.py)."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

pytest.importorskip("tensorflow")

from tests.support.configs import write_training_config
from tests.support.runners import payload_env
from tests.support.runs import prepared_run, run_stage, stage_command


def weights_digest(log: str) -> str:
    found = re.findall(r"finished at step (\d+); weights sha256 (\w+)", log)
    assert found, log[-2000:]
    return found[-1]


def test_a_killed_run_resumes_and_ends_at_exactly_train_steps(tmp_path):
    out = prepared_run(tmp_path, "gpt2")
    steps, every = 60, 15
    config = write_training_config(out, "gpt2", steps=steps, checkpoint_every=every, eval_every=30)
    proc = subprocess.Popen(
        stage_command("train", config),
        env=payload_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    index = out / "checkpoints" / "checkpoint"
    deadline = time.monotonic() + 180
    try:
        while not index.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    saved = int(re.search(r'model_checkpoint_path: "ckpt-(\d+)"', index.read_text()).group(1))
    assert saved < steps

    resumed = run_stage("train", config, "--resume", timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout and f"at step {saved} of {steps}" in resumed.stdout
    assert weights_digest(resumed.stdout)[0] == str(steps)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final"]["step"] == steps
    # The schedule continued: the last logged learning rate is the end of the linear decay.
    assert metrics["train"][-1]["learning_rate"] < 1e-4
    kept = sorted(int(p.stem.split("-")[1]) for p in (out / "checkpoints").glob("ckpt-*.index"))
    assert kept == [steps - 2 * every, steps - every, steps]  # the last keep_checkpoints=3

    again = run_stage("train", config, "--resume")
    assert again.returncode == 0 and f"already at step {steps}" in again.stdout


def test_a_user_error_is_one_line_and_exit_status_two(tmp_path):
    out = prepared_run(tmp_path, "gpt2")
    config = write_training_config(out, "gpt2")
    result = run_stage("train", config, "--resume")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if "no checkpoint" in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr
