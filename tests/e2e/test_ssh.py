"""`tpuctl` against real sshd workers (testbed/fleet.py): strict host keys, fail-fast, no leftovers."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher import job_control, records
from launcher.cli import app
from launcher.launch import STAGE_ENTRY_ENV
from tests.support.cloud import install_stub
from tests.support.configs import tiny_config
from tests.support.paths import REPO
from tests.support.waits import wait_for

runner = CliRunner()
PYTHON = sys.executable


@pytest.fixture
def ssh_run(fleet, tmp_path, tpuctl_home, monkeypatch, request):
    """A run folder on the fleet's shared mount, and a config for the SSH workers."""
    shared = fleet.shared / request.node.name[:40]
    shared.mkdir()

    def make(behaviour=None, *, hosts=None, output_dir=None, **cluster):
        stub = install_stub(shared / "stub", behaviour)
        monkeypatch.setenv(STAGE_ENTRY_ENV, str(stub))
        spec = {"provider": "ssh", "hosts": hosts or fleet.hosts, "user": "root",
                "identity_file": fleet.identity_file, "known_hosts": fleet.known_hosts,
                "port": fleet.port, "python": PYTHON, **cluster}
        # A batch that 1, 2 or 3 workers (one replica each) can split: the launcher refuses others.
        return tiny_config(shared, output_dir=output_dir or str(shared / "out"), cluster=spec,
                           name="fleet", train={"batch_size": 6})

    yield make
    _assert_nothing_left(fleet)
    shutil.rmtree(shared, ignore_errors=True)


def _assert_nothing_left(fleet):
    """No process but sshd on any worker (zombies waiting for a late reaper excepted)."""
    def leftovers():
        found = {i: fleet.job_processes(i) for i in range(fleet.size)}
        return {i: procs for i, procs in found.items() if procs}

    deadline = time.monotonic() + 15
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftovers()


