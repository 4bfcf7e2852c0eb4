"""The pure plan: which steps run where, with which commands; quoting that nothing can break."""

import contextlib
import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from launcher import job_control
from launcher.plan import (
    LIBTPU_LOCKFILE,
    build_plan,
    free_tpu_script,
)
from launcher.worker_python import plan_environment
from payload.cloud import stand_ins
from payload.core.errors import UserError
from payload.jobs.groups import record_group
from payload.training.strategy import CPU, Hardware
from tests.support.launch_plans import ENV, GCP, config, workers
from tests.support.waits import wait_for


def _holder(cwd, device, *, record=None, ended=False):
    """A process holding `device` open. With `record` (a job folder under cwd), its group is
    recorded as tpuctl records a job's (payload.jobs.groups); with `ended` too, the job's leader
    wrote its exit code and left while the holder lives on, as a crashed TF process does."""
    if record is None:
        proc = subprocess.Popen(["sh", "-c", f"exec 3<{device}; exec sleep 60"], cwd=cwd,
                                start_new_session=True)
        wait_for(lambda: any(os.readlink(f"/proc/{proc.pid}/fd/{fd}") == str(device)
                             for fd in os.listdir(f"/proc/{proc.pid}/fd")))
        return proc, proc.pid
    folder = cwd / record
    folder.mkdir(parents=True)
    body = (f"sleep 60 3<{device} & echo 0 > {folder}/rc" if ended
            else f"exec 3<{device}; sleep 60")
    proc = subprocess.Popen(["setsid", "sh", "-c",
                             f"{record_group(str(folder / 'pid'), record)}; {body}"], cwd=cwd)
    wait_for(lambda: (folder / "pid").exists() and (not ended or (folder / "rc").exists()))
    holders = wait_for(lambda: [int(p) for p in os.listdir("/proc") if p.isdigit()
                                and _holds(int(p), device) and _group(int(p)) == proc.pid])
    return proc, holders[0]


def _group(pid):
    with contextlib.suppress(OSError):
        return os.getpgid(pid)
    return None


