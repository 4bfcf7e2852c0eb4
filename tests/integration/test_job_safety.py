"""Never the wrong process, never a second run on one output_dir: process identity, per-worker
job folders, set-up locks, coordination ports, the run lock and the local log copies, with real
local worker processes and stand-in stages."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher import job_control, records, ship
from launcher.cli import app
from launcher.executors import LocalExecutor
from launcher.launch import PEER_TIMEOUT_ENV
from payload.core import storage
from payload.jobs import runlock
from tests.support.paths import REPO
from tests.support.runners import process_with_pid
from tests.support.waits import wait_for

runner = CliRunner()


@pytest.fixture
def strangers():
    """Unrelated processes a test starts; killed at the end whatever happened."""
    started = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def _plan(config):
    from payload.config import load_config

    return records.current_job(records.state_dir(), load_config(config).name).plan()


def _job_file(config, worker: int, name: str) -> Path:
    plan = _plan(config)
    return Path(plan.workers[worker].base_dir) / plan.paths[worker].job_dir / name


def _group(config, worker: int = 0) -> int:
    return int(_job_file(config, worker, "pid").read_text().split()[0])


def _live(config):
    plan = _plan(config)
    return job_control.live_processes(LocalExecutor(plan.workers), plan)


def _reuse(pgid: int, strangers: list) -> subprocess.Popen:
    stranger = process_with_pid(pgid, ["sleep", "300"])
    if stranger is None:
        pytest.skip("process ids cannot be steered here (needs root: ns_last_pid)")
    strangers.append(stranger)
    return stranger


def _cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


# -- 1. process identity -------------------------------------------------------------------

def test_stop_leaves_a_finished_jobs_reused_group_alone(local_run, strangers):
    config = local_run(workers=1)
    assert runner.invoke(app, ["train", "-c", str(config), "--local"]).exit_code == 0
    # The job is over; its group id goes to an unrelated process, as the kernel may do.
    stranger = _reuse(_group(config), strangers)
    result = runner.invoke(app, ["stop", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "worker-0: already ended (exit 0)" in result.output
    time.sleep(0.5)
    assert stranger.poll() is None, "tpuctl stop killed a process that was not the job's"


def test_logs_of_a_failed_job_leave_a_reused_group_alone(local_run, strangers):
    config = local_run({"fail": {"prepare": 0}}, workers=1)
    assert runner.invoke(app, ["train", "-c", str(config), "--local"]).exit_code == 1
    # A chatty stage: the log takes several reads, so fail-fast acts while they go on.
    with _job_file(config, 0, "worker.log").open("a") as log:
        log.writelines(f"noise {i}\n" for i in range(5000))
    stranger = _reuse(_group(config), strangers)
    # Fail-fast on re-attach stops "the job" everywhere: a job with an exit code never.
    result = runner.invoke(app, ["logs", "-c", str(config)])
    assert result.exit_code == 1 and "worker-0 failed in prepare (exit 3)" in result.output
    time.sleep(0.5)
    assert stranger.poll() is None, "tpuctl logs killed a process that was not the job's"


def test_a_killed_jobs_reused_group_is_not_taken_for_the_job(local_run, strangers):
    config = local_run({"steps": {"train": 600}}, workers=1)
    assert runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"]).exit_code == 0
    wait_for(lambda: "step 1 loss" in _job_file(config, 0, "worker.log").read_text(),
             timeout_s=60)
    pgid = _group(config)
    os.killpg(pgid, signal.SIGKILL)  # the job dies without an exit code
    stranger = _reuse(pgid, strangers)
    status = runner.invoke(app, ["status", "-c", str(config)])
    assert "gone" in status.output and "running" not in status.output, status.output
    # Not "still running": the next run starts, and takes over the dead job's run lock at once.
    # (A stage with nothing to read: the killed training left no checkpoint to export.)
    again = runner.invoke(app, ["train", "-c", str(config), "--local", "--stages", "tokenizer"])
    assert again.exit_code == 0, again.output
    assert "took over the run lock" in again.output and "not running any more" in again.output
    time.sleep(0.5)
    assert stranger.poll() is None


# -- 2. per-worker folders and set-up locks ------------------------------------------------

def test_workers_sharing_a_home_keep_their_own_job_files(local_run, tmp_path, monkeypatch):
    """Two workers in one folder (an NFS home, one host twice): each runs as itself, with its
    own pid, log and plan, and `stop` finds both."""
    import dataclasses

    from launcher.providers import local

    shared = tmp_path / "shared-home"
    real = local.local_workers
    monkeypatch.setattr(local, "local_workers", lambda name, count, ports: tuple(
        dataclasses.replace(w, base_dir=str(shared)) for w in real(name, count, ports)))
    monkeypatch.setenv(PEER_TIMEOUT_ENV, "10")  # a worker waiting for a twin fails in time
    config = local_run({"steps": {"train": 600}})
    started = runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"])
    assert started.exit_code == 0, started.output
    wait_for(lambda: all("step 2 loss" in _job_file(config, i, "worker.log").read_text()
                         for i in (0, 1)), timeout_s=60)
    for i in (0, 1):
        log = _job_file(config, i, "worker.log").read_text()
        assert f"prepare {i}/2" in log and f"prepare {1 - i}/2" not in log
    groups = {_group(config, 0), _group(config, 1)}
    assert len(groups) == 2 and _live(config)[0] > 0 and _live(config)[1] > 0
    assert runner.invoke(app, ["stop", "-c", str(config)]).exit_code == 0
    assert _live(config) == {0: 0, 1: 0}


def test_two_set_ups_of_one_environment_build_it_once(tmp_path):
    from launcher.plan import Worker, job_paths
    from launcher.worker_python import Environment, EnvMode

    home = tmp_path / "home"
    worker = Worker(index=0, host="localhost", address="localhost", coordination_port=0,
                    base_dir=str(home))
    env = Environment(mode=EnvMode.CREATE, python=".tpuctl/env/k/bin/python", key="k",
                      dir=".tpuctl/env/k", requirements=(),
                      setup=("sh", "-c", "echo building >> builds.log; sleep 1"))
    wheel, digest = ship.build_wheel(tmp_path / "wheels")
    executor = LocalExecutor((worker,))
    together = threading.Barrier(2)

    def set_up(job: str) -> dict:
        together.wait()
        return ship.ship_one(executor, worker, env, job_paths(job, digest, 0), wheel, None,
                             lambda w, m: None)

    results: list = [None, None]
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, set_up(f"job-{i}")))
               for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # One built, the other waited for it and reused it; the payload was unpacked once too.
    assert sorted(r["env"] for r in results) == [False, True], results
    assert sorted(r["payload"] for r in results) == [False, True], results
    assert (home / "builds.log").read_text() == "building\n"
    assert (home / ".tpuctl/env/k/.complete").exists()
    assert (home / f".tpuctl/payload/{digest}/payload/core/storage.py").exists()
    assert not list(home.glob(".tpuctl/jobs/*/worker-0/payload.whl"))


# -- 4. coordination ports ----------------------------------------------------------------

def _free_port_below_ephemeral_range() -> int:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in range(low - 1, 1024, -1):
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port below the ephemeral range (from {low})")


def test_a_taken_coordination_port_fails_the_job_with_one_line(local_run, monkeypatch):
    from launcher.providers import local

    config = local_run()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    # Worker 0's port lies below the kernel's ephemeral range, so no connection made meanwhile
    # (by anything on this machine) is given it; worker 1's stays taken.
    ports = [_free_port_below_ephemeral_range(), taken.getsockname()[1]]
    monkeypatch.setattr(local, "free_ports", lambda count: ports[:count])
    try:
        result = runner.invoke(app, ["train", "-c", str(config), "--local"])
    finally:
        taken.close()
    assert result.exit_code == 1, result.output
    assert "worker-1 failed in train" in result.output
    assert (f"worker-1 cannot train: its coordination port {ports[1]} is in use on this host"
            in result.output)
    assert _live(config) == {0: 0, 1: 0}


# -- 5. the run lock -----------------------------------------------------------------------

def test_two_runs_started_together_one_refuses(local_run, tmp_path, tpuctl_home):
    config = local_run()
    env = {"TPUCTL_HOME": str(tpuctl_home)}
    procs = [subprocess.Popen([sys.executable, "-m", "launcher.cli", "train", "-c", str(config),
                               "--local"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO), **env})
             for _ in range(2)]
    outcomes = [(p.wait(timeout=180), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 2], outcomes
    refused = next(err for code, _, err in outcomes if code == 2)
    lines = [line for line in refused.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in refused, refused
    assert f"output_dir {tmp_path / 'out'} is in use by job t-" in lines[0]
    assert f"(started from {os.environ.get('USER') or 'root'}@" in lines[0]
    assert f":{config}; last heartbeat" in lines[0]
    assert not (tmp_path / "out/.tpuctl/run.lock").exists(), "released when the job ended"


def test_a_running_job_on_one_worker_stops_a_second_run_on_two(local_run, tmp_path):
    config = local_run({"steps": {"train": 600}}, workers=1)
    first = runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"])
    assert first.exit_code == 0, first.output
    job = _plan(config).job_id
    wait_for(lambda: "step 1 loss" in _job_file(config, 0, "worker.log").read_text(),
             timeout_s=60)
    second = _cli("train", "-c", str(config), "--local", "--workers", "2",
                  env={"TPUCTL_HOME": os.environ["TPUCTL_HOME"]})
    assert second.returncode == 2, second.stderr
    assert second.stderr.count("\n") == 1 and f"is in use by job {job}" in second.stderr
    assert _plan(config).job_id == job, "the refused run recorded nothing"
    # The job keeps the lock beating, then `stop` lets it go.
    lock = tmp_path / "out/.tpuctl/run.lock"
    beats = json.loads(lock.read_text())["beats"]
    wait_for(lambda: json.loads(lock.read_text())["beats"] > beats, timeout_s=30)
    assert runner.invoke(app, ["stop", "-c", str(config)]).exit_code == 0
    assert not lock.exists()
    again = runner.invoke(app, ["train", "-c", str(config), "--local", "--workers", "2",
                                "--stages", "tokenizer"])
    assert again.exit_code == 0, again.output


def test_a_stale_run_lock_is_taken_over_with_a_message(local_run, tmp_path, monkeypatch):
    monkeypatch.setenv(PEER_TIMEOUT_ENV, "2")  # heartbeat every 0.5 s, stale after 2 s
    config = local_run({"steps": {"train": 600}})
    assert runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"]).exit_code == 0
    job = _plan(config).job_id
    wait_for(lambda: "step 1 loss" in _job_file(config, 0, "worker.log").read_text(),
             timeout_s=60)
    for i in (0, 1):  # both hosts die: nobody releases the lock
        os.killpg(_group(config, i), signal.SIGKILL)
    wait_for(lambda: _live(config) == {0: 0, 1: 0}, timeout_s=15)
    time.sleep(3)
    # Another worker count, so the launcher cannot see the old job ended: the heartbeat decides.
    result = runner.invoke(app, ["train", "-c", str(config), "--local", "--workers", "1",
                                 "--stages", "tokenizer"])
    assert result.exit_code == 0, result.output
    assert f"took over the run lock of {tmp_path / 'out'} from job {job}" in result.output
    assert "no heartbeat for" in result.output


def _taken_over_while_read(monkeypatch, out: str) -> None:
    """Another run takes the lock over right after the holder reads it (its heartbeat stalled
    past stale_after_s, say): the holder's next write comes after the takeover."""
    read = runlock._read

    def read_then_lose(path):
        seen = read(path)
        storage.write_bytes(path, json.dumps({"job": "b", "beat": 0, "beats": 0}).encode())
        return seen

    monkeypatch.setattr(runlock, "_read", read_then_lose)


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_run_lock_beat_and_release_never_clobber_a_takeover(tmp_path, monkeypatch, where,
                                                            request):
    out = str(tmp_path / "out")
    if where == "gcs":
        sandbox = request.getfixturevalue("gcs_sandbox")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", sandbox.url)
        monkeypatch.setattr(storage, "_client", None)
        sandbox.make_bucket("takeover")
        out = "gs://takeover/run"
    assert runlock.take(out, {"job": "a", "from": "here", "stale_after_s": 10}) == ""
    with monkeypatch.context() as patch:
        _taken_over_while_read(patch, out)
        assert runlock.beat(out, "a") is False
    assert json.loads(storage.read_bytes(runlock.lock_path(out)))["job"] == "b"
    storage.write_bytes(runlock.lock_path(out), json.dumps({"job": "a", "beat": 0}).encode())
    with monkeypatch.context() as patch:
        _taken_over_while_read(patch, out)
        assert runlock.release(out, "a") is False
    assert json.loads(storage.read_bytes(runlock.lock_path(out)))["job"] == "b"
    if where == "gcs":
        monkeypatch.setattr(storage, "_client", None)


