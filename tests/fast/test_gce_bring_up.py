"""A gce slice's bring-up made explicit (issue 28, item 3): what libtpu on each Compute Engine VM
is told about the slice (payload.cloud.accelerators.slice_env, as GKE's TPU device plugin tells
its nodes), set by the launcher in every worker's train command, and checked by `doctor` against
the slice Compute Engine shows. In process: the pure table, the planned fleet and `train
--dry-run`, and `doctor` against the fake Compute Engine (real client); no terraform, no SSH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launcher.providers import gce_api, gce_owned
from payload.cloud import accelerators
from testbed.fakes.compute import FakeCompute, no_capacity
from testbed.fakes.tpu_api import Worker
from tests.support.runners import invoke

PROJECT, REGION, ZONE = "test-project", "us-east5", "us-east5-b"


# GKE's TPU device plugin's own table (InitEnvs) for these shapes: host bounds, chips per host,
# wraparound. The launcher must tell libtpu the same on Compute Engine.
@pytest.mark.parametrize(("machine", "topology", "accelerator", "hosts", "per_host", "wrap"), [
    ("ct6e-standard-4t", "4x4", "v6e-16", "2,2,1", "2,2,1", "false,false,false"),
    ("ct6e-standard-4t", "2x4", "v6e-8", "1,2,1", "2,2,1", "false,false,false"),
    ("ct6e-standard-8t", "2x4", "v6e-8", "1,1,1", "2,4,1", "false,false,false"),
    ("ct6e-standard-4t", "8x16", "v6e-128", "4,8,1", "2,2,1", "false,true,false"),
    ("ct6e-standard-4t", "16x16", "v6e-256", "8,8,1", "2,2,1", "true,true,false"),
    ("ct5p-hightpu-4t", "2x4x4", "v5p-64", "1,2,4", "2,2,1", "false,false,false"),
    ("tpu7x-standard-4t", "2x2x1", "tpu7x-8", "1,1,1", "2,2,1", "false,false,false"),
    ("tpu7x-standard-4t", "2x2x2", "tpu7x-16", "1,1,2", "2,2,1", "false,false,false"),
    ("tpu7x-standard-4t", "4x4x4", "tpu7x-128", "2,2,4", "2,2,1", "true,true,true"),
    ("tpu7x-standard-1t", "1x1x1", "tpu7x-2", "1,1,1", "1,1,1", "false,false,false"),
])
def test_libtpu_is_told_the_slice_as_gke_tells_it(machine, topology, accelerator, hosts,
                                                  per_host, wrap):
    acc = accelerators.compute_slice(machine, topology)
    names = tuple(f"10.0.0.{i + 2}" for i in range(acc.hosts))
    env = accelerators.slice_env(machine, topology, worker=acc.hosts - 1, hostnames=names)
    assert list(env) == list(accelerators.SLICE_ENV_NAMES)
    assert env["TPU_SKIP_MDS_QUERY"] == "true"
    assert (env["TPU_ACCELERATOR_TYPE"], env["TPU_TOPOLOGY"], env["TPU_HOST_BOUNDS"],
            env["TPU_CHIPS_PER_HOST_BOUNDS"], env["TPU_TOPOLOGY_WRAP"]) == (
        accelerator, topology, hosts, per_host, wrap)
    assert env["TPU_WORKER_ID"] == str(acc.hosts - 1)
    assert env["TPU_WORKER_HOSTNAMES"] == ",".join(names)
    with pytest.raises(ValueError):  # a worker list that is not the slice's is a bug
        accelerators.slice_env(machine, topology, worker=0, hostnames=(*names, "extra"))


def test_jax_sees_two_devices_per_tpu7x_chip_and_one_elsewhere():
    assert accelerators.compute_slice("tpu7x-standard-4t", "2x2x2").jax_devices == 16
    assert accelerators.compute_slice("ct6e-standard-4t", "4x4").jax_devices == 16
    assert accelerators.compute_slice("ct5p-hightpu-4t", "2x2x1").jax_devices == 4
    assert accelerators.accelerator("v4-8").jax_devices == 4  # the TPU API's types too


def _config(folder: Path, **cluster) -> Path:
    raw = {"name": "trillium", "output_dir": "gs://b/trillium",
           "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                       "machine_type": "ct6e-standard-4t", "topology": "4x4",
                       "ssh_source_ranges": ["203.0.113.7/32"], **cluster},
           "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2", "size": "tiny"},
           "train": {"steps": 10, "batch_size": 16, "learning_rate": 1e-3, "engine": "jax"}}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_every_worker_of_a_slice_is_told_its_place_in_the_train_stage_only(tmp_path,
                                                                        tpuctl_home):
    plan = invoke("train", "-c", _config(tmp_path), "--dry-run")
    assert plan.exit_code == 0, plan.output
    train = [line for line in plan.output.splitlines() if " -m payload train " in line]
    assert len(train) == 4, plan.output
    order = ",".join(f"<VM {i} internal address>" for i in range(4))
    for index, line in enumerate(train):
        assert line.lstrip().startswith(f"worker-{index}$"), line
        assert f"TPU_WORKER_ID={index} " in line
        assert "TPU_SKIP_MDS_QUERY=true" in line and "TPU_HOST_BOUNDS=2,2,1" in line
        assert "TPU_ACCELERATOR_TYPE=v6e-16" in line and "TPU_TOPOLOGY=4x4" in line
        assert order in line.replace("'", "")  # the same order on every VM
    others = [line for line in plan.output.splitlines()
              if "$" in line and " -m payload train " not in line]
    assert others and not any("TPU_WORKER_ID" in line for line in others)


def test_a_one_vm_slice_names_itself_localhost_as_gke_does(tmp_path, tpuctl_home):
    config = _config(tmp_path, machine_type="ct6e-standard-8t", topology="2x4")
    plan = invoke("train", "-c", config, "--dry-run")
    assert plan.exit_code == 0, plan.output
    train = [line for line in plan.output.splitlines() if " -m payload train " in line]
    assert len(train) == 1 and "TPU_WORKER_HOSTNAMES=localhost" in train[0]
    assert "TPU_CHIPS_PER_HOST_BOUNDS=2,4,1" in train[0]


def test_the_tpu_api_provider_tells_libtpu_nothing(tmp_path, tpuctl_home):
    """A Cloud TPU VM reads the same facts from its own tpu-env metadata: gcp sets none."""
    raw = yaml.safe_load(_config(tmp_path).read_text())
    raw["cluster"] = {"provider": "gcp", "project": PROJECT, "zone": "us-east5-b",
                      "accelerator_type": "v6e-16", "ssh_source_ranges": ["203.0.113.7/32"]}
    path = tmp_path / "gcp.yaml"
    path.write_text(yaml.safe_dump(raw))
    plan = invoke("train", "-c", path, "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert "TPU_WORKER_ID" not in plan.output and "TPU_SKIP_MDS_QUERY" not in plan.output


# -- doctor: the slice is what libtpu will be told -----------------------------------------------

@pytest.fixture
def fake(tpuctl_home, monkeypatch):
    with FakeCompute() as api:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, api.endpoint)
        api.set_timing(op_polls=0, boot_polls=0, topology_polls=1)
        api.set_workers([Worker(f"10.0.0.{i}") for i in range(2, 6)])
        yield api


def _slice(fake, *, template_model: str = "STANDARD") -> None:
    """The run's 4-VM slice, made through the real client, recorded as the run's own."""
    from google.cloud import compute_v1

    api = gce_api.ComputeApi(project=PROJECT, region=REGION)
    clients = api.clients
    clients.policies.insert(project=PROJECT, region=REGION, resource_policy_resource=(
        compute_v1.ResourcePolicy.from_json(json.dumps({
            "name": "trillium-topology", "workloadPolicy": {
                "type": "HIGH_THROUGHPUT", "acceleratorTopology": "4x4"}})))).result()
    clients.templates.insert(project=PROJECT, region=REGION, instance_template_resource=(
        compute_v1.InstanceTemplate.from_json(json.dumps({
            "name": "trillium-00000000000000000000000001", "properties": {
                "machineType": "ct6e-standard-4t",
                "scheduling": {"provisioningModel": template_model}}})))).result()
    clients.groups.insert(project=PROJECT, region=REGION, instance_group_manager_resource=(
        compute_v1.InstanceGroupManager.from_json(json.dumps({
            "name": "trillium", "baseInstanceName": "trillium", "targetSize": 4,
            "versions": [{"instanceTemplate": f"projects/{PROJECT}/regions/{REGION}/"
                                              "instanceTemplates/"
                                              "trillium-00000000000000000000000001"}],
            "distributionPolicy": {"zones": [{"zone": f"zones/{ZONE}"}]},
            "resourcePolicies": {"workloadPolicy": f"projects/{PROJECT}/regions/{REGION}/"
                                                   "resourcePolicies/trillium-topology"}})))
    ).result()
    owned = gce_owned.Ownership("trillium", api)
    owned.record("groups", "trillium", api.group("trillium").uid)


def _doctor_line(path: Path) -> str:
    result = invoke("doctor", "-c", path)
    line = [x for x in result.output.splitlines() if "the slice forms" in x]
    assert len(line) == 1, result.output
    return line[0]


def test_doctor_checks_the_slice_libtpu_will_be_told_about(fake, tmp_path):
    path = _config(tmp_path)
    assert _doctor_line(path).startswith("ok    the slice forms (VMs, topology, what libtpu "
                                         "is told): no slice yet")
    fake.set_capacity(ZONE, after_polls=None, vms=2)  # two VMs made, two wait for capacity
    _slice(fake)
    line = _doctor_line(path)
    assert line.startswith("fix ") and "has 2 RUNNING VMs of the 4" in line, line
    fake.set_capacity(ZONE, after_polls=0)
    gce_api.ComputeApi(project=PROJECT, region=REGION).group("trillium")  # the rest come
    line = _doctor_line(path)
    assert line.startswith("ok "), line
    assert "topology 4x4 ACTIVE" in line
    # The VMs' internal addresses in worker order: the VMs by name, as the fleet orders them.
    vms = gce_api.ComputeApi(project=PROJECT, region=REGION).managed_instances("trillium")
    assert len({vm.internal_ip for vm in vms}) == 4
    assert f"TPU_WORKER_HOSTNAMES={','.join(vm.internal_ip for vm in vms)}," in line
    assert "TPU_HOST_BOUNDS=2,2,1" in line and "JAX should see 16 devices" in line
    fake.fail_topology("trillium", no_capacity(ZONE))
    line = _doctor_line(path)
    assert line.startswith("fix ") and "topology 4x4 is FAILED" in line, line