def _holds(pid, device):
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(device)
                   for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def tpu_box(tmp_path):
    """A stand-in TPU (device file and libtpu lock file) and a way to run the script."""
    device, lock = tmp_path / "accel0", tmp_path / "libtpu_lockfile"
    device.write_text("")
    lock.write_text("")
    started = []

    def free():
        return subprocess.run(["sh", "-c", free_tpu_script((f"{tmp_path}/accel*",), str(lock))],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    yield device, lock, free, started
    for proc in started:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_free_tpu_stops_what_an_ended_tpuctl_job_left(tmp_path, tpu_box):
    device, lock, free, started = tpu_box
    proc, holder = _holder(tmp_path, device, record=".tpuctl/jobs/old-1/worker-0", ended=True)
    started.append(proc)
    out = free()
    assert out.returncode == 0, out.stderr
    assert (f"stopping pid {holder}, left holding {device} by tpuctl job "
            ".tpuctl/jobs/old-1/worker-0") in out.stdout
    wait_for(lambda: not _alive(holder), timeout_s=5)
    assert not lock.exists()


def test_free_tpu_names_other_holders_and_signals_nothing(tmp_path, tpu_box):
    device, lock, free, started = tpu_box
    other, other_pid = _holder(tmp_path, device)
    started.append(other)
    running, running_pid = _holder(tmp_path, device, record=".tpuctl/jobs/live-1/worker-0")
    started.append(running)
    # A pid file naming `other`'s group with another start time: the id was reused, so the
    # recorded job is not what holds the device now.
    reused = tmp_path / ".tpuctl/jobs/gone-1/worker-0"
    reused.mkdir(parents=True)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (reused / "pid").write_text(f"{other_pid} 1 {boot} .tpuctl/jobs/gone-1/worker-0\n")
    (reused / "rc").write_text("0\n")
    out = free()
    assert out.returncode == 1
    line = out.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert f"pid {other_pid} (sleep 60) holding {device}" in line
    assert f"pid {running_pid} of tpuctl job .tpuctl/jobs/live-1/worker-0 (still running" in line
    assert "stopping" not in out.stdout
    assert _alive(other_pid) and _alive(running_pid)
    assert lock.exists(), "the lock of a live holder stays"


@pytest.mark.parametrize("held", ["vfio/0", "libtpu_lockfile"])
def test_free_tpu_finds_a_jax_process_by_what_it_holds(tmp_path, held):
    """A JAX training process holds the chips as any libtpu user does: /dev/vfio/N on v5e/v6e
    (/dev/accelN on v4/v5p) and /tmp/libtpu_lockfile, open for its life. Left behind by an
    ended tpuctl job, it is stopped by what it holds, whatever its name; the lock goes too."""
    (tmp_path / "vfio").mkdir()
    device, lock = tmp_path / "vfio" / "0", tmp_path / "libtpu_lockfile"
    device.write_text("")
    lock.write_text("")
    target = device if held.startswith("vfio") else lock
    proc, holder = _holder(tmp_path, target, record=".tpuctl/jobs/jax-1/worker-0", ended=True)
    try:
        out = subprocess.run(
            ["sh", "-c", free_tpu_script((f"{tmp_path}/accel*", f"{tmp_path}/vfio/*"),
                                         str(lock))],
            capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert f"stopping pid {holder}, left holding {target} by tpuctl job" in out.stdout
        wait_for(lambda: not _alive(holder), timeout_s=5)
        assert not lock.exists()
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _holding_the_real_libtpu_lock():
    """A process holding /tmp/libtpu_lockfile, as a `--dry-run --compile` beside the test does;
    the file is made only when absent, and then removed after."""
    lock = Path(LIBTPU_LOCKFILE)
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o644))
        made = os.stat(lock).st_ino
    except FileExistsError:
        made = None
    proc = subprocess.Popen(["sh", "-c", f"exec 3<{lock}; exec sleep 60"],
                            start_new_session=True)
    try:
        wait_for(lambda: _holds(proc.pid, lock))
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        with contextlib.suppress(OSError):
            if made is not None and os.stat(lock).st_ino == made:
                lock.unlink()


def test_a_stand_in_fleets_free_step_leaves_this_machines_libtpu_users_alone(tmp_path):
    """The stand-in fleet's workers see this machine's processes (one /proc): a libtpu user
    here, holding /tmp/libtpu_lockfile, is no holder of the fleet's TPU. The free-tpu step as a
    stand-in fleet's plan has it passes, names nobody, signals nothing and leaves the lock."""
    p = build_plan(config(cluster=GCP), workers(2), job_id="unit-1", payload_digest="abc",
                   environment=ENV, hardware=Hardware.tpu("v4-16", "unit"),
                   forward_env=((stand_ins.TPU_API_ENV, "http://127.0.0.1:1"),))
    script = next(s for s in p.steps if s.name == "free-tpu").commands[0].argv[2]
    with _holding_the_real_libtpu_lock() as holder:
        out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                             cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert str(holder) not in out.stdout + out.stderr
        assert _alive(holder) and Path(LIBTPU_LOCKFILE).exists()