def test_create_exclusive_has_one_winner_on_gcs(gcs_sandbox, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_sandbox.url)
    monkeypatch.setattr(storage, "_client", None)
    gcs_sandbox.make_bucket("locks")
    path = "gs://locks/run/.tpuctl/run.lock"
    together = threading.Barrier(4)
    wins = []

    def race(i):
        together.wait()
        wins.append(storage.create_exclusive(path, f"writer {i}".encode()))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 3 + [True]
    held = storage.read_bytes(path)
    assert storage.create_exclusive(path, b"new", replacing=b"other") is False
    assert storage.create_exclusive(path, b"new", replacing=held) is True
    assert storage.read_bytes(path) == b"new"
    assert storage.create_exclusive(path, b"newer", replacing=held) is False
    monkeypatch.setattr(storage, "_client", None)


# -- 6. local log copies -------------------------------------------------------------------

def test_logs_never_shrink_the_local_copy(local_run, tpuctl_home):
    config = local_run(workers=1)
    assert runner.invoke(app, ["train", "-c", str(config), "--local"]).exit_code == 0
    copy = next(tpuctl_home.glob("jobs/t/*/logs/worker-0.log"))
    worker_log = _job_file(config, 0, "worker.log")
    kept = copy.read_text()
    assert kept == worker_log.read_text() and "worker-0 finished" in kept
    # Re-attaching twice neither duplicates nor rewrites the copy.
    for _ in range(2):
        assert runner.invoke(app, ["logs", "-c", str(config), "--no-follow"]).exit_code == 0
    assert copy.read_text() == kept
    # The workers are gone (a deleted VM, a wiped home): the copy is all that is left.
    import shutil

    shutil.rmtree(worker_log.parent)
    runner.invoke(app, ["logs", "-c", str(config), "--no-follow"])
    assert copy.read_text() == kept


