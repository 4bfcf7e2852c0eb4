"""Provider gce against stand-ins: real terraform applies tests/terraform_twin_slice (whose
resources send what the google provider would), Compute Engine is testbed/fakes/compute.py driven
by the real google-cloud-compute client, and the VMs are the real sshd fleet publishing its real
host keys as guest attributes. up -> ssh -> status -> down; flex-start that waits for capacity;
quota errors; preemption and recovery; doctor; what tpuctl did not make survives."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from launcher.providers import gce, gce_api, gcp_site
from testbed.fakes.compute import FakeCompute, quota_exceeded
from testbed.fakes.tpu_api import Worker
from tests.support.cloud import attach_fleet
from tests.support.paths import TERRAFORM_TWIN_SLICE
from tests.support.runners import invoke

PROJECT, REGION, ZONE = "test-project", "us-east5", "us-east5-b"
TWIN = TERRAFORM_TWIN_SLICE


# -- the fake alone, with the real client --------------------------------------------------------


@pytest.fixture
def fake(monkeypatch):
    with FakeCompute() as api:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, api.endpoint)
        api.set_workers([Worker("10.0.0.2", external_ip="34.0.0.2"), Worker("10.0.0.3")])
        yield api


# -- the provider end to end, with the sshd fleet ------------------------------------------------


@pytest.fixture
def cloud(fleet, tpuctl_home, monkeypatch):
    """A fake Compute Engine whose VMs are the fleet's workers (port 22: netns fleet only)."""
    if fleet.port != 22:
        pytest.skip("the VMs listen on port 22: needs the fleet in network namespaces")
    if shutil.which("terraform") is None:
        pytest.skip("needs terraform on PATH (make setup-terraform)")
    monkeypatch.setattr(gcp_site, "POLL_S", 0.05)
    monkeypatch.setattr(gce, "SLICE_MODULE", TWIN)
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/dev/null")
    with FakeCompute(host=f"{fleet.subnet}.1") as api:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, api.endpoint)
        attach_fleet(api, fleet)
        yield api


def gce_config(folder: Path, fleet, **cluster) -> Path:
    raw = {
        "name": "trillium",
        "output_dir": str(folder / "out"),
        "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                    "machine_type": "ct6e-standard-4t", "topology": "2x4",
                    "provisioning": "flex_start", "max_run_hours": 2,
                    "ssh_source_ranges": ["10.0.0.0/8"], "user": "root",
                    "identity_file": fleet.identity_file, "python": sys.executable, **cluster},
        "data": {"corpus": str(folder / "corpus.txt"), "seq_len": 32},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"engine": "jax", "steps": 4, "batch_size": 8, "learning_rate": 1e-3},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_up_ssh_status_down_on_a_stand_in_slice(cloud, fleet, tmp_path, tpuctl_home):
    config = gce_config(tmp_path, fleet)
    cloud.set_capacity(after_polls=10)  # flex-start: the request waits, then gets capacity
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, up.output
    assert "terraform: trillium-ssh, trillium-internal, trillium-topology, " \
           "trillium-<unique id>, trillium" in up.output
    assert "waiting for capacity for all 2 VMs at once (ZONE_RESOURCE_POOL_EXHAUSTED" in (
        up.output)
    assert "slice trillium is RUNNING in us-east5-b: 2 VM(s)" in up.output
    # What was asked for: bulk, one zone, flex-start with a run limit, guest attributes.
    group = cloud.requests("regionInstanceGroupManagers.insert")[0].body
    assert group["targetSizePolicy"] == {"mode": "BULK"} and group["targetSize"] == 2
    assert group["instanceLifecyclePolicy"] == {"defaultActionOnFailure": "DO_NOTHING"}
    template = cloud.requests("regionInstanceTemplates.insert")[0].body["properties"]
    assert template["scheduling"]["provisioningModel"] == "FLEX_START"
    assert template["scheduling"]["maxRunDuration"] == {"seconds": "7200"}
    policy = cloud.requests("resourcePolicies.insert")[0].body
    assert policy["workloadPolicy"]["acceleratorTopology"] == "2x4"
    assert cloud.firewall("trillium-ssh")["sourceRanges"] == ["10.0.0.0/8"]
    assert cloud.firewall("trillium-ssh")["targetTags"] == template["tags"]["items"]
    # known_hosts from the guest attributes, in the MIG's stable order; strict SSH works.
    known = (tpuctl_home / "gcp/trillium/known_hosts").read_text().splitlines()
    assert sorted(known) == sorted(f"{fleet.hosts[i]} {fleet.host_keys[i]}" for i in (0, 1))
    ssh = invoke("ssh", "-c", config, "--", "hostname")
    assert ssh.exit_code == 0, ssh.output
    assert "worker-0" in ssh.output and "worker-1" in ssh.output
    # up twice makes nothing new.
    again = invoke("up", "-c", config)
    assert again.exit_code == 0, again.output
    assert len(cloud.requests("regionInstanceGroupManagers.insert")) == 1
    # A config that now asks for another slice is not quietly served by the old one.
    raw = yaml.safe_load(config.read_text())
    changed = tmp_path / "changed"
    changed.mkdir()
    raw["cluster"]["max_run_hours"] = 5
    (changed / "tpuctl.yaml").write_text(yaml.safe_dump(raw))
    drift = invoke("up", "-c", changed / "tpuctl.yaml")
    assert drift.exit_code != 0
    assert re.search(r"instance template trillium-[0-9a-f]{26} was made with ct6e-standard-4t, "
                     "FLEX_START, 7200; the config now asks for ct6e-standard-4t, FLEX_START, "
                     "18000", str(drift.exception))

    status = invoke("status", "-c", config)
    assert status.exit_code == 0, status.output
    assert "slice trillium (v6e-8 = 2x4 on ct6e-standard-4t in us-east5-b): RUNNING, 2 of 2" in (
        status.output)
    assert "run limit: 2.0 h left" in status.output or "run limit: 1.9 h left" in status.output
    assert "no flex-start price" in status.output  # the catalog has none: it says so

    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert "8 destroyed" in down.output  # what it made (and its update stand-ins)
    assert "nothing of run trillium is left billing" in down.output
    assert cloud.group_names() == cloud.template_names() == cloud.policy_names() == []
    assert cloud.instance_names() == [] and cloud.firewall_names() == []
    twice = invoke("down", "-c", config)
    assert twice.exit_code == 0, twice.output


