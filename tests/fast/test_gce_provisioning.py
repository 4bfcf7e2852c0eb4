"""Provider gce asks Compute Engine for what it accepts (issue 28, items 1, 2 and 7): a MIG mode
per provisioning model, decided in one place (gce_slice.provisioning), Google's TPU OS image and
the boot disk the generation takes, and `up --dry-run` saying both. The fake Compute Engine
refuses what the real API refuses (bulk mode from a STANDARD or SPOT template), through the real
google-cloud-compute client. In process, no terraform, no SSH."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from launcher.providers import gce_api, gce_slice
from payload.cloud import accelerators
from payload.config import parse_config
from payload.core.errors import UserError
from testbed.fakes.compute import FakeCompute
from tests.support.runners import invoke

PROJECT, REGION, ZONE = "test-project", "us-east5", "us-east5-b"
V6E_IMAGES = ("projects/ubuntu-os-accelerator-images/global/images/family/"
              "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")
TPU7X_IMAGES = ("projects/ubuntu-os-accelerator-images/global/images/family/"
                "ubuntu-accel-2404-amd64-tpu-tpu7x")


def _raw(name: str = "trillium", **cluster) -> dict:
    return {
        "name": name,
        "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                    "machine_type": "ct6e-standard-4t", "topology": "4x4",
                    "ssh_source_ranges": ["203.0.113.7/32"], **cluster},
        "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2"},
        "train": {"steps": 10, "batch_size": 16, "learning_rate": 1e-3, "engine": "jax"},
    }


def _write(folder: Path, raw: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# -- item 1: a mode Compute Engine takes, per provisioning model ---------------------------------

@pytest.mark.parametrize(("cluster", "model", "mode", "termination"), [
    ({}, "STANDARD", "INDIVIDUAL", None),
    ({"provisioning": "spot"}, "SPOT", "INDIVIDUAL", "DELETE"),
    ({"provisioning": "flex_start", "max_run_hours": 2}, "FLEX_START", "BULK", "DELETE"),
    ({"reservation": "my-reservation"}, "RESERVATION_BOUND", "BULK", "DELETE"),
    ({"max_run_hours": 3}, "STANDARD", "INDIVIDUAL", "DELETE"),
], ids=["on-demand", "spot", "flex-start", "reservation-bound", "on-demand-with-run-limit"])
def test_bulk_mode_only_where_compute_engine_takes_it(cluster, model, mode, termination):
    """Bulk mode "is only supported with instance templates that specify either a
    reservation-bound or flex-start provisioning model": on-demand and spot slices go in the
    individual mode, with the workload policy placing them; every VM Compute Engine may end is
    deleted (reservation-bound included)."""
    config = parse_config(_raw(**cluster))
    chosen = gce_slice.provisioning(config.cluster)
    assert (chosen.model, chosen.mode, chosen.termination) == (model, mode, termination)
    sent = gce_slice.slice_requests(config, user="me", public_key="ssh-ed25519 AAAA")
    assert sent.groups[0]["targetSizePolicy"] == {"mode": mode}
    scheduling = sent.template["properties"]["scheduling"]
    assert scheduling["provisioningModel"] == model
    assert scheduling.get("instanceTerminationAction") == termination
    variables = gce_slice.terraform_variables(config, user="me", public_key="ssh-ed25519 AAAA")
    assert (variables["provisioning_model"], variables["size_mode"],
            variables["termination_action"]) == (model, mode, termination)


def test_the_wait_for_every_vm_is_the_users_to_bound():
    """cluster.queue_hours bounds how long `up` waits; left out, a bulk request (which bills
    nothing while it waits) waits as gcp's queued requests do, an individual one (whose VMs
    made meanwhile bill) half an hour."""
    flex = parse_config(_raw(provisioning="flex_start", max_run_hours=2)).cluster
    assert gce_slice.provisioning(flex).wait_s == 24 * 3600
    assert gce_slice.provisioning(parse_config(_raw()).cluster).wait_s == 1800
    bounded = parse_config(_raw(provisioning="flex_start", max_run_hours=2, queue_hours=3))
    assert gce_slice.provisioning(bounded.cluster).wait_s == 3 * 3600
    for bad in (0, -1, "2", True, 24 * 31):
        with pytest.raises(UserError, match=r"cluster\.queue_hours"):
            parse_config(_raw(queue_hours=bad))


def test_the_fake_refuses_bulk_mode_from_a_standard_template_as_the_api_does(monkeypatch):
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    with FakeCompute() as fake:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, fake.endpoint)
        fake.set_timing(op_polls=0)
        clients = gce_api.clients()
        for name, model in (("standard", "STANDARD"), ("flex", "FLEX_START")):
            clients.templates.insert(project=PROJECT, region=REGION, instance_template_resource=
                                     compute_v1.InstanceTemplate(name=name, properties={
                                         "machine_type": "ct6e-standard-4t",
                                         "scheduling": {"provisioning_model": model}})).result()

        def group(name: str, template: str) -> compute_v1.InstanceGroupManager:
            return compute_v1.InstanceGroupManager.from_json(json.dumps({
                "name": name, "baseInstanceName": name, "targetSize": 2,
                "versions": [{"instanceTemplate": f"projects/{PROJECT}/regions/{REGION}/"
                                                  f"instanceTemplates/{template}"}],
                "targetSizePolicy": {"mode": "BULK"}}))

        with pytest.raises(gexc.BadRequest) as refused:
            clients.groups.insert(project=PROJECT, region=REGION,
                                  instance_group_manager_resource=group("g1", "standard"))
        assert "Invalid value for field 'resource.targetSizePolicy.mode': 'BULK'" in str(
            refused.value)
        assert refused.value.errors[0]["reason"] == "invalid"
        assert fake.group_names() == []
        clients.groups.insert(project=PROJECT, region=REGION,
                              instance_group_manager_resource=group("g2", "flex")).result()
        assert fake.group_names() == ["g2"]


# -- item 2: an image that sees the TPU, a boot disk that holds the environment ------------------

@pytest.mark.parametrize(("machine", "topology", "zone", "image", "disk"), [
    ("ct6e-standard-4t", "4x4", "us-east5-b", V6E_IMAGES, "hyperdisk-balanced"),
    ("ct5p-hightpu-4t", "2x2x1", "us-east5-a", V6E_IMAGES, "pd-balanced"),
    ("tpu7x-standard-4t", "2x2x1", "us-central1-c", TPU7X_IMAGES, "hyperdisk-balanced"),
])
def test_each_generation_boots_googles_tpu_image_on_the_disk_it_takes(machine, topology, zone,
                                                                      image, disk):
    config = parse_config(_raw(machine_type=machine, topology=topology, zone=zone))
    assert config.cluster.boot_image == image and config.cluster.image_note is None
    sent = gce_slice.slice_requests(config, user="me", public_key="ssh-ed25519 AAAA")
    assert sent.template["properties"]["disks"] == [{"boot": True, "autoDelete": True,
                                                     "initializeParams": {
                                                         "sourceImage": image,
                                                         "diskType": disk,
                                                         "diskSizeGb": "100"}}]
    variables = gce_slice.terraform_variables(config, user="me", public_key="ssh-ed25519 AAAA")
    assert (variables["image"], variables["boot_disk_type"], variables["boot_disk_gb"]) == (
        image, disk, 100)


@pytest.mark.parametrize(("image", "note"), [
    (V6E_IMAGES, None),
    ("projects/ubuntu-os-accelerator-images/global/images/"
     "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e-v20260803", None),  # a dated image of the family
    ("projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts", "is not one of Google's "
     "TPU images"),
    (TPU7X_IMAGES, "is Google's TPU image for another generation"),
    ("global/images/my-own", "is not one of Google's TPU images"),
])
def test_a_boot_image_that_may_not_see_the_tpu_is_named(image, note):
    said = accelerators.image_note(image, "v6e")
    assert (said is None) if note is None else (note in said and "vfio-pci" in said), said


def test_the_dry_run_warns_about_an_image_that_is_not_a_tpu_image(tmp_path, tpuctl_home):
    path = _write(tmp_path, _raw(image="projects/ubuntu-os-cloud/global/images/family/"
                                       "ubuntu-2204-lts"))
    out = invoke("up", "-c", path, "--dry-run")
    assert out.exit_code == 0, out.output
    warning = [line for line in out.output.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "is not one of Google's TPU images" in warning[0]
    assert V6E_IMAGES in warning[0]  # what the default would be
    assert not tpuctl_home.exists()


# -- the acceptance's dry runs: the mode and the image, before anything is made ------------------

def test_the_dry_runs_of_an_on_demand_v6e_and_a_flex_start_tpu7x_say_mode_and_image(
        tmp_path, tpuctl_home):
    v6e = _write(tmp_path / "v6e", _raw())
    out = invoke("up", "-c", v6e, "--dry-run")
    assert out.exit_code == 0, out.output
    assert "provisioning STANDARD: the MIG in individual mode" in out.output
    assert "bill while the others wait" in out.output
    assert f"image {V6E_IMAGES} (Google's TPU image for TPU v6e); boot disk 100 GB " \
           "hyperdisk-balanced" in out.output
    assert "warning:" not in out.output

    tpu7x = _write(tmp_path / "tpu7x", _raw(
        "ironwood", zone="us-central1-c", machine_type="tpu7x-standard-4t", topology="2x2x1",
        provisioning="flex_start", max_run_hours=2))
    out = invoke("up", "-c", tpu7x, "--dry-run")
    assert out.exit_code == 0, out.output
    assert "provisioning FLEX_START: the MIG in bulk mode makes its VM once it can" in out.output
    assert "nothing bills while it waits for capacity (up to 24 h, cluster.queue_hours)" in (
        out.output)
    assert f"image {TPU7X_IMAGES} (Google's TPU image for TPU tpu7x)" in out.output
    assert "DELETE when Compute Engine ends one" in out.output
    assert "4 chips of TPU tpu7x, 2 TensorCores each, one device per TensorCore: 8 devices" in (
        out.output)
    assert "JAX then sees the 8 devices" in out.output
    assert not tpuctl_home.exists()