# -- 8 (a crash, not a bad input). ---------------------------------------------------------

def test_status_shows_a_log_line_that_looks_like_markup(local_run):
    config = local_run(workers=1)
    assert runner.invoke(app, ["train", "-c", str(config), "--local"]).exit_code == 0
    line = "[/job:worker/replica:0/task:0/device:CPU:0] [bold]x[/] done"
    with _job_file(config, 0, "worker.log").open("a") as log:
        log.write(line + "\n")
    result = _cli("status", "-c", str(config), env={"COLUMNS": "250"})
    assert result.returncode == 0, result.stderr
    assert "[/job:worker/replica:0/task:0/device:CPU:0]" in result.stdout


# -- 9. what reaches the terminal ----------------------------------------------------------

# What a corpus key or a library may carry: a window title (OSC), clear screen, colours.
HOSTILE = "title \x1b]0;pwned\x07 clear \x1b[2J\x1b[H colour \x1b[31mred\x1b[0m end"
ESCAPED = "title \\x1b]0;pwned\\x07 clear \\x1b[2J\\x1b[H colour \\x1b[31mred\\x1b[0m end"


def test_control_bytes_from_workers_never_reach_the_terminal(local_run, tmp_path):
    config = local_run({"print": {"train": [HOSTILE]}, "fail": {"train": 0}}, workers=1)
    env = {"COLUMNS": "250", "NO_COLOR": "1"}
    seen = {}
    seen["train"] = _cli("train", "-c", str(config), "--local", env=env)  # live view + tail
    assert seen["train"].returncode == 1 and ESCAPED in seen["train"].stderr
    seen["logs"] = _cli("logs", "-c", str(config), env=env)
    with _job_file(config, 0, "worker.log").open("a") as log:
        log.write(HOSTILE + "\n")  # the last line: what status shows of the worker
    seen["status"] = _cli("status", "-c", str(config), env=env)
    seen["jobs"] = _cli("jobs", "-c", str(config), "--check", env=env)
    for command, result in seen.items():
        out = result.stdout + result.stderr
        assert "\x1b" not in out and "\x07" not in out, f"{command}: {out!r}"
    assert ESCAPED in seen["train"].stdout and ESCAPED in seen["logs"].stdout
    assert "\\x1b]0;pwned" in seen["status"].stdout
    # Into a file, --raw keeps the worker's bytes as they are.
    raw = _cli("logs", "-c", str(config), "--raw", env=env)
    assert "\x1b]0;pwned" in raw.stdout


