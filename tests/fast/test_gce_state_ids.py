"""What tpuctl records as a gce run's own, read from Terraform's state (issue 27, items 1-3), in
process: the google provider's state says which resource it made (a MIG's numeric id, a
template's unique link, a creation time), and only that one is recorded; a tainted entry (a
create that failed) and what was there before the apply are not. Compute Engine is the fake,
through the real google-cloud-compute client; no terraform runs (only its state file is read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.providers import gce_api, gce_owned
from launcher.terraform import Terraform
from testbed.fakes.compute import FakeCompute
from tests.support.paths import REPO

PROJECT, REGION = "test-project", "us-east5"


@pytest.fixture
def fake(tpuctl_home, monkeypatch):
    with FakeCompute() as api:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, api.endpoint)
        yield api


def _state(tf: Terraform, resources: list[dict]) -> None:
    tf.folder.mkdir(parents=True, exist_ok=True)
    tf.state_file.write_text(json.dumps({"version": 4, "resources": [
        {"mode": "managed", "type": kind, "name": name, "instances": [instance]}
        for kind, name, instance in resources]}))


def test_only_what_the_state_says_terraform_made_is_recorded(fake, tmp_path):
    group = fake.add_group(PROJECT, REGION, "trillium")
    policy = fake.add_policy(PROJECT, REGION, "trillium-topology")
    other = fake.add_policy(PROJECT, REGION, "unused")  # an id the state never names
    tf = Terraform(tmp_path / "tf", module=REPO / "tests" / "terraform_twin_slice")
    owned = gce_owned.Ownership("trillium", gce_api.ComputeApi(project=PROJECT, region=REGION))
    _state(tf, [("google_compute_firewall", "ssh", {"attributes": {"name": "trillium-ssh"}})])
    owned.before_apply(tf)
    assert owned.applying()
    _state(tf, [
        ("google_compute_firewall", "ssh", {"attributes": {"name": "trillium-ssh"}}),
        # Made by someone under the name after the run's (the state's id is another one).
        ("google_compute_region_instance_group_manager", "main",
         {"attributes": {"instance_group_manager_id": int(group["id"]) + 1}}),
        ("google_compute_resource_policy", "main",
         {"attributes": {"creation_timestamp": policy["creationTimestamp"]}}),
        # A create that failed: never the run's, whatever has the name.
        ("google_compute_region_instance_template", "main",
         {"status": "tainted", "attributes": {}}),
    ])
    owned.after_apply(tf)
    assert not owned.applying()
    assert owned.ids("policies") == {"trillium-topology": [policy["id"]]}
    assert owned.ids("groups") == {} and owned.ids("templates") == {}
    assert other["id"] not in Path(owned.path).read_text()
    # The same state once more (no apply under way): nothing is taken from it.
    owned.record_made(tf)
    assert owned.ids("groups") == {}


def test_a_state_entry_with_the_resources_own_id_is_recorded(fake, tmp_path):
    group = fake.add_group(PROJECT, REGION, "trillium")
    tf = Terraform(tmp_path / "tf", module=REPO / "tests" / "terraform_twin_slice")
    owned = gce_owned.Ownership("trillium", gce_api.ComputeApi(project=PROJECT, region=REGION))
    _state(tf, [])
    owned.before_apply(tf)
    _state(tf, [("google_compute_region_instance_group_manager", "main",
                 {"attributes": {"instance_group_manager_id": int(group["id"])}})])
    assert owned.record_made(tf)  # during the apply, as each resource comes
    assert owned.ids("groups") == {"trillium": [group["id"]]}
    assert owned.is_ours("groups", "trillium", group["id"])


def test_a_name_the_provider_derived_is_read_from_the_state(fake, tmp_path):
    """A resource whose name Terraform derives (a template made with name_prefix) is known by
    the name the google provider recorded in its state, not by the run's fixed names."""
    from google.cloud import compute_v1

    name = "trillium-template-20261127000000000000000001"
    api = gce_api.ComputeApi(project=PROJECT, region=REGION)
    api.clients.templates.insert(
        project=PROJECT, region=REGION, instance_template_resource=compute_v1.InstanceTemplate(
            name=name, properties=compute_v1.InstanceProperties(machine_type="ct6e-standard-4t"))
    ).result()
    made = api.get("templates", name)
    tf = Terraform(tmp_path / "tf", module=REPO / "tests" / "terraform_twin_slice")
    owned = gce_owned.Ownership("trillium", api)
    _state(tf, [])
    owned.before_apply(tf)
    _state(tf, [("google_compute_region_instance_template", "main", {"attributes": {
        "name": name, "self_link_unique": f"https://www.googleapis.com/compute/v1/projects/"
        f"{PROJECT}/regions/{REGION}/instanceTemplates/{name}?uniqueId={made.id}"}})])
    owned.after_apply(tf)
    assert owned.ids("templates") == {name: [str(made.id)]}
    assert (("templates", name) in owned.run_names()) and owned.left() == (
        [f"instance template {name}"], [])


def test_each_slice_is_recorded_under_its_own_names_by_its_index_in_the_state(fake, tmp_path):
    """Several slices: main[i] in the state is slice i's MIG and policy (RUN-i,
    RUN-i-topology), whether or not the entry recorded its name."""
    groups = [fake.add_group(PROJECT, REGION, f"two-{i}") for i in (0, 1)]
    policies = [fake.add_policy(PROJECT, REGION, f"two-{i}-topology") for i in (0, 1)]
    tf = Terraform(tmp_path / "tf", module=REPO / "tests" / "terraform_twin_slice")
    owned = gce_owned.Ownership("two", gce_api.ComputeApi(project=PROJECT, region=REGION),
                                slices=2)
    _state(tf, [])
    owned.before_apply(tf)
    tf.state_file.write_text(json.dumps({"version": 4, "resources": [
        {"mode": "managed", "type": "google_compute_region_instance_group_manager",
         "name": "main", "instances": [
             {"index_key": i, "attributes": {"instance_group_manager_id": int(g["id"])}}
             for i, g in enumerate(groups)]},
        {"mode": "managed", "type": "google_compute_resource_policy", "name": "main",
         "instances": [{"index_key": i, "attributes": {
             "creation_timestamp": p["creationTimestamp"]}} for i, p in enumerate(policies)]},
    ]}))
    owned.after_apply(tf)
    assert owned.ids("groups") == {f"two-{i}": [groups[i]["id"]] for i in (0, 1)}
    assert owned.ids("policies") == {f"two-{i}-topology": [policies[i]["id"]] for i in (0, 1)}
    assert [name for kind, name in owned.made] == [
        "two-ssh", "two-internal", "two-0-topology", "two-1-topology", "two-0", "two-1"]