def test_what_tpuctl_did_not_make_survives_down(cloud, fleet, tmp_path, tpuctl_home):
    config = gce_config(tmp_path, fleet)
    # Someone's MIG of the run's name: `up` stops before making anything, `down` leaves it.
    cloud.add_group(PROJECT, REGION, "trillium", {"targetSize": 0})
    up = invoke("up", "-c", config)
    assert up.exit_code != 0
    assert "managed instance group trillium" in str(up.exception)
    assert "not made by tpuctl" in str(up.exception)
    assert cloud.template_names() == cloud.policy_names() == cloud.firewall_names() == []
    down = invoke("down", "-c", config)
    assert down.exit_code != 0 and "never brought up" in str(down.exception)
    assert cloud.group_names() == ["trillium"]

    # The run's own slice beside a hand-made VM that carries the run's name and label.
    other = tmp_path / "other"
    config = gce_config(other, fleet)
    raw = yaml.safe_load(config.read_text())
    raw["name"] = "ironwood"
    config.write_text(yaml.safe_dump(raw))
    cloud.add_instance(PROJECT, ZONE, "ironwood-hand", labels={"tpuctl-run": "ironwood"},
                       worker=Worker(fleet.hosts[2]))
    assert invoke("up", "-c", config).exit_code == 0
    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert "ironwood-hand" in cloud.instance_names()
    assert cloud.group_names() == ["trillium"]


def test_a_failed_up_leaves_nothing_that_bills(cloud, fleet, tmp_path, tpuctl_home):
    config = gce_config(tmp_path, fleet)
    cloud.fail("regionInstanceGroupManagers.insert", quota_exceeded("TPU_V6E", REGION))
    up = invoke("up", "-c", config)
    assert up.exit_code != 0
    message = str(up.exception)
    assert "Quota 'TPU_V6E' exceeded" in message and "nothing of the slice is left" in message
    assert "removing the slice so that nothing bills" in up.output
    assert cloud.group_names() == cloud.instance_names() == cloud.template_names() == []
    assert cloud.policy_names() == cloud.firewall_names() == []
    assert invoke("down", "-c", config).exit_code == 0
    # The next `up` goes through.
    assert invoke("up", "-c", config).exit_code == 0
    assert invoke("down", "-c", config).exit_code == 0
    assert cloud.group_names() == cloud.firewall_names() == []


def test_a_preempted_vm_is_trouble_and_recover_brings_up_a_new_slice(cloud, fleet, tmp_path,
                                                                      tpuctl_home):
    from launcher.providers import provider_for
    from payload.config import load_config

    config = gce_config(tmp_path, fleet, provisioning="spot", max_run_hours=None)
    assert invoke("up", "-c", config).exit_code == 0
    provider = provider_for(load_config(config))
    first = provider.fleet()
    assert provider.trouble() is None
    victim = cloud.instance_names()[0]
    cloud.preempt(victim)  # a spot VM taken back is deleted (instanceTerminationAction DELETE)
    assert victim not in cloud.instance_names()
    assert provider.trouble().startswith("slice trillium lost a VM: 1 of its 2 left")
    status = invoke("status", "-c", config)
    assert "creating: 1 of 2 VMs RUNNING" in status.output, status.output
    cloud.use_fleet([2, 1])  # the new VMs: other hosts, other keys
    notes = []
    provider.recover(notes.append)
    assert notes[0].startswith("deleting instance group trillium")
    assert notes[-1].startswith("slice trillium is RUNNING")
    again = provider_for(load_config(config)).fleet()
    assert {w.host for w in again.workers} == {fleet.hosts[2], fleet.hosts[1]}
    assert {w.host for w in first.workers} == {fleet.hosts[0], fleet.hosts[1]}
    known = (tpuctl_home / "gcp/trillium/known_hosts").read_text()
    assert fleet.host_keys[2] in known and fleet.host_keys[0] not in known
    assert victim not in cloud.instance_names()
    assert invoke("down", "-c", config).exit_code == 0
    assert cloud.instance_names() == [] and cloud.group_names() == []


