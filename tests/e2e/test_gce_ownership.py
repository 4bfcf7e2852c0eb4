"""Provider gce never deletes what it did not make, and never loses track of what it did make
(issue 27, items 1-3; issue 32, item 1: not by `up` either): ownership comes from what Terraform made, read from its state while and
after it applies, and at the next command after an `up` that was killed. Real terraform applies
tests/terraform_twin_slice against the fake Compute Engine (testbed/fakes/compute.py, driven by
the real google-cloud-compute client); `up` is killed for real (SIGKILL) mid-apply, at the moment
the fake receives the MIG's insert. No SSH: the VMs are addresses with made-up host keys."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher import terraform
from launcher.providers import gce, gce_api, gcp_site
from launcher.records import state_dir
from payload.core import layout
from payload.core.errors import UserError
from testbed.fakes.compute import FakeCompute
from testbed.fakes.tpu_api import Worker
from tests.support.paths import REPO
from tests.support.runners import assert_user_error, invoke, tpuctl

PROJECT, REGION, ZONE = "test-project", "us-east5", "us-east5-b"
TWIN = REPO / "tests" / "terraform_twin_slice"
# A real `tpuctl` process whose slice module is the twin (what the in-process tests patch).
DRIVER = ("import sys; from pathlib import Path; from launcher.providers import gce; "
          "gce.SLICE_MODULE = Path(sys.argv[1]); sys.argv[1:2] = []; "
          "from launcher.cli import main; main()")


@pytest.fixture
def cloud(tpuctl_home, monkeypatch):
    if shutil.which("terraform") is None:
        pytest.skip("needs terraform on PATH (make setup-terraform)")
    monkeypatch.setattr(gcp_site, "POLL_S", 0.05)
    monkeypatch.setattr(gce, "SLICE_MODULE", TWIN)
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/dev/null")
    with FakeCompute() as api:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, api.endpoint)
        api.set_workers([Worker("10.0.0.2"), Worker("10.0.0.3")])
        yield api


def _config(folder: Path, name: str = "trillium", **cluster) -> Path:
    raw = {
        "name": name, "output_dir": str(folder / "out"),
        "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                    "machine_type": "ct6e-standard-4t", "topology": "2x4",
                    "provisioning": "flex_start", "max_run_hours": 2,
                    "ssh_source_ranges": ["203.0.113.7/32"], "user": "root", **cluster},
        "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2"},
        "train": {"engine": "jax", "steps": 4, "batch_size": 8, "learning_rate": 1e-3},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _recorded(home: Path, run: str, kind: str) -> dict:
    path = home / "gcp" / run / "owned.json"
    return json.loads(path.read_text()).get("gce", {}).get(kind, {}) if path.exists() else {}


def _nothing_left(cloud) -> bool:
    return (cloud.group_names() == cloud.instance_names() == cloud.template_names()
            == cloud.policy_names() == cloud.firewall_names() == [])


def _said(result) -> str:
    return result.output + (str(result.exception) if result.exception else "")


def test_a_one_vm_slice_never_takes_a_workload_policy_of_its_name(cloud, tmp_path, tpuctl_home):
    """Item 1: a one-VM slice has no workload policy, so a policy of its name made by hand is
    not the run's: neither recorded by `up` nor deleted by `down`."""
    config = _config(tmp_path, name="solo", topology="2x2")  # ct6e-standard-4t 2x2: one VM
    policy = cloud.add_policy(PROJECT, REGION, "solo-topology", {
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2"}})
    doctor = invoke("doctor", "-c", config)
    assert "ok    the run's names are free or its own" in doctor.output, doctor.output
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, _said(up)
    assert cloud.requests("resourcePolicies.insert") == []
    assert _recorded(tpuctl_home, "solo", "policies") == {}
    assert _recorded(tpuctl_home, "solo", "groups")["solo"]  # what it did make, it recorded
    down = invoke("down", "-c", config)
    assert down.exit_code == 0, _said(down)
    assert "workload policy" not in down.output
    assert cloud.policy_names() == ["solo-topology"]
    assert cloud.requests("resourcePolicies.delete") == []
    assert cloud.group_names() == cloud.template_names() == cloud.firewall_names() == []
    assert policy["id"] not in json.dumps(_recorded(tpuctl_home, "solo", "policies"))


def test_a_group_made_under_the_runs_name_during_the_apply_is_never_taken(cloud, tmp_path,
                                                                          tpuctl_home):
    """Item 2: someone makes a MIG of the run's name after `up` looked and before Terraform's
    insert (which then fails with 409): it is neither recorded nor deleted, by `up` undoing
    what it made or by `down`, and neither says that nothing of the run's names is left."""
    config = _config(tmp_path)
    theirs = {}
    cloud.on_request("regionInstanceGroupManagers.insert", lambda: theirs.update(cloud.add_group(
        PROJECT, REGION, "trillium", {"targetSize": 0, "instanceTemplate": (
            f"projects/{PROJECT}/regions/{REGION}/instanceTemplates/their-template")})))
    up = invoke("up", "-c", config)
    assert isinstance(up.exception, UserError), _said(up)
    assert cloud.group_names() == ["trillium"]  # theirs, untouched
    assert cloud.requests("regionInstanceGroupManagers.delete") == []
    assert _recorded(tpuctl_home, "trillium", "groups") == {}
    said = str(up.exception)
    assert "already exists" in said  # Terraform's own 409
    assert f"managed instance group trillium in {REGION} (id {theirs['id']})" in said
    assert "nothing of the slice is left billing" not in said
    assert cloud.template_names() == cloud.policy_names() == cloud.firewall_names() == []
    down = invoke("down", "-c", config)
    assert isinstance(down.exception, UserError), _said(down)
    assert cloud.group_names() == ["trillium"]
    assert "left billing" not in _said(down)
    assert (f"gcloud compute instance-groups managed describe trillium --region {REGION} "
            f"--project {PROJECT}") in _said(down)


def _up_process(config: Path, home: Path, endpoint: str) -> subprocess.Popen:
    """`tpuctl up` as a process of its own, in its own process group (which SIGKILL ends)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "TPUCTL_HOME": str(home),
           gce_api.ENDPOINT_ENV: endpoint, "TF_CLI_CONFIG_FILE": "/dev/null"}
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(TWIN), "up", "-c", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)


def _terraform_of(home: Path) -> list[int]:
    """The ids of the terraform processes working in this test's run folder."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if argv and argv[0].endswith(b"terraform") and any(
                str(home).encode() in arg for arg in argv):
            found.append(int(entry.name))
    return found


def test_an_up_killed_mid_apply_leaves_the_slice_owned_and_the_next_up_goes_on(
        cloud, tmp_path, tpuctl_home):
    """Item 3: `up` SIGKILLed (with its whole process group) while Terraform inserts the MIG.
    Terraform, which tpuctl runs in a session of its own, finishes the apply and saves what it
    made; the next `up` takes over the ids from Terraform's state and finishes, and `down`
    removes all of it."""
    config = _config(tmp_path)
    proc = _up_process(config, tpuctl_home, cloud.endpoint)
    cloud.on_request("regionInstanceGroupManagers.insert",
                     lambda: os.killpg(proc.pid, signal.SIGKILL))
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL, output
    assert _recorded(tpuctl_home, "trillium", "groups") == {}  # killed before it knew
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, _said(up)
    assert "recorded what Terraform made for run trillium in an `up` that was cut short" in (
        up.output)
    assert "slice trillium is RUNNING" in up.output
    assert len(cloud.requests("regionInstanceGroupManagers.insert")) == 1  # the same slice
    assert _recorded(tpuctl_home, "trillium", "groups")["trillium"]
    down = invoke("down", "-c", config)
    assert down.exit_code == 0, _said(down)
    assert "nothing of run trillium is left billing" in down.output
    assert _nothing_left(cloud)


def test_down_after_a_crash_that_took_terraform_too_names_what_it_cannot_own(
        cloud, tmp_path, tpuctl_home):
    """Item 3, the worst case: the machine's processes all die while the MIG is being made, so
    Terraform never writes it down. `down` removes what Terraform's state holds (the firewall
    rules; the template and workload policy once the MIG that uses them is gone), and does not
    claim that nothing is left: it names the MIG with the command to inspect it."""
    config = _config(tmp_path)
    proc = _up_process(config, tpuctl_home, cloud.endpoint)

    def crash() -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in _terraform_of(tpuctl_home):
            os.kill(pid, signal.SIGKILL)

    cloud.on_request("regionInstanceGroupManagers.insert", crash)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL, output
    down = invoke("down", "-c", config)
    said = _said(down)
    assert isinstance(down.exception, UserError), said
    assert "left billing" not in said
    assert (f"gcloud compute instance-groups managed describe trillium --region {REGION} "
            f"--project {PROJECT}") in said
    assert cloud.group_names() == ["trillium"]  # not shown to be the run's: left alone
    assert cloud.firewall_names() == []  # the run's own: gone
    # In use by the MIG; named as the provider names it (name_prefix trillium-).
    assert re.search(r"instance template trillium-[0-9a-f]{26} \(the run's own", said)
    # Once the user has deleted the MIG (it was theirs), `down` removes the rest.
    gce_api.ComputeApi(project=PROJECT, region=REGION).delete("groups", "trillium")
    again = invoke("down", "-c", config)
    assert again.exit_code == 0, _said(again)
    assert _nothing_left(cloud)


def test_up_never_deletes_a_policy_of_the_runs_name_that_the_new_config_drops(cloud, tmp_path,
                                                                               tpuctl_home):
    """Issue 32, item 1: a 2x4 slice is up; its MIG disappears (as after `train --down`: the
    provider's refresh drops a 404); its workload policy is deleted out of band and someone
    makes one of the same name; the config changes to 2x2, a one-VM slice with no policy. The
    plan would delete that policy by name: `up` refuses in one line, with nothing applied. Once
    `down` has taken it out of the run's state (untouched), `up` makes the 2x2 slice."""
    config = _config(tmp_path)
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, _said(up)
    api = gce_api.ComputeApi(project=PROJECT, region=REGION)
    api.delete("groups", "trillium")
    tf = terraform.Terraform(state_dir() / layout.INFRA_DIR / gce.NAME / "trillium", module=TWIN)
    tf.forget([a for a in tf.addresses() if "instance_group_manager" in a])  # the refresh
    api.delete("policies", "trillium-topology")
    theirs = cloud.add_policy(PROJECT, REGION, "trillium-topology", {"workloadPolicy": {
        "type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x4"}})
    state, made = tf.state_file.read_text(), len(cloud.requests())
    deleted = len(cloud.requests("resourcePolicies.delete"))  # the one done out of band
    config = _config(tmp_path, topology="2x2")

    refused = tpuctl("up", "-c", config)
    assert_user_error(refused, f"Terraform would delete workload policy trillium-topology in "
                      f"{REGION} (id {theirs['id']})", "nothing was applied",
                      "gcloud compute resource-policies describe trillium-topology")
    assert cloud.policy_names() == ["trillium-topology"]  # theirs, untouched
    assert [r.rpc for r in cloud.requests()[made:]
            if not r.rpc.endswith((".get", ".list"))] == []  # nothing made, changed, deleted
    assert tf.state_file.read_text() == state

    down = invoke("down", "-c", config)  # names theirs as not the run's, deletes the rest
    assert "took workload policy trillium-topology out of the run's state" in down.output
    assert cloud.policy_names() == ["trillium-topology"]
    again = invoke("up", "-c", config)
    assert again.exit_code == 0, _said(again)
    assert cloud.policy_names() == ["trillium-topology"]
    assert len(cloud.requests("resourcePolicies.delete")) == deleted
    assert api.get("policies", "trillium-topology").id == int(theirs["id"])
