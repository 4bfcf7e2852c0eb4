"""`tpuctl stop` on a real JAX job of two local workers: the stage ends on SIGTERM (JAX's
preemption service no longer holds it), the stop's last line and `tpuctl status` name the
newest checkpoint there is once the stage has ended, no checkpoint is written after it, and
`--resume` continues from that very one."""

from __future__ import annotations

import os
import re
import time

import pytest

pytest.importorskip("optax")
pytest.importorskip("tensorflow")

import yaml
from typer.testing import CliRunner

from launcher import records
from launcher.cli import app
from payload.config import load_config
from payload.training.checkpoints import newest_step
from tests.support.configs import tiny_config
from tests.support.waits import wait_for

runner = CliRunner()


def worker_log(config, worker: int):
    plan = records.current_job(records.state_dir(), load_config(config).name).plan()
    return (os.path.join(plan.workers[worker].base_dir, plan.paths[worker].job_dir,
                         "worker.log"))


def step_folders(out) -> set[int]:
    folder = out / "checkpoints"
    return {int(p.name) for p in folder.iterdir() if p.name.isdigit()} if folder.is_dir() else set()


def test_stop_names_the_checkpoint_resume_takes(tmp_path, tpuctl_home):
    out = tmp_path / "out"
    config = tiny_config(tmp_path / "run", name="stopped", output_dir=str(out),
                         cluster={"provider": "local", "workers": 2},
                         train={"engine": "jax", "steps": 100_000, "checkpoint_every": 3,
                                "eval_every": 100_000})
    started = runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"])
    assert started.exit_code == 0, started.output
    try:
        # A few checkpoints in, while they keep coming every few steps.
        wait_for(lambda: len(step_folders(out)) >= 2, timeout_s=240, interval_s=0.2)
    finally:
        stopped = runner.invoke(app, ["stop", "-c", str(config)])
    assert stopped.exit_code == 0, stopped.output
    with open(worker_log(config, 0), encoding="utf-8") as log:
        last = log.read().splitlines()[-1]
    found = re.fullmatch(r"== tpuctl: stopped by `tpuctl stop` at step (\d+) \(checkpoint of "
                         r"step (\d+)\) ==", last)
    assert found, last
    named = int(found.group(2))
    time.sleep(2)  # nothing of the job is left to write another one
    assert newest_step(str(out)) == named == max(step_folders(out)), (named, step_folders(out))
    assert int(found.group(1)) >= named
    status = runner.invoke(app, ["status", "-c", str(config)], env={"COLUMNS": "250"})
    assert f"(checkpoint of step {named})" in status.output, status.output

    # --resume continues from the named checkpoint (a few steps on, then it ends).
    raw = yaml.safe_load(config.read_text())
    raw["train"]["steps"] = named + 2
    config.write_text(yaml.safe_dump(raw))
    resumed = runner.invoke(app, ["train", "-c", str(config), "--local", "--resume",
                                  "--stages", "train"])
    assert resumed.exit_code == 0, resumed.output
    assert f"checkpoints/{named} at step {named} of {named + 2}" in resumed.output, (
        resumed.output)
