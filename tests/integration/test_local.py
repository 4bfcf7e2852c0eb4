"""`tpuctl train --local` and friends, driven through the CLI with stand-in stages."""

import os
import re
import subprocess
import sys

from typer.testing import CliRunner

from launcher import job_control, records
from launcher.cli import app
from launcher.launch import STAGE_ENTRY_ENV
from tests.support.cloud import install_stub
from tests.support.configs import tiny_config
from tests.support.paths import REPO
from tests.support.waits import wait_for

runner = CliRunner()


def _live(config):
    from payload.config import load_config

    plan = records.current_job(records.state_dir(), load_config(config).name).plan()
    from launcher.executors import LocalExecutor

    return job_control.live_processes(LocalExecutor(plan.workers), plan)


def test_train_local_runs_every_stage_streams_and_keeps_logs(local_run, tmp_path, tpuctl_home):
    config = local_run()
    result = runner.invoke(app, ["train", "-c", str(config), "--local", "--workers", "2"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    assert (out / "tokenizer/tokenizer.json").exists()
    assert len(list((out / "data/train").glob("shard-*"))) == 2
    assert (out / "checkpoints/ckpt-0").exists() and (out / "checkpoints/ckpt-1").exists()
    assert (out / "model/config.json").exists() and (out / "metrics.json").exists()
    assert "worker-0 | step 3 loss" in result.output
    assert "worker-1 | prepare 1/2" in result.output
    for i in (0, 1):
        log = (out / f"logs/worker-{i}.log").read_text()
        assert f"worker-{i} finished" in log
        copies = list(tpuctl_home.glob(f"jobs/t/*/logs/worker-{i}.log"))
        assert copies and f"worker-{i} finished" in copies[0].read_text()
    # Each local worker has its own working directory.
    assert (tpuctl_home / "local/t/worker-1/.tpuctl/payload").is_dir()
    # A second run with nothing changed does no package work.
    again = runner.invoke(app, ["train", "-c", str(config), "--local", "--stages", "export"])
    assert again.exit_code == 0, again.output
    assert "all cached" in again.output


def test_failing_worker_stops_the_job_everywhere(local_run):
    config = local_run({"fail": {"prepare": 1}, "steps": {"train": 500}})
    result = runner.invoke(app, ["train", "-c", str(config), "--local"])
    assert result.exit_code == 1, result.output
    assert "worker-1 failed in prepare (exit 3)" in result.output
    assert "boom: prepare cannot go on" in result.output  # the tail of its log
    assert _live(config) == {0: 0, 1: 0}


def test_detached_job_can_be_watched_stopped_and_shown(local_run):
    config = local_run({"steps": {"train": 600}})
    started = runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"])
    assert started.exit_code == 0, started.output
    log = wait_for(lambda: _read_logs(config, "step 2 loss"), timeout_s=60)
    assert "step 2" in log
    status = runner.invoke(app, ["status", "-c", str(config)])
    assert status.exit_code == 0 and "running" in status.output and "train" in status.output
    snapshot = runner.invoke(app, ["logs", "-c", str(config), "--no-follow", "--worker", "1"])
    assert snapshot.exit_code == 0, snapshot.output
    assert "worker-1 | == tpuctl: train on worker-1 ==" in snapshot.output
    assert "worker-0 |" not in snapshot.output
    busy = runner.invoke(app, ["train", "-c", str(config), "--local"])
    assert "still running" in str(busy.exception)
    stopped = runner.invoke(app, ["stop", "-c", str(config)])
    assert stopped.exit_code == 0, stopped.output
    assert _live(config) == {0: 0, 1: 0}
    final = runner.invoke(app, ["status", "-c", str(config)])
    rows = [line for line in final.output.splitlines() if "worker-" in line]
    # The exit column says "stopped", not the code (the job's id may hold the digits 143).
    assert "stopped" in final.output and rows and not any(" 143 " in r for r in rows), final.output


def _read_logs(config, needle):
    result = runner.invoke(app, ["logs", "-c", str(config), "--no-follow"])
    return result.output if needle in result.output else ""


def test_ctrl_c_detaches_and_the_job_keeps_running(local_run, tmp_path, tpuctl_home):
    import signal

    config = local_run({"steps": {"train": 600}})
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launcher = subprocess.Popen([sys.executable, "-m", "launcher.cli", "train", "-c",
                                 str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, start_new_session=True)
    try:
        wait_for(lambda: any("step 2 loss" in p.read_text() for p in
                             tpuctl_home.glob("jobs/t/*/logs/worker-1.log")), timeout_s=60)
        launcher.send_signal(signal.SIGINT)
        output, _ = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, output
    assert "detached" in output and "tpuctl logs -c" in output and "tpuctl stop -c" in output
    assert all(n > 0 for n in _live(config).values())
    assert runner.invoke(app, ["stop", "-c", str(config)]).exit_code == 0
    assert _live(config) == {0: 0, 1: 0}


def test_ssh_command_runs_in_each_local_workers_folder(local_run, tpuctl_home):
    config = local_run()
    result = runner.invoke(app, ["ssh", "-c", str(config), "--", "pwd"])
    assert result.exit_code == 0, result.output
    assert f"worker-1 | {tpuctl_home / 'local/t/worker-1'}" in result.output


def _job_states(config):
    result = runner.invoke(app, ["status", "-c", str(config)])
    return result.output


def test_workers_stop_themselves_when_a_peer_fails_while_detached(local_run, tpuctl_home):
    config = local_run({"fail": {"train": 1}, "steps": {"train": 600}})
    started = runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"])
    assert started.exit_code == 0, started.output
    # Nobody is watching: worker 0 notices worker 1's failure itself and ends its training.
    wait_for(lambda: _job_states(config).count("exited") == 2, timeout_s=30, interval_s=0.3)
    assert _live(config) == {0: 0, 1: 0}
    log = next(tpuctl_home.glob("local/t/worker-0/.tpuctl/jobs/*/worker-0/worker.log")).read_text()
    assert "stopping, train failed on worker-1" in log


def test_workers_stop_themselves_when_a_peer_dies_while_detached(local_run, tpuctl_home,
                                                                 monkeypatch):
    import signal

    from launcher.launch import PEER_TIMEOUT_ENV

    monkeypatch.setenv(PEER_TIMEOUT_ENV, "3")
    config = local_run({"steps": {"train": 600}})
    started = runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"])
    assert started.exit_code == 0, started.output
    wait_for(lambda: "step 2 loss" in _read_logs(config, "step 2 loss"), timeout_s=60)
    pid_file = next(tpuctl_home.glob("local/t/worker-1/.tpuctl/jobs/*/worker-1/pid"))
    os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)  # worker 1's host "dies"
    wait_for(lambda: _live(config)[0] == 0, timeout_s=30, interval_s=0.3)
    log = next(tpuctl_home.glob("local/t/worker-0/.tpuctl/jobs/*/worker-0/worker.log")).read_text()
    assert "worker-1 stopped answering" in log
    # A launcher re-attaching now reports the vanished worker first.
    result = runner.invoke(app, ["logs", "-c", str(config)])
    assert result.exit_code == 1 and "worker-1's job vanished during train" in result.output


def test_local_flag_runs_any_config_as_local_workers(tmp_path, tpuctl_home, monkeypatch):
    import yaml

    monkeypatch.setenv(STAGE_ENTRY_ENV, str(install_stub(tmp_path / "stub")))
    config = tiny_config(tmp_path, output_dir=str(tmp_path / "out"), cluster={
        "provider": "gcp", "project": "my-project", "zone": "us-central2-b", "accelerator_type": "v4-32",
        "runtime_version": "tpu-ubuntu2204-base"})
    result = runner.invoke(app, ["train", "-c", str(config), "--local", "--workers", "3",
                                 "--stages", "tokenizer,prepare"])
    assert result.exit_code == 0, result.output
    assert len(list((tmp_path / "out/data/train").glob("shard-*-of-00003*"))) == 3
    shipped = next(tpuctl_home.glob("local/t/worker-2/.tpuctl/jobs/*/worker-2/config.yaml"))
    # The stages pick their strategy from this: local CPU workers, not the TPU of the file.
    assert yaml.safe_load(shipped.read_text())["cluster"]["provider"] == "local"
    assert yaml.safe_load(shipped.read_text())["cluster"]["workers"] == 3


def test_a_stopped_job_is_stopped_everywhere_it_is_shown(local_run):
    config = local_run({"steps": {"train": 600}})
    assert runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"]).exit_code == 0
    wait_for(lambda: _read_logs(config, "step 1 loss"), timeout_s=60)
    stopped = runner.invoke(app, ["stop", "-c", str(config)])
    assert stopped.exit_code == 0, stopped.output
    # Its last line is worker 0's last words: the step, and what --resume continues from.
    last = stopped.output.strip().splitlines()[-1]
    assert re.fullmatch(r"job \S+ stopped on every worker: stopped by `tpuctl stop` (at step \d+|"
                        r"during train) \((no checkpoint yet|checkpoint .*--resume` continues "
                        r"from it)\)?", last), last
    result = runner.invoke(app, ["logs", "-c", str(config)])
    assert result.exit_code == 0, result.output  # a stop is not a failure
    assert "stopped by `tpuctl stop`" in result.output.strip().splitlines()[-1]
    assert "failed" not in result.output
    listed = runner.invoke(app, ["jobs", "-c", str(config)])
    assert re.search(r"all +stopped *$", listed.output, re.M), listed.output
    again = runner.invoke(app, ["stop", "-c", str(config)])
    assert again.exit_code == 0, again.output
    assert again.output.strip().splitlines()[-1].endswith(
        "had already ended on every worker: nothing to stop"), again.output


def test_download_copies_a_finished_model_and_never_a_users_folder(local_run, tmp_path):
    config = local_run()
    target = tmp_path / "downloaded"
    result = runner.invoke(app, ["train", "-c", str(config), "--download", str(target)])
    assert result.exit_code == 0, result.output
    assert f"model/ copied to {target}" in result.output
    assert (target / "config.json").read_text() == "{}"
    assert (target / ".tpuctl-download").exists()
    again = runner.invoke(app, ["train", "-c", str(config), "--stages", "export",
                                "--download", str(target)])
    assert again.exit_code == 0, again.output  # an earlier download is replaced whole
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    refused = runner.invoke(app, ["train", "-c", str(config), "--download", str(mine)])
    assert "holds files tpuctl did not download" in str(refused.exception)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
