"""Terraform is never cut off between making a resource and saving it (issue 27, item 3): it runs
in a session of its own, writing to a file, so a launcher killed mid-apply leaves the apply to
finish; the next command waits for it; Ctrl-C is still its graceful stop; the state file is read
as Terraform writes it. Real terraform on a module of built-in resources whose provisioners
sleep, so that the moment to kill is one the test can see."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.terraform import Terraform
from tests.support.paths import REPO
from tests.support.terraform_session import MODULE
from tests.support.waits import wait_for

# The launcher: a process that applies the module, as `tpuctl up` would.
LAUNCHER = ("import sys; from pathlib import Path; from launcher.terraform import Terraform; "
            "tf = Terraform(Path(sys.argv[1]), module=Path(sys.argv[2])); tf.init(); "
            "tf.apply(print, vet=lambda changes: None)")


@pytest.fixture
def module(tmp_path, monkeypatch) -> Path:
    if shutil.which("terraform") is None:
        pytest.skip("terraform is not installed (make setup-terraform installs one)")
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/dev/null")
    folder = tmp_path / "module"
    folder.mkdir()
    (folder / "main.tf").write_text(MODULE)
    return folder


def _launch(work: Path, module: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CLI_CONFIG_FILE": "/dev/null"}
    return subprocess.Popen([sys.executable, "-c", LAUNCHER, str(work), str(module)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)


def _addresses(tf: Terraform) -> list[str]:
    return sorted(r.address for r in tf.resources() or [])


def test_a_killed_launcher_leaves_terraform_to_finish_and_save_what_it_made(module, tmp_path):
    work = tmp_path / "work"
    launcher = _launch(work, module)
    wait_for(lambda: (work / "first-started").exists(), timeout_s=60)
    os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and everything in its group
    launcher.wait(timeout=10)
    tf = Terraform(work, module=module)
    assert tf.busy()  # its Terraform goes on, in a session of its own
    seen = []
    tf.wait_idle(seen.append)
    assert seen and "still running" in seen[0]
    assert _addresses(tf) == ["terraform_data.first", "terraform_data.second"]
    assert "Apply complete! Resources: 2 added" in (work / ".tpuctl-terraform.log").read_text()


def test_ctrl_c_stops_terraform_once_what_it_is_making_is_saved(module, tmp_path):
    work = tmp_path / "work"
    launcher = _launch(work, module)
    wait_for(lambda: (work / "first-started").exists(), timeout_s=60)
    os.killpg(launcher.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
    output, _ = launcher.communicate(timeout=60)
    assert "KeyboardInterrupt" in output
    tf = Terraform(work, module=module)
    assert not tf.busy()  # stopped with the launcher, not left running
    assert _addresses(tf) == ["terraform_data.first"]  # saved; nothing new started


def test_the_next_command_waits_while_another_holds_the_state_lock(module, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    tf = Terraform(work, module=module)
    assert not tf.busy()  # no state file, no Terraform
    tf.state_file.write_text("{}")
    released = tmp_path / "released"
    # The holder marks the moment just before it lets go, then lingers: the wait must end
    # after that moment, not when the process is gone.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, pathlib, sys, time; f = open(sys.argv[1], 'r+'); "
        "fcntl.lockf(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(2); "
        "pathlib.Path(sys.argv[2]).touch(); fcntl.lockf(f, fcntl.LOCK_UN); time.sleep(60)"),
        str(tf.state_file), str(released)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert tf.busy()
        tf.wait_idle()
        assert released.exists()  # it waited until the lock was let go
        assert not tf.busy()
    finally:
        holder.kill()
        holder.wait(timeout=10)