def _launch(config, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.Popen([PYTHON, "-m", "launcher.cli", "train", "-c", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=REPO, start_new_session=True)


def _log_has(worker, needle):
    """Whether the launcher's copy of a worker's log has `needle` yet."""
    logs = Path(os.environ["TPUCTL_HOME"]).glob(f"jobs/fleet/*/logs/worker-{worker}.log")
    return any(needle in p.read_text() for p in logs)


def test_train_on_three_ssh_workers(ssh_run, fleet, tpuctl_home):
    config = ssh_run()
    result = runner.invoke(app, ["train", "-c", str(config)])
    assert result.exit_code == 0, result.output
    out = Path(config).parent / "out"
    assert len(list((out / "data/train").glob("shard-*-of-00003.tfrecord"))) == 3
    # Each worker's mark (the stand-in train's), beside the checkpoint worker 0 leaves.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()
                  if re.fullmatch(r"ckpt-\d+", p.name)) == ["ckpt-0", "ckpt-1", "ckpt-2"]
    assert (out / "model/config.json").exists()
    # Every worker ran on its own host, TF_CONFIG naming all three (ports drawn per job).
    plan = records.current_job(records.state_dir(), "fleet").plan()
    for i, host in enumerate(fleet.hosts):
        assert f"worker-{i} | prepare {i}/3 on worker-{i}" in result.output
        assert f"{host}:{plan.workers[i].coordination_port}" in result.output
        log = (out / f"logs/worker-{i}.log").read_text()
        assert f"worker-{i} finished" in log
        assert list(tpuctl_home.glob(f"jobs/fleet/*/logs/worker-{i}.log"))
        # The payload went into each worker's own home, not a shared one.
        assert list((fleet.worker_dir(i) / ".tpuctl/payload").iterdir())
    again = runner.invoke(app, ["train", "-c", str(config), "--stages", "export"])
    assert again.exit_code == 0 and "all cached" in again.output, again.output


def test_failing_stage_stops_every_worker(ssh_run):
    config = ssh_run({"fail": {"train": 2}, "steps": {"train": 600}})
    result = runner.invoke(app, ["train", "-c", str(config)])
    assert result.exit_code == 1, result.output
    assert "worker-2 failed in train (exit 3)" in result.output
    assert "boom: train cannot go on" in result.output


def test_worker_killed_mid_training_stops_the_others(ssh_run, fleet):
    config = ssh_run({"steps": {"train": 600}})
    launcher = _launch(config)
    try:
        wait_for(lambda: any("stub_stages.py train" in p for p in fleet.job_processes(1)),
                 timeout_s=60)
        victim = next(int(p.split(":")[0]) for p in fleet.job_processes(1)
                      if "stub_stages.py train" in p)
        os.kill(victim, signal.SIGKILL)
        output, _ = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 1, output
    assert "worker-1 failed in train (exit -9)" in output or "worker-1 failed in train" in output


def test_stop_and_logs_after_the_launcher_was_killed(ssh_run, fleet, tpuctl_home):
    config = ssh_run({"steps": {"train": 600}})
    launcher = _launch(config)
    wait_for(lambda: _log_has(2, "step 3 loss"), timeout_s=60)
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait()
    time.sleep(0.5)
    assert all(fleet.job_processes(i) for i in range(fleet.size))  # still training
    logs = runner.invoke(app, ["logs", "-c", str(config), "--no-follow"])
    assert logs.exit_code == 0, logs.output
    assert "worker-2 | step 3 loss" in logs.output
    status = runner.invoke(app, ["status", "-c", str(config)])
    assert status.output.count("running") == 3, status.output
    stopped = runner.invoke(app, ["stop", "-c", str(config)])
    assert stopped.exit_code == 0, stopped.output
    assert "stopped on every worker" in stopped.output


def test_host_key_mismatch_is_refused(ssh_run, fleet, tmp_path):
    wrong = tmp_path / "known_hosts"
    lines = Path(fleet.known_hosts).read_text().splitlines()
    # Worker 1's entry carries worker 0's key.
    lines[1] = lines[1].split()[0] + " " + fleet.host_keys[0]
    wrong.write_text("\n".join(lines) + "\n")
    config = ssh_run(known_hosts=str(wrong))
    result = runner.invoke(app, ["train", "-c", str(config)])
    assert "worker-1" in str(result.exception)
    assert "host key does not match" in str(result.exception)


def test_missing_known_hosts_entry_is_refused(ssh_run, fleet, tmp_path):
    partial = tmp_path / "known_hosts"
    partial.write_text(Path(fleet.known_hosts).read_text().splitlines()[0] + "\n")
    config = ssh_run(known_hosts=str(partial))
    result = runner.invoke(app, ["train", "-c", str(config)])
    assert "has no entry in" in str(result.exception)


@pytest.mark.parametrize("problem", ["wrong-user", "wrong-key", "unreachable", "no-known-hosts"])
def test_bad_connection_settings_are_one_line(ssh_run, fleet, tmp_path, problem):
    cluster = {}
    hosts = None
    if problem == "wrong-user":
        cluster["user"] = "nobody"
    elif problem == "wrong-key":
        key = tmp_path / "other_key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                       check=True)
        cluster["identity_file"] = str(key)
    elif problem == "unreachable":
        # An address on the fleet's network where nothing listens.
        hosts = [fleet.hosts[0].rsplit(".", 1)[0] + ".1"]
        kh = tmp_path / "kh"
        kh.write_text(f"{hosts[0]} {fleet.host_keys[0]}\n")
        cluster["known_hosts"] = str(kh)
    else:
        cluster["known_hosts"] = str(tmp_path / "absent")
    config = ssh_run(hosts=hosts, **cluster)
    result = subprocess.run([PYTHON, "-m", "launcher.cli", "train", "-c", str(config)],
                            capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    expected = {"wrong-user": "login refused for user 'nobody'",
                "wrong-key": "login refused", "unreachable": "is not answering",
                "no-known-hosts": "cluster.known_hosts: no file"}[problem]
    assert expected in result.stderr


def test_output_dir_not_shared_is_refused(ssh_run):
    config = ssh_run(output_dir="/tmp/not-shared/out")  # /tmp is private to each worker
    result = runner.invoke(app, ["train", "-c", str(config)])
    assert "is not shared" in str(result.exception)
    assert "worker-1, worker-2 cannot see" in str(result.exception)


def test_existing_python_missing_versions_is_refused(ssh_run, fleet, monkeypatch):
    from launcher import ship

    monkeypatch.setattr(ship, "worker_requirements", lambda root=None, extras=(): ("pyyaml==0.0.1",))
    config = ssh_run()
    result = runner.invoke(app, ["train", "-c", str(config)])
    assert "pyyaml is 6" in str(result.exception) and "needs 0.0.1" in str(result.exception)


def test_live_processes_counts_the_job(ssh_run, fleet):
    config = ssh_run({"steps": {"train": 600}})
    started = runner.invoke(app, ["train", "-c", str(config), "--detach"])
    assert started.exit_code == 0, started.output
    from launcher.executors import SshExecutor, SshSettings

    plan = records.current_job(records.state_dir(), "fleet").plan()
    with SshExecutor(plan.workers, SshSettings(user="root", known_hosts=fleet.known_hosts,
                                                identity_file=fleet.identity_file)) as ex:
        assert all(n >= 2 for n in job_control.live_processes(ex, plan).values())
        assert set(job_control.stop(ex, plan).values()) == {"stopped"}
        assert job_control.live_processes(ex, plan) == {0: 0, 1: 0, 2: 0}


def _tiny_wheel(folder: Path) -> Path:
    """A one-module wheel, standing in for a wheelhouse of the real dependencies."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tinydep-1.0-py3-none-any.whl"
    info = "tinydep-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("tinydep/__init__.py", "VALUE = 42\n")
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tinydep\n"
                         "Version: 1.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                         "Root-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


def test_wheelhouse_environment_is_created_once_and_cached(fleet, tmp_path):
    from launcher import ship
    from launcher.executors import SshExecutor, SshSettings
    from launcher.plan import Worker, job_paths
    from launcher.worker_python import EnvMode, plan_environment

    house = tmp_path / "wheels"
    _tiny_wheel(house)
    digest = ship.wheelhouse_digest(str(house))
    env = plan_environment(python=None, wheelhouse_digest=digest,
                           requirements=("tinydep==1.0",), tpu=False)
    assert env.mode is EnvMode.WHEELHOUSE
    wheel, payload_digest = ship.build_wheel(tmp_path / "build")
    workers = tuple(Worker(index=i, host=h, address=h, coordination_port=0, ssh_port=fleet.port)
                    for i, h in enumerate(fleet.hosts[:2]))
    paths = tuple(job_paths("wheelhouse-test", payload_digest, w.index) for w in workers)
    settings = SshSettings(user="root", known_hosts=fleet.known_hosts,
                           identity_file=fleet.identity_file)
    with SshExecutor(workers, settings) as executor:
        first = ship.ship(executor, workers, env, paths, wheel, wheelhouse=(str(house), digest))
        # (The payload itself may be there from earlier tests in this session.)
        assert all(d["env"] and d["wheelhouse"] for d in first)
        check = executor.run(workers[1], f"env PYTHONPATH={paths[1].payload_dir} {env.python} -c "
                             "'import tinydep, payload.core.errors; print(tinydep.VALUE)'")
        assert check.stdout.strip() == "42", check.stderr
        again = ship.ship(executor, workers, env, paths, wheel, wheelhouse=(str(house), digest))
        assert again == [{"payload": False, "env": False, "wheelhouse": False}] * 2


def test_ssh_runs_a_command_on_every_worker(ssh_run, fleet):
    config = ssh_run()
    result = runner.invoke(app, ["ssh", "-c", str(config), "--", "hostname"])
    assert result.exit_code == 0, result.output
    for i in range(fleet.size):
        assert f"worker-{i} | worker-{i}" in result.output
    one = runner.invoke(app, ["ssh", "-c", str(config), "--worker", "2", "--", "sh", "-c",
                              "echo $((40 + 2)); exit 3"])
    assert one.exit_code == 1 and "worker-2 | 42" in one.output


def test_worker_host_going_away_stops_the_others(ssh_run, fleet):
    config = ssh_run({"steps": {"train": 600}})
    launcher = _launch(config)
    try:
        wait_for(lambda: any("stub_stages.py train" in p for p in fleet.job_processes(2)),
                 timeout_s=60)
        fleet.power_off(2)
        output, _ = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
        fleet.power_on(2)
    assert launcher.returncode == 1, output
    assert "worker-2 (" in output and "is not answering" in output, output
    assert "the job was stopped on every worker" in output


def test_a_worker_failing_to_start_leaves_none_running(ssh_run, fleet):
    config = ssh_run({"steps": {"train": 600}})
    blocker = fleet.worker_dir(2) / ".tpuctl" / "jobs"
    saved = blocker.with_name("jobs.saved")
    blocker.parent.mkdir(parents=True, exist_ok=True)
    if blocker.exists():
        blocker.rename(saved)
    blocker.write_text("a file where the job folders go")
    try:
        result = runner.invoke(app, ["train", "-c", str(config)])
    finally:
        blocker.unlink()
        if saved.exists():
            saved.rename(blocker)
    assert "worker-2: cannot make the job folder" in str(result.exception)
    # The fixture checks that workers 0 and 1, which did start, were stopped.


def test_stop_reaches_the_jobs_own_workers_after_the_config_changed(ssh_run, fleet):
    """A job is reopened from its record: with the config now naming one other host and a
    known_hosts file that does not exist, `stop` still stops the job on the three workers it
    runs on, and `status` and `logs` still show them."""
    import yaml

    config = ssh_run({"steps": {"train": 600}})
    started = runner.invoke(app, ["train", "-c", str(config), "--detach"])
    assert started.exit_code == 0, started.output
    wait_for(lambda: all(any("stub_stages.py train" in p for p in fleet.job_processes(i))
                         for i in range(fleet.size)), timeout_s=60)
    raw = yaml.safe_load(Path(config).read_text())
    raw["cluster"]["hosts"] = ["192.0.2.1"]  # TEST-NET: nothing answers there
    raw["cluster"]["known_hosts"] = str(Path(config).parent / "no-such-known-hosts")
    Path(config).write_text(yaml.safe_dump(raw))
    status = runner.invoke(app, ["status", "-c", str(config)])
    assert status.exit_code == 0, status.output
    assert status.output.count("running") == 3, status.output
    stopped = runner.invoke(app, ["stop", "-c", str(config)])
    assert stopped.exit_code == 0, stopped.output
    assert "stopped on every worker" in stopped.output
    for i in range(fleet.size):
        wait_for(lambda i=i: not fleet.job_processes(i), timeout_s=15)


def test_a_folder_of_the_users_is_refused_before_anything_is_written(ssh_run, fleet):
    """On SSH workers the launcher writes its shared-output marker and run lock first: worker 0
    checks the folder is tpuctl's (or new, or empty) before either, so a folder of the user's
    gets nothing at all."""
    shared = fleet.shared / "users-own"
    shared.mkdir(exist_ok=True)
    (shared / "thesis.tex").write_text("mine")
    config = ssh_run(output_dir=str(shared))
    result = runner.invoke(app, ["train", "-c", str(config)])
    assert "already holds files that tpuctl did not write" in str(result.exception), (
        result.output)
    assert sorted(p.name for p in shared.iterdir()) == ["thesis.tex"]
