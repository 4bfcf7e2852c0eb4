"""tpuctl's SSH uses only what the run config says, against real sshd workers (testbed/fleet.py):
no ~/.fabric.yaml, ~/.ssh/config, global known_hosts or ssh-agent; keys with loose modes warn;
any login shell (tcsh here) works, since scripts travel on stdin."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.launch import STAGE_ENTRY_ENV
from tests.support.cloud import install_stub
from tests.support.configs import tiny_config
from tests.support.paths import REPO
from tests.support.waits import wait_for

PYTHON = sys.executable


@pytest.fixture
def cluster(fleet, tmp_path):
    """A config for the fleet (no job is started from it) and a HOME full of traps."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    # What a user's own set-up may hold; none of it is tpuctl's to use.
    (home / ".fabric.yaml").write_text("forward_agent: true\n")
    (home / ".ssh/config").write_text("Host *\n  ForwardAgent yes\n  ProxyCommand false\n"
                                      "  User nobody\n")

    def make(**cluster_over):
        spec = {"provider": "ssh", "hosts": fleet.hosts, "user": "root",
                "identity_file": fleet.identity_file, "known_hosts": fleet.known_hosts,
                "port": fleet.port, "python": PYTHON, **cluster_over}
        return tiny_config(tmp_path / "run", output_dir=str(fleet.shared / "iso-out"),
                           cluster=spec, train={"batch_size": 6})  # 3 workers split it

    return make, home


def _tpuctl(*args, home, tmp_path, input=None, extra=None, prefix=()):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home),
           "TPUCTL_HOME": str(tmp_path / "state"), **(extra or {})}
    env.pop("TPUCTL_DEBUG", None)
    return subprocess.run([*prefix, PYTHON, "-m", "launcher.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, input=input, timeout=120)


@pytest.fixture
def agent(tmp_path, fleet):
    """A running ssh-agent holding the workers' key: what forwarding would hand to them."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        wait_for(sock.exists, timeout_s=10)
        subprocess.run(["ssh-add", fleet.identity_file], env={**os.environ,
                       "SSH_AUTH_SOCK": str(sock)}, check=True, capture_output=True)
        yield str(sock)
    finally:
        proc.kill()
        proc.wait()


def test_commands_ignore_fabric_yaml_ssh_config_and_the_agent(cluster, tmp_path, agent):
    make, home = cluster
    config = make()
    result = _tpuctl("ssh", "-c", str(config), "--", "sh", "-c",
                     'echo "agent=[${SSH_AUTH_SOCK:-}]"', home=home, tmp_path=tmp_path,
                     extra={"SSH_AUTH_SOCK": agent})
    assert result.returncode == 0, result.stderr
    for i in range(3):
        # ~/.fabric.yaml's forward_agent would have put the user's agent on every worker.
        assert f"worker-{i} | agent=[]" in result.stdout, result.stdout


def test_interactive_ssh_quotes_paths_and_ignores_ssh_config(cluster, fleet, tmp_path):
    make, home = cluster
    odd = tmp_path / "known hosts %d"
    odd.mkdir()
    shutil.copy(fleet.known_hosts, odd / "kh")
    config = make(known_hosts=str(odd / "kh"))
    # Not a terminal: the login shell reads its commands from standard input.
    result = _tpuctl("ssh", "-c", str(config), "--worker", "1", home=home, tmp_path=tmp_path,
                     input="echo hello-from-$(hostname)\nexit 0\n")
    assert result.returncode == 0, result.stderr
    assert "hello-from-worker-1" in result.stdout


def test_interactive_ssh_ignores_the_global_known_hosts(cluster, fleet, tmp_path):
    """The system-wide known_hosts vouches for worker 1; cluster.known_hosts does not: refused.
    (The system file is replaced in a private mount namespace only.)"""
    make, home = cluster
    partial = tmp_path / "kh"
    partial.write_text(Path(fleet.known_hosts).read_text().splitlines()[0] + "\n")
    config = make(known_hosts=str(partial))
    etc = tmp_path / "etc-ssh"
    shutil.copytree("/etc/ssh", etc, symlinks=True)
    (etc / "ssh_known_hosts").write_text(Path(fleet.known_hosts).read_text())
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
              f'mount --bind "{etc}" /etc/ssh && exec "$@"', "-")
    result = _tpuctl("ssh", "-c", str(config), "--worker", "1", home=home, tmp_path=tmp_path,
                     input="echo logged-in\n", prefix=prefix)
    assert result.returncode == 255, result.stdout + result.stderr
    assert "logged-in" not in result.stdout
    assert "Host key verification failed" in result.stderr


def test_a_key_others_can_read_is_used_with_one_warning(cluster, fleet, tmp_path):
    make, home = cluster
    loose = tmp_path / "loose_key"
    shutil.copy(fleet.identity_file, loose)
    loose.chmod(0o644)
    config = make(identity_file=str(loose))
    result = _tpuctl("ssh", "-c", str(config), "--", "true", home=home, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: "), result.stderr
    assert f"cluster.identity_file {loose} can be read by other users (mode 0644)" in lines[0]
    assert "chmod 600" in lines[0]


@pytest.fixture(scope="module")
def tcsh_fleet():
    from testbed.fleet import Fleet, sshd_available

    shell = shutil.which("tcsh")
    if not sshd_available() or shell is None:
        pytest.skip("needs root, openssh-server and tcsh (apt-get install -y tcsh)")
    with Fleet(1, login_shell=shell) as f:
        yield f


def test_a_tcsh_login_shell_runs_every_command(tcsh_fleet, tmp_path):
    """csh and tcsh refuse a newline inside quotes: commands sent as `sh -c '...'` through the
    login shell failed; sent to `sh -s` on stdin they run as they are."""
    from launcher.executors import SshExecutor, SshSettings
    from launcher.plan import Worker

    fleet = tcsh_fleet
    login = subprocess.run(["ssh", "-F", "/dev/null", "-i", fleet.identity_file, "-p",
                            str(fleet.port), "-o", f"UserKnownHostsFile={fleet.known_hosts}",
                            f"root@{fleet.hosts[0]}", "echo $shell"], capture_output=True,
                           text=True, timeout=30)
    assert login.stdout.strip().endswith("tcsh"), login  # the worker really logs in with tcsh
    worker = Worker(index=0, host=fleet.hosts[0], address=fleet.hosts[0], coordination_port=0,
                    ssh_port=fleet.port)
    settings = SshSettings(user="root", known_hosts=fleet.known_hosts,
                           identity_file=fleet.identity_file)
    with SshExecutor((worker,), settings) as executor:
        res = executor.run(worker, "x='it'\"'\"'s'\necho \"$x\"\nread y || echo no-stdin\n"
                           "exit 3")
    assert (res.rc, res.stdout) == (3, "it's\nno-stdin\n"), res
    # And a whole job, every command of it through tcsh.
    shared = fleet.shared / "job"
    stub = install_stub(shared / "stub")
    config = tiny_config(shared, output_dir=str(shared / "out"), name="tcsh", cluster={
        "provider": "ssh", "hosts": fleet.hosts, "user": "root",
        "identity_file": fleet.identity_file, "known_hosts": fleet.known_hosts,
        "port": fleet.port, "python": PYTHON})
    result = _tpuctl("train", "-c", str(config), home=Path.home(), tmp_path=tmp_path,
                     extra={STAGE_ENTRY_ENV: str(stub)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "worker-0 | == tpuctl: worker-0 finished ==" in result.stdout
    assert (shared / "out/model/config.json").exists()
