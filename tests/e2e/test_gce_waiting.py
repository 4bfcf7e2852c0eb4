"""`tpuctl up` on gce waits as Compute Engine does (issue 28, items 4 and 5): a MIG's insert is
DONE once the group exists, and quota or capacity then show in its bulk operation's last progress
check (or its instances' last attempts), which the wait line says; `up` returns only when every
VM runs and the applied accelerator topology is ACTIVE (its states are compute_v1's), stops at
once when it turns FAILED, waits no longer than cluster.queue_hours, and leaves nothing billing
when it gives up or is cancelled with Ctrl-C. Real terraform applies tests/terraform_twin_slice
against the fake Compute Engine (testbed/fakes/compute.py, real google-cloud-compute client); the
VMs are addresses with made-up host keys, no SSH."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from launcher.providers import gce, gce_api, gce_infra, gcp_site
from testbed.fakes.compute import FakeCompute, no_capacity, quota_exceeded
from testbed.fakes.tpu_api import Worker
from tests.support.paths import REPO
from tests.support.runners import invoke

PROJECT, REGION, ZONE = "test-project", "us-east5", "us-east5-b"
TWIN = REPO / "tests" / "terraform_twin_slice"


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


def _config(folder: Path, **cluster) -> Path:
    raw = {
        "name": "trillium", "output_dir": str(folder / "out"),
        "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                    "machine_type": "ct6e-standard-4t", "topology": "2x4",
                    "provisioning": "flex_start", "max_run_hours": 2,
                    "ssh_source_ranges": ["203.0.113.7/32"], "user": "root",
                    "python": sys.executable, **cluster},
        "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2"},
        "train": {"engine": "jax", "steps": 4, "batch_size": 8, "learning_rate": 1e-3},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _nothing_left(cloud) -> bool:
    return (cloud.group_names() == cloud.instance_names() == cloud.template_names()
            == cloud.policy_names() == cloud.firewall_names() == [])


def _said(result) -> str:
    return result.output + (str(result.exception) if result.exception else "")


def _at_pause(monkeypatch, number: int, action) -> None:
    """`action()` at `up`'s wait's `number`th pause between two looks at the slice."""
    pauses = []

    def pause() -> None:
        pauses.append(1)
        if len(pauses) == number:
            action()

    monkeypatch.setattr(gce_infra, "pause", pause)


# -- item 4: quota and capacity as Compute Engine reports them -----------------------------------

def test_a_bulk_request_short_of_quota_waits_and_says_so(cloud, tmp_path, monkeypatch):
    """The insert is DONE once the group exists; the quota shows in the bulk operation's last
    progress check while the MIG keeps waiting, and the wait line says it, with what to do."""
    cloud.set_quota(quota_exceeded("TPU_V6E", REGION, limit=4.0))
    _at_pause(monkeypatch, 3, lambda: cloud.set_quota(None))  # quota granted meanwhile
    up = invoke("up", "-c", _config(tmp_path))
    assert up.exit_code == 0, _said(up)
    assert not cloud.requests("regionInstanceGroupManagers.insert")[0].body.get("error")
    assert ("slice trillium: waiting for quota for all 2 VMs at once (QUOTA_EXCEEDED: Quota "
            "'TPU_V6E' exceeded. Limit: 4.0 in region us-east5.)") in up.output
    assert "keeps the request until the quota allows it" in up.output
    assert "(nothing bills meanwhile)" in up.output
    assert "slice trillium is RUNNING in us-east5-b: 2 VM(s)" in up.output
    assert invoke("down", "-c", _config(tmp_path)).exit_code == 0 and _nothing_left(cloud)


def test_an_on_demand_slice_says_which_vms_wait_and_why(cloud, tmp_path):
    """Individual mode: the VMs Compute Engine could make run (and bill) while the others wait;
    why they wait is in their last creation attempt."""
    cloud.set_capacity(ZONE, after_polls=6, vms=1)
    config = _config(tmp_path, provisioning="on_demand", max_run_hours=None)
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, _said(up)
    group = cloud.requests("regionInstanceGroupManagers.insert")[0].body
    assert group["targetSizePolicy"] == {"mode": "INDIVIDUAL"}
    assert ("creating: 1 of 2 VMs RUNNING (RUNNING), topology INCOMPLETE; waiting for capacity "
            "for the rest (ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: The zone "
            "'projects/p/zones/us-east5-b' does not have enough resources") in up.output
    assert invoke("down", "-c", config).exit_code == 0 and _nothing_left(cloud)


def test_a_flex_start_wait_ends_at_queue_hours_and_leaves_nothing(cloud, tmp_path):
    cloud.set_capacity(ZONE, after_polls=None)  # never
    config = _config(tmp_path, queue_hours=0.0005)  # 1.8 s
    up = invoke("up", "-c", config)
    said = _said(up)
    assert up.exit_code != 0
    assert "slice trillium was not ready after 0 minutes (waiting for capacity for all 2 VMs " \
           "at once (ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in said
    assert "nothing of the slice is left billing" in said
    assert _nothing_left(cloud)


def test_ctrl_c_while_waiting_cancels_the_request_and_leaves_nothing(cloud, tmp_path,
                                                                      monkeypatch):
    from launcher.providers import provider_for
    from payload.config import load_config

    cloud.set_capacity(ZONE, after_polls=None)

    def ctrl_c() -> None:
        raise KeyboardInterrupt

    _at_pause(monkeypatch, 3, ctrl_c)
    provider = provider_for(load_config(_config(tmp_path)))
    said = []
    with pytest.raises(KeyboardInterrupt):
        provider.up(said.append)
    assert any(line.startswith("slice trillium: waiting for capacity") for line in said)
    assert "cancelled (Ctrl-C): removing the request and whatever it made" in "\n".join(said)
    assert said[-1] == "nothing of the slice is left billing"
    assert cloud.requests("regionInstanceGroupManagers.delete")
    assert _nothing_left(cloud)


# -- item 5: ready means the applied topology is ACTIVE ------------------------------------------

def test_up_returns_once_the_applied_topology_is_active(cloud, tmp_path):
    from google.cloud import compute_v1

    config = _config(tmp_path)
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, _said(up)
    waits = [line for line in up.output.splitlines() if line.startswith("slice trillium: ")]
    # Every state said is one compute_v1 knows; the VMs ran before the topology was ACTIVE,
    # and `up` went on waiting through ACTIVATING.
    known = set(compute_v1.InstanceGroupManagerStatusAcceleratorTopology.State.__members__)
    said = {line.rsplit("topology ", 1)[1].split()[0] for line in waits if "topology " in line}
    assert said and said <= known, said
    assert waits[-1] == "slice trillium: RUNNING, 2 of 2 VMs, topology ACTIVATING"
    group = gce_api.ComputeApi(project=PROJECT, region=REGION).group("trillium")
    assert group.topology_state == "ACTIVE"
    assert invoke("down", "-c", config).exit_code == 0


def test_a_failed_topology_ends_up_and_leaves_nothing(cloud, tmp_path, monkeypatch):
    """All VMs run, the topology is ACTIVATING, then FAILED: `up` says so and removes it."""
    cloud.set_timing(topology_polls=50)
    _at_pause(monkeypatch, 3, lambda: cloud.fail_topology("trillium", no_capacity(ZONE)))
    up = invoke("up", "-c", _config(tmp_path))
    said = _said(up)
    assert up.exit_code != 0
    assert "the accelerator topology 2x4 of slice trillium FAILED (ZONE_RESOURCE_POOL_" in said
    assert "nothing of the slice is left billing" in said
    assert _nothing_left(cloud)