# -- 10. secrets ---------------------------------------------------------------------------

def test_a_hub_token_in_the_users_environment_reaches_no_process_of_the_job(local_run):
    token = "hf_tpuctlNotForStages7c1e"
    names = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]
    config = local_run({"report_env": names, "steps": {"train": 600}}, workers=1)
    env = {name: token for name in names}
    started = _cli("train", "-c", str(config), "--local", "--detach", env=env)
    assert started.returncode == 0, started.stderr
    log = _job_file(config, 0, "worker.log")
    wait_for(lambda: "step 1 loss" in log.read_text(), timeout_s=60)
    try:
        group = _group(config)
        members = subprocess.run(["pgrep", "-g", str(group)], capture_output=True,
                                 text=True).stdout.split()
        assert len(members) >= 3  # the job's shell, the agent, the train stage
        holders = [pid for pid in members
                   if token.encode() in Path(f"/proc/{pid}/environ").read_bytes()]
        assert holders == [], "the Hub token is in the environment of a job's process"
    finally:
        assert runner.invoke(app, ["stop", "-c", str(config)]).exit_code == 0
    text = log.read_text()
    assert "train sees HF_TOKEN=(unset)" in text and token not in text


# -- 11. a job that lost its agent or its lock; a stop that says where it stopped --------------