def test_the_python_set_up_runs_as_planned(tmp_path):
    """The JAX route's set-up lines, run by a real shell with a stand-in for uv (the real one
    downloads the interpreter): the environment's Python is the interpreter uv found, under the
    environment, and a path with a space in it changes nothing."""
    import sys

    from launcher.worker_python import python_install_script
    from payload.core.engines import JAX_TPU_PYTHON

    env_dir = str(tmp_path / "work dir" / "env")
    build = f"cpython-{JAX_TPU_PYTHON}-linux-x86_64-gnu"
    lines = python_install_script(env_dir, build, [])
    # The stand-in: the uv venv gets a `uv` that "installs" by linking this Python into the
    # install folder and "finds" it there; pip is not asked (the bootstrap venv is faked).
    fake_uv = (
        "#!/bin/sh\n"
        'case "$2" in\n'
        f'  install) mkdir -p "$UV_PYTHON_INSTALL_DIR/$5/bin" && ln -s {sys.executable} '
        '"$UV_PYTHON_INSTALL_DIR/$5/bin/python3";;\n'
        '  find) echo "$UV_PYTHON_INSTALL_DIR/$5/bin/python3";;\n'
        "esac\n")
    assert lines[0].startswith("python3 -m venv") and "pip install" in lines[1]
    setup = " && ".join([
        f"mkdir -p {shlex.quote(env_dir)}/.uv/bin",
        f"printf %s {shlex.quote(fake_uv)} > {shlex.quote(env_dir)}/.uv/bin/uv",
        f"chmod +x {shlex.quote(env_dir)}/.uv/bin/uv",
        *lines[2:]])
    out = subprocess.run(["sh", "-c", setup], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    python = Path(env_dir) / "bin" / "python"
    version = subprocess.run([str(python), "-c", "import sys; print(sys.prefix)"],
                             capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == env_dir
    home = (Path(env_dir) / "pyvenv.cfg").read_text()
    assert f"{env_dir}/.python/{build}/bin" in home


@pytest.mark.parametrize(("dists", "verdict"), [
    ({"tensorflow_cpu": "2.20.0", "jax": "0.10.2"}, ""),
    ({"tensorflow_tpu": "2.20.0", "jax": "0.10.2"}, ""),
    ({"tensorflow_cpu": "2.19.0", "jax": "0.10.2"}, "tensorflow is 2.19.0, needs 2.20.0"),
    ({"jax": "0.10.2"}, "tensorflow is missing"),
])
def test_an_existing_python_is_checked_whichever_tensorflow_build_it_has(tmp_path, dists,
                                                                         verdict):
    """`cluster.python` on a TPU VM: TensorFlow counts as its TPU build (TF route) or its CPU
    build beside jax[tpu] (JAX route), at the pinned version."""
    import sys

    from launcher.worker_python import VERSION_CHECK

    for dist, version in dists.items():
        info = tmp_path / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\n"
                                       f"Version: {version}\n")
    # -S: no site-packages, only the stand-in distributions on PYTHONPATH.
    out = subprocess.run([sys.executable, "-S", "-c", VERSION_CHECK, "tensorflow==2.20.0",
                          "jax==0.10.2"], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(tmp_path), "PATH": os.environ["PATH"]})
    assert (out.returncode, out.stdout.strip()) == ((1, verdict) if verdict else (0, "")), (
        out.stderr)


# A config value can be anything a YAML string holds; none of it may become shell syntax.
nasty = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                min_size=1, max_size=40) | st.sampled_from(
    ["a path/with spaces", "it's", '"q"', "$(touch /tmp/pwned)", "`id`", "a; rm -rf /",
     "x && y", "$HOME", "*", "-n", "\\", "\n", "a\nb"])


def _words_from_shell(line: str) -> list[str]:
    out = subprocess.run(["sh", "-c", "printf '%s\\0' " + line], capture_output=True,
                         timeout=10)
    assert out.returncode == 0
    return out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(python=nasty, corpus=nasty, output_dir=nasty)
def test_config_values_never_change_what_runs(python, corpus, output_dir):
    env = plan_environment(python=python, wheelhouse_digest=None, requirements=("a==1",),
                           tpu=False)
    try:
        cfg = config(output_dir=output_dir, data={"corpus": corpus})
    except UserError:  # a root ("/", "..", the checkout) is no output_dir (issue 8)
        assume(False)
    p = build_plan(cfg, workers(2), job_id="unit-1", payload_digest="abc", environment=env,
                   hardware=CPU)
    for step in p.steps:
        for command in step.commands:
            expected = ["env", *(f"{k}={v}" for k, v in command.env), *command.argv]
            assert shlex.split(command.shell_line()) == expected
            if step.name == "prepare" and command.worker == 1:
                # Through a real shell: exactly these words reach the program, nothing runs.
                assert _words_from_shell(command.shell_line()) == expected
    setup_words = _words_from_shell(shlex.join(env.setup))
    assert setup_words == list(env.setup)
    # The shared-output check puts output_dir itself on a command line.
    check = job_control._worker_module(p, "pass", p.barrier_dir)
    assert _words_from_shell(check)[-1] == p.barrier_dir


