"""Several slices on gce (issue 35): N managed instance groups in the one Terraform state of
infra/modules/tpu_slice, each with its own workload policy, brought up all or none, shown,
billed, recovered and taken down as one, and never a hand-made MIG of one of their names touched.

Compute Engine is testbed/fakes/compute.py, driven by the real google-cloud-compute client;
`up` and `down` run real terraform on the twin (tests/terraform_twin_slice). No VM is reached
over SSH: each VM is an address with a published host key. e2e only because terraform is a
subprocess; nothing trains.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from launcher.providers import gce, gce_api, gcp_site
from testbed.fakes.compute import ComputeError, FakeCompute
from testbed.fakes.tpu_api import Worker
from tests.support.cloud_owned import HOST_KEY
from tests.support.paths import TERRAFORM_TWIN_SLICE
from tests.support.runners import invoke

PROJECT, REGION, ZONE = "test-project", "us-east5", "us-east5-b"
SLICES = ("trillium-0", "trillium-1")
POLICIES = ("trillium-0-topology", "trillium-1-topology")


@pytest.fixture
def cloud(tpuctl_home, monkeypatch):
    if shutil.which("terraform") is None:
        pytest.skip("needs terraform on PATH (make setup-terraform)")
    monkeypatch.setattr(gcp_site, "POLL_S", 0.02)
    monkeypatch.setattr(gce, "SLICE_MODULE", TERRAFORM_TWIN_SLICE)
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/dev/null")
    with FakeCompute(host="127.0.0.1") as api:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, api.endpoint)
        # Two VMs per v6e 2x4 slice, every VM an address of its own with its host key.
        api.set_workers([Worker(f"10.9.0.{i}", host_keys={"ssh-ed25519": HOST_KEY})
                         for i in range(2, 10)])
        api.set_timing(boot_polls=1, op_polls=1, topology_polls=0)
        yield api


def two_slices(folder: Path) -> Path:
    raw = {
        "name": "trillium", "output_dir": str(folder / "out"),
        "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                    "machine_type": "ct6e-standard-4t", "topology": "2x4", "slices": 2,
                    "provisioning": "flex_start", "max_run_hours": 2,
                    "ssh_source_ranges": ["10.0.0.0/8"], "user": "root",
                    "identity_file": str(folder / "id_ed25519"), "python": sys.executable},
        "data": {"corpus": "gs://b/c.txt", "seq_len": 32},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"engine": "jax", "steps": 4, "batch_size": 8, "learning_rate": 1e-3},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def provider(config: Path) -> gce.GceProvider:
    from payload.config import load_config

    return gce.GceProvider.from_config(load_config(config), num_workers=None)


def uids(api: FakeCompute) -> dict[str, str]:
    found = gce_api.ComputeApi(project=PROJECT, region=REGION)
    return {name: str(found.group(name).uid) for name in api.group_names()}


def test_two_slices_come_up_as_two_migs_each_with_its_policy_and_go_down_together(
        cloud, tmp_path):
    config = two_slices(tmp_path)
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, up.output
    assert "slices trillium-0 and trillium-1 are RUNNING in us-east5-b: 4 VM(s), 2 per slice" \
        in up.output
    # One MIG per slice, each placed by a workload policy of its own; one template for both.
    assert sorted(cloud.group_names()) == list(SLICES)
    assert sorted(cloud.policy_names()) == list(POLICIES)
    assert len(cloud.template_names()) == 1
    groups = {r.body["name"]: r.body for r in cloud.requests("regionInstanceGroupManagers.insert")}
    for group, policy in zip(SLICES, POLICIES, strict=True):
        assert groups[group]["resourcePolicies"]["workloadPolicy"].endswith(
            f"/resourcePolicies/{policy}")
        assert groups[group]["targetSize"] == 2 and groups[group]["baseInstanceName"] == group
    # The fleet: every slice's VMs, slice by slice, each slice's libtpu told its own VMs, and
    # every worker the four MEGASCALE values (slice 0's worker 0 coordinates).
    run = provider(config)
    fleet = run.fleet()
    assert fleet.hardware.slices == 2 and len(fleet.workers) == 4
    by_slice = [[vm.internal_ip for vm in gce_api.ComputeApi(
        project=PROJECT, region=REGION).managed_instances(g)] for g in SLICES]
    assert [w.address for w in fleet.workers] == by_slice[0] + by_slice[1]
    for i, worker in enumerate(fleet.workers):
        env = dict(worker.slice_env)
        assert env["TPU_WORKER_ID"] == str(i % 2)
        assert env["TPU_WORKER_HOSTNAMES"] == ",".join(by_slice[i // 2])
    from payload.training.strategy import trainer_env

    told = dict(trainer_env(fleet.hardware, 4, "jax", index=3, addresses=[
        f"{w.address}:{w.coordination_port}" for w in fleet.workers]))
    assert told["MEGASCALE_SLICE_ID"] == "1" and told["MEGASCALE_NUM_SLICES"] == "2"
    assert told["MEGASCALE_COORDINATOR_ADDRESS"] == by_slice[0][0]
    # A job's record keeps both MIGs' ids, slice by slice.
    made = uids(cloud)
    assert run.site.uid == f"{made['trillium-0']},{made['trillium-1']}"
    # status shows each slice, workers numbered across the slices, and each slice's cost.
    status = invoke("status", "-c", config)
    assert status.exit_code == 0, status.output
    for group in SLICES:
        assert f"slice {group} (v6e-8 = 2x4 on ct6e-standard-4t in {ZONE}): RUNNING" \
            in status.output
    assert "worker-3:" in status.output and status.output.count("  cost: ") == 2
    # billing.json lists both slices; billing says both are up.
    out = str(tmp_path / "out")
    run.record_billing(out)
    from payload.cloud import budget

    assert {n["uid"] for n in budget.read_nodes(out)} == set(made.values())
    assert run.billing().startswith("slices trillium-0 and trillium-1 are still up")
    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert "nothing of run trillium is left billing" in down.output
    assert cloud.group_names() == cloud.policy_names() == cloud.template_names() == []
    assert cloud.firewall_names() == []


def test_a_slice_that_fails_takes_every_slice_down_with_it(cloud, tmp_path):
    """All or none: slice 1's topology FAILED while slice 0 came up; `up` destroys both through
    the saved-plan path, and nothing of the run is left."""
    config = two_slices(tmp_path)
    cloud.fail_topology("trillium-1", ComputeError(503, "the slice's ICI links did not form"))
    up = invoke("up", "-c", config)
    assert up.exit_code != 0
    assert "the accelerator topology 2x4 of slice trillium-1 FAILED" in str(up.exception)
    assert "nothing of the slice is left billing" in str(up.exception)
    assert cloud.group_names() == cloud.policy_names() == cloud.template_names() == []
    assert cloud.instance_names() == [] and cloud.firewall_names() == []


def test_a_hand_made_mig_of_a_slice_name_stops_up_and_survives_down(cloud, tmp_path):
    config = two_slices(tmp_path)
    theirs = cloud.add_group(PROJECT, REGION, "trillium-1")
    up = invoke("up", "-c", config)
    assert up.exit_code != 0
    assert (f"managed instance group trillium-1 in {REGION} (id {theirs['id']}) was not made "
            "by tpuctl") in str(up.exception)
    assert cloud.requests("regionInstanceGroupManagers.insert") == []
    assert cloud.template_names() == [] and cloud.policy_names() == []
    down = invoke("down", "-c", config)
    assert down.exit_code != 0
    assert "managed instance group trillium-1" in str(down.exception)
    assert "was not made by tpuctl" in str(down.exception)
    assert str(theirs["id"]) == uids(cloud)["trillium-1"]  # the same one, untouched


def test_one_lost_vm_is_trouble_for_all_and_recover_replaces_every_slice(cloud, tmp_path):
    config = two_slices(tmp_path)
    assert invoke("up", "-c", config).exit_code == 0
    run = provider(config)
    run.fleet()
    before = uids(cloud)
    assert run.trouble() is None
    victim = next(n for n in cloud.instance_names() if n.startswith("trillium-1-"))
    cloud.preempt(victim)  # flex-start: deleted
    assert run.trouble() == ("slice trillium-1 lost a VM: 1 of its 2 left (Compute Engine "
                             "deletes a VM it takes back)")
    from payload.cloud import budget

    out = tmp_path / "out"
    run.record_billing(str(out))
    said: list[str] = []
    run.recover(said.append)
    # Both MIGs went (the running slice 0 too) and came back anew, every VM RUNNING.
    assert "deleting instance group trillium-0 (RUNNING, 2 of 2 VMs" in "\n".join(said)
    after = uids(cloud)
    assert sorted(after) == list(SLICES)
    assert all(after[g] != before[g] for g in SLICES)
    assert len(run.fleet().workers) == 4 and run.trouble() is None
    # The old MIGs' hours end in billing.json at their deletion.
    nodes = budget.read_nodes(str(out))
    assert all(n["deleted"] is not None for n in nodes if n["uid"] in before.values())
    assert invoke("down", "-c", config).exit_code == 0
    assert cloud.group_names() == []