def _agent_pid(config, worker: int = 0) -> int:
    members = subprocess.run(["pgrep", "-g", str(_group(config, worker))], capture_output=True,
                             text=True).stdout.split()
    # The agent's own argv (`python -m payload.jobs.agent PLAN`), not the shell whose script names it.
    return next(int(pid) for pid in members
                if b"\0-m\0payload.jobs.agent\0" in Path(f"/proc/{pid}/cmdline").read_bytes())


@pytest.fixture
def long_jobs():
    """Configs of jobs a test starts; stopped at the end (identity checked) whatever happened."""
    started = []
    yield started
    for config in started:
        runner.invoke(app, ["stop", "-c", str(config)])


def _start_long_job(config, long_jobs: list) -> Path:
    long_jobs.append(config)
    assert runner.invoke(app, ["train", "-c", str(config), "--local", "--detach"]).exit_code == 0
    log = _job_file(config, 0, "worker.log")
    wait_for(lambda: "step 1 loss" in log.read_text(), timeout_s=60)
    return log


def test_a_stage_whose_agent_was_killed_stops_itself(local_run, long_jobs):
    config = local_run({"steps": {"train": 600}}, workers=1)
    _start_long_job(config, long_jobs)
    os.kill(_agent_pid(config), signal.SIGKILL)
    # Nobody watches the stage any more, nor beats the run lock: it must not train on alone.
    wait_for(lambda: _live(config) == {0: 0}, timeout_s=20)
    assert _live(config) == {0: 0}, "the train stage kept running after its agent died"


