"""A second apply of the slice's Terraform (issue 28, item 6), on the twin, which replaces and
updates as the google-beta provider's schema says (tests/terraform_twin_slice): with the same
inputs it changes nothing; a new size resizes the MIG in place; a changed template is made under
a new name while the MIG still uses the old one, which the MIG then drops, and Compute Engine
(the fake, which refuses to delete a template in use as the API does) never sees the MIG
replaced. Real terraform, with the variables the launcher writes (gce_slice.terraform_variables)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from launcher import terraform
from launcher.providers import gce_api, gce_slice
from payload.config import parse_config
from testbed.fakes.compute import FakeCompute
from testbed.fakes.tpu_api import Worker
from tests.support.paths import REPO

PROJECT, REGION, ZONE = "test-project", "us-east5", "us-east5-b"
TWIN = REPO / "tests" / "terraform_twin_slice"
GOOGLE = ("google_compute_firewall", "google_compute_resource_policy",
          "google_compute_region_instance_template", "google_compute_region_instance_group_manager")


@pytest.fixture
def twin(tmp_path, monkeypatch):
    if shutil.which("terraform") is None:
        pytest.skip("needs terraform on PATH (make setup-terraform)")
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/dev/null")
    with FakeCompute() as fake:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, fake.endpoint)
        fake.set_workers([Worker(f"10.0.0.{i}") for i in range(2, 10)])
        tf = terraform.Terraform(tmp_path / "tf", module=TWIN)
        tf.init()
        yield fake, tf


def _variables(tf: terraform.Terraform, **cluster) -> None:
    config = parse_config({
        "name": "trillium",
        "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                    "machine_type": "ct6e-standard-4t", "topology": "4x4",
                    "provisioning": "flex_start", "max_run_hours": 2,
                    "ssh_source_ranges": ["203.0.113.7/32"], **cluster},
        "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2"},
        "train": {"engine": "jax", "steps": 4, "batch_size": 8, "learning_rate": 1e-3}})
    variables = gce_slice.terraform_variables(config, user="me", public_key="ssh-ed25519 AAAA")
    (tf.folder / terraform.VARS_FILE).write_text(json.dumps(variables))


def _plan(tf: terraform.Terraform) -> tuple[int, dict[str, list[str]]]:
    """`terraform plan -detailed-exitcode` (0: no changes, 2: changes) and, per Google resource
    type, the actions planned for it."""
    run = [shutil.which("terraform"), f"-chdir={tf.folder}"]
    plan = subprocess.run([*run, "plan", "-input=false", "-detailed-exitcode", "-out=plan.out",
                           f"-var-file={terraform.VARS_FILE}"], capture_output=True, text=True,
                          timeout=300, env=os.environ)
    assert plan.returncode in (0, 2), plan.stdout + plan.stderr
    shown = json.loads(subprocess.run([*run, "show", "-json", "plan.out"], capture_output=True,
                                      text=True, timeout=120, check=True).stdout)
    actions: dict[str, list[str]] = {}
    for change in shown.get("resource_changes", []):
        kind = next((t for t in GOOGLE if t in change["address"]), None)
        if kind and change["change"]["actions"] != ["no-op"]:
            actions.setdefault(kind, []).extend(change["change"]["actions"])
    return plan.returncode, actions


def _apply(tf: terraform.Terraform) -> None:
    tf.apply(lambda line: None, vet=lambda changes: None)  # the twin's state is the test's


def test_a_second_apply_with_the_same_inputs_changes_nothing(twin):
    fake, tf = twin
    _variables(tf)
    _apply(tf)
    made = len(fake.requests())
    assert _plan(tf) == (0, {})
    _apply(tf)
    assert [r.rpc for r in fake.requests()[made:] if not r.rpc.endswith(".get")] == []


def test_a_new_size_resizes_the_mig_in_place(twin):
    fake, tf = twin
    _variables(tf)
    _apply(tf)
    api = gce_api.ComputeApi(project=PROJECT, region=REGION)
    before = api.group("trillium")
    assert before.target_size == 4
    _variables(tf, topology="4x8")  # 8 VMs; the new topology replaces the policy alone
    code, actions = _plan(tf)
    assert code == 2
    assert actions["google_compute_region_instance_group_manager"] == ["update"]
    _variables(tf)
    tf.folder.joinpath(terraform.VARS_FILE).write_text(json.dumps(
        {**json.loads((tf.folder / terraform.VARS_FILE).read_text()), "hosts": 6}))
    code, actions = _plan(tf)
    assert (code, actions) == (2, {"google_compute_region_instance_group_manager": ["update"]})
    _apply(tf)
    after = api.group("trillium")
    assert (after.uid, after.target_size) == (before.uid, 6)  # the same MIG, resized
    assert [r.query for r in fake.requests("regionInstanceGroupManagers.resize")] == [
        {"size": "6"}]
    assert not fake.requests("regionInstanceGroupManagers.delete")


def test_a_changed_template_is_made_before_the_old_one_goes_while_the_mig_lives(twin):
    fake, tf = twin
    _variables(tf)
    _apply(tf)
    api = gce_api.ComputeApi(project=PROJECT, region=REGION)
    before = api.group("trillium")
    (old,) = fake.template_names()
    _variables(tf, image="projects/my-project/global/images/family/my-tpu-image")
    code, actions = _plan(tf)
    assert code == 2
    assert actions["google_compute_region_instance_template"] == ["create", "delete"]
    assert actions["google_compute_region_instance_group_manager"] == ["update"]
    _apply(tf)
    (new,) = fake.template_names()
    assert new != old and new.startswith("trillium-")
    after = api.group("trillium")
    assert after.uid == before.uid and after.template.endswith(f"/instanceTemplates/{new}")
    patched = fake.requests("regionInstanceGroupManagers.patch")
    assert [list(r.body) for r in patched] == [["versions"]]
    assert not fake.requests("regionInstanceGroupManagers.delete")
    assert _plan(tf) == (0, {})
