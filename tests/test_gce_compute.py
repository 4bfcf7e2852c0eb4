"""Provider gce against stand-ins: real terraform applies tests/terraform_twin_slice (whose
resources send what the google provider would), Compute Engine is tests/fakes/compute.py driven
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
from typer.testing import CliRunner

from launcher.cli import app
from launcher.providers import gce, gce_api, gcp_site
from payload.core.errors import UserError
from tests import helpers
from tests.fakes.compute import FakeCompute, quota_exceeded
from tests.fakes.tpu_api import Worker
from tests.helpers import invoke

runner = CliRunner()
PROJECT, REGION, ZONE = "test-project", "us-east5", "us-east5-b"
TWIN = Path(__file__).resolve().parent / "terraform_twin_slice"


# -- the fake alone, with the real client --------------------------------------------------------


@pytest.fixture
def fake(monkeypatch):
    with FakeCompute() as api:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, api.endpoint)
        api.set_workers([Worker("10.0.0.2", external_ip="34.0.0.2"), Worker("10.0.0.3")])
        yield api


def _insert(kind: str, body: dict):
    """Insert through the real compute_v1 client and wait, as the google provider does; the
    finished operation (its error, if any, in `error.errors`)."""
    import json

    from google.cloud import compute_v1

    argument, message_type = {
        "templates": ("instance_template_resource", compute_v1.InstanceTemplate),
        "groups": ("instance_group_manager_resource", compute_v1.InstanceGroupManager)}[kind]
    client = getattr(gce_api.clients(), kind)
    operation = client.insert(project=PROJECT, region=REGION,
                              **{argument: message_type.from_json(json.dumps(body))})
    try:
        operation.result()
    except Exception as exc:
        operation.raised = exc
    return operation


def _template(api: gce_api.ComputeApi, name: str = "t") -> None:
    _insert("templates", {"name": name, "properties": {
        "machineType": "ct6e-standard-4t", "labels": {"tpuctl-run": "r"},
        "scheduling": {"provisioningModel": "FLEX_START", "maxRunDuration": {"seconds": "3600"}}}})


def _group_body(name: str = "g", size: int = 2) -> dict:
    return {"name": name, "baseInstanceName": name, "targetSize": size,
            "instanceTemplate": f"projects/{PROJECT}/regions/{REGION}/instanceTemplates/t",
            "targetSizePolicy": {"mode": "BULK"},
            "distributionPolicy": {"targetShape": "ANY_SINGLE_ZONE",
                                   "zones": [{"zone": f"zones/{ZONE}"}]}}


def test_a_bulk_group_waits_for_capacity_then_makes_every_vm_at_once(fake):
    api = gce_api.ComputeApi(project=PROJECT, region=REGION)
    _template(api)
    fake.set_capacity(after_polls=2)
    _insert("groups", _group_body())
    first = api.group("g")
    assert first.bulk_in_progress and "ZONE_RESOURCE_POOL_EXHAUSTED" in first.last_error
    assert fake.instance_names() == []  # none of them while waiting: all or none
    api.group("g")
    done = api.group("g")
    assert not done.bulk_in_progress and done.last_error is None
    vms = api.managed_instances("g")
    assert len(vms) == 2 and len(fake.instance_names()) == 2
    assert [vm.name for vm in vms] == sorted(vm.name for vm in vms)
    assert vms[0].max_run_s == 3600.0 and vms[0].labels == {"tpuctl-run": "r"}
    # Host keys are published after RUNNING; until then the path holds nothing (404).
    fake.set_timing(host_key_delay_s=60)
    assert api.host_keys(vms[0]) in ({}, api.host_keys(vms[0]))
    # A template in use cannot be deleted; deleting the MIG takes its VMs with it.
    with pytest.raises(UserError, match="already being used"):
        api.delete("templates", "t")
    assert api.delete("groups", "g") and not api.delete("groups", "g")
    assert fake.instance_names() == []


def test_guest_attributes_appear_some_seconds_after_running(fake):
    fake.set_timing(boot_polls=0, host_key_delay_s=30)
    api = gce_api.ComputeApi(project=PROJECT, region=REGION)
    fake.add_instance(PROJECT, ZONE, "solo", worker=Worker("10.0.0.9", host_keys={
        "ssh-ed25519": "AAAAkey"}))
    vm = api.instance(ZONE, "solo")
    assert vm.status == "RUNNING" and api.host_keys(vm) == {}
    fake.advance_clock(31)
    assert api.host_keys(vm) == {"ssh-ed25519": "AAAAkey"}
    # instances.get and getGuestAttributes spoke the real paths.
    assert fake.requests("instances.getGuestAttributes")[-1].query["queryPath"] == "hostkeys/"


def test_a_quota_error_arrives_in_the_operation_with_its_real_shape(fake):
    api = gce_api.ComputeApi(project=PROJECT, region=REGION)
    _template(api)
    fake.fail("regionInstanceGroupManagers.insert", quota_exceeded("TPU_V6E", REGION))
    failed = _insert("groups", _group_body())
    # The client raises with the HTTP reason only; what went wrong is in error.errors[].
    assert failed.http_error_status_code == 403 and "FORBIDDEN" in str(failed.raised)
    error = failed.error.errors[0]
    assert error.code == "QUOTA_EXCEEDED" and "Quota 'TPU_V6E' exceeded" in error.message
    assert error.error_details[0].quota_info.metric_name == "compute.googleapis.com/tpu_v6e"
    assert fake.group_names() == []
    assert not hasattr(_insert("groups", _group_body()), "raised")  # the next one goes through


def test_doctor_says_in_one_line_each_what_to_fix(fake, tmp_path, tpuctl_home):
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump({
        "name": "trillium", "output_dir": str(tmp_path / "out"),
        "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                    "machine_type": "ct6e-standard-4t", "topology": "4x4"},
        "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2"},
        "train": {"engine": "jax", "steps": 1, "batch_size": 16, "learning_rate": 1e-3}}))
    fake.set_machine_types(["ct5p-hightpu-4t"], zone=ZONE)
    fake.add_group(PROJECT, REGION, "trillium")
    result = runner.invoke(app, ["doctor", "-c", str(path)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("ok    Google Cloud credentials")
    assert f"fix   ct6e-standard-4t offered in {ZONE}: {ZONE} does not offer" in lines[1]
    assert any(line.startswith("skip  TPU quota") for line in lines)
    assert any(line.startswith("skip  the run's names are free") for line in lines)
    assert any(line.startswith("fix   SSH source ranges") for line in lines)
    fake.set_machine_types(["ct6e-standard-4t"], zone=ZONE)
    again = runner.invoke(app, ["doctor", "-c", str(path)]).output
    assert "fix   the run's names are free or its own: managed instance group trillium" in again
    assert "not made by tpuctl" in again


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
        helpers.attach_fleet(api, fleet)
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
    assert "Resources: 8 destroyed" in down.output  # what it made (and its update stand-ins)
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


def test_up_without_terraform_is_one_line_and_makes_nothing(fake, tmp_path, tpuctl_home,
                                                            monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump({
        "name": "trillium", "output_dir": str(tmp_path / "out"),
        "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                    "machine_type": "ct6e-standard-4t", "topology": "4x4",
                    "ssh_source_ranges": ["203.0.113.7/32"]},
        "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2"},
        "train": {"engine": "jax", "steps": 1, "batch_size": 16, "learning_rate": 1e-3}}))
    result = runner.invoke(app, ["up", "-c", str(path)])
    assert result.exit_code != 0
    assert "Terraform is not installed" in str(result.exception)
    assert fake.requests() == [] and not tpuctl_home.exists()


@pytest.mark.parametrize(("error", "said", "hint"), [
    ("Forbidden", "the Compute Engine API is not enabled in project p",
     "gcloud services enable compute.googleapis.com --project p"),
    ("QuotaForbidden", "reading x: Quota 'TPU_V6E' exceeded. Limit: 0.0",
     "ask for more TPU quota"),
    ("PermissionDenied", "reading x: permission denied: no", "roles/compute.instanceAdmin.v1"),
    ("NotFound", "reading x: Compute Engine said 404: gone", None),
])
def test_compute_errors_read_as_one_line_with_what_to_do(error, said, hint):
    from google.api_core import exceptions as gexc

    raised = {"Forbidden": gexc.Forbidden("Compute Engine API has not been used in project p"),
              "QuotaForbidden": gexc.Forbidden("Quota 'TPU_V6E' exceeded.  Limit: 0.0"),
              "PermissionDenied": gexc.PermissionDenied("no"),
              "NotFound": gexc.NotFound("gone")}[error]
    with pytest.raises(UserError) as caught, gce_api.api_errors("p", "reading x"):
        raise raised
    assert caught.value.message == said
    assert (hint in caught.value.hint) if hint else caught.value.hint is None