def test_stop_ends_a_job_whose_exit_code_is_written_while_it_runs(local_run, long_jobs):
    config = local_run({"steps": {"train": 600}}, workers=1)
    _start_long_job(config, long_jobs)
    # What the job's shell writes when its agent is killed; the stage may still run.
    _job_file(config, 0, "rc").write_text("137\n")
    status = _cli("status", "-c", str(config), env={"COLUMNS": "250"})
    assert "running" in status.stdout, status.stdout
    result = runner.invoke(app, ["stop", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert "worker-0: stopped" in result.output and "already ended" not in result.output
    assert _live(config) == {0: 0}


def test_a_job_whose_run_lock_was_taken_over_stops_itself(local_run, long_jobs, tmp_path, monkeypatch):
    monkeypatch.setenv(PEER_TIMEOUT_ENV, "2")  # a heartbeat every 0.5 s
    config = local_run({"steps": {"train": 600}})
    log = _start_long_job(config, long_jobs)
    lock = tmp_path / "out/.tpuctl/run.lock"
    taker = {"job": "another-run", "from": "elsewhere", "beat": time.time(), "beats": 0,
             "stale_after_s": 120}
    lock.write_text(json.dumps(taker))  # another run took output_dir over
    wait_for(lambda: _live(config) == {0: 0, 1: 0}, timeout_s=30)
    assert _live(config) == {0: 0, 1: 0}, "the job kept writing to a taken-over output_dir"
    assert "is not this job's any more" in log.read_text()
    assert json.loads(lock.read_text())["job"] == "another-run"  # its lock, left alone


def test_status_after_stop_says_who_stopped_it_at_which_step(local_run, long_jobs):
    config = local_run({"steps": {"train": 600}, "checkpoint_every": 5})
    log = _start_long_job(config, long_jobs)
    wait_for(lambda: "step 12 loss" in log.read_text(), timeout_s=60)
    stopped = _cli("stop", "-c", str(config))
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("stopping job ") and "SIGKILL" in stopped.stdout.splitlines()[0]
    text = log.read_text()
    last_step = [line for line in text.splitlines() if line.startswith("step ")][-1].split()[1]
    index = (Path(_plan(config).output_dir) / "checkpoints" / "checkpoint").read_text()
    checkpoint = index.split('"')[1]
    words = f"stopped by `tpuctl stop` at step {last_step} (checkpoint {checkpoint})"
    assert words in text.splitlines()[-1]
    # The stop's own last line names it too, with the command that continues from it.
    assert stopped.stdout.splitlines()[-1].endswith(
        f"stopped on every worker: {words}; `tpuctl train -c {config} --resume` continues "
        "from it"), stopped.stdout
    status = _cli("status", "-c", str(config), env={"COLUMNS": "250"})
    assert words in status.stdout, status.stdout
    assert "143" not in status.stdout and "exited" not in status.stdout


# -- 12. limits bind the whole job ---------------------------------------------------------

def test_the_time_limit_ends_a_job_hung_before_training(local_run, long_jobs):
    # 0.0003 h is about 1 s: prepare hangs on worker 0 far past it.
    config = local_run({"hang": {"prepare": 0}}, train={"max_hours": 0.0003})
    long_jobs.append(config)
    try:
        result = _cli("train", "-c", str(config), "--local", timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the job ran on past train.max_hours (prepare hung)")
    assert result.returncode == 1, result.stderr
    # Every agent holds the job to the limit: whichever reaches it first (the hung worker 0, or
    # worker 1 waiting for it after its own prepare) ends the job and is named; on a busy
    # machine the second may pass before the tokenizer stage has ended.
    assert re.search(r"worker-[01]: the run's limit \(train\.max_hours / max_cost\) ended the "
                     r"job during (tokenizer|prepare)", result.stderr), result.stderr
    assert "stopping, train.max_hours 0.0003 reached" in result.stderr
    assert _live(config) == {0: 0, 1: 0}


def test_a_slow_stop_says_whom_it_waits_for(local_run, long_jobs):
    config = local_run({"steps": {"train": 600}, "ignore_term": ["train"]}, workers=1)
    _start_long_job(config, long_jobs)
    stopped = _cli("stop", "-c", str(config))  # SIGKILL ends the stage after the grace period
    assert stopped.returncode == 0, stopped.stderr
    lines = stopped.stdout.splitlines()
    assert "waiting for worker-0 (their processes are ending)" in lines
    assert lines.index("waiting for worker-0 (their processes are ending)") < lines.index(
        "worker-0: stopped")
    assert _live(config) == {0: 0}
