"""infra/modules/tpu_slice survives a second apply (issue 28, item 6), read as HCL: it asks for
the google-beta release that has every field it sets, writes the fields the API reads back with
a default, names its template by a prefix so that a new one can be made while the MIG uses the
old, and writes down what the launcher decided (mode, termination, boot disk). In process: the
module parsed with python-hcl2 (scripts/infra_docs.py), no terraform."""

from __future__ import annotations

import re

from scripts.infra_docs import INFRA, load_module

MODULE = INFRA / "modules" / "tpu_slice"


def _module():
    return load_module(MODULE)


def test_the_module_asks_for_the_google_beta_that_has_its_fields():
    """accelerator_topology_mode arrived in google-beta 7.24, the regional MIG's
    target_size_policy in 7.28, its resource_policies.workload_policy in 7.31 (the provider's
    services/compute sources at those tags)."""
    text = (MODULE / "versions.tf").read_text()
    beta = re.search(r'google-beta = \{[^}]*version\s*=\s*"([^"]+)"', text, re.S).group(1)
    assert beta == ">= 7.31.0, < 8.0.0"


def test_every_field_the_api_reads_back_with_a_default_is_written():
    resources = _module().resources
    policy = resources["google_compute_resource_policy"]["main"]
    # Optional and forcing a new policy: unset, the API's AUTO_CONNECT read back would replace
    # the policy the MIG uses.
    assert policy["workload_policy"] == [{"type": "HIGH_THROUGHPUT",
                                          "accelerator_topology": "${var.topology}",
                                          "accelerator_topology_mode": "AUTO_CONNECT"}]
    group = resources["google_compute_region_instance_group_manager"]["main"]
    assert group["target_size_policy"] == [{"mode": "${var.size_mode}"}]


def test_a_template_can_be_replaced_while_the_mig_uses_it():
    template = _module().resources["google_compute_region_instance_template"]["main"]
    assert "name" not in template
    assert template["name_prefix"] == "${var.names.template_prefix}"
    assert template["lifecycle"] == [{"create_before_destroy": True}]
    # The workload policy is the MIG's, not the template's.
    assert "resource_policies" not in template
    group = _module().resources["google_compute_region_instance_group_manager"]["main"]
    assert group["version"] == [{"instance_template":
                                 "${google_compute_region_instance_template.main.self_link}"}]
    assert "replace_triggered_by" not in str(group.get("lifecycle", ""))


def test_the_module_writes_down_what_the_launcher_decided():
    module = _module()
    template = module.resources["google_compute_region_instance_template"]["main"]
    scheduling = template["scheduling"][0]
    assert scheduling["instance_termination_action"] == "${var.termination_action}"
    assert scheduling["provisioning_model"] == "${var.provisioning_model}"
    disk = template["disk"][0]
    assert (disk["source_image"], disk["disk_type"], disk["disk_size_gb"]) == (
        "${var.image}", "${var.boot_disk_type}", "${var.boot_disk_gb}")
    # Bulk mode only with the models Compute Engine takes it with, refused at plan time.
    size_mode = module.variables["size_mode"]
    assert 'contains(["FLEX_START", "RESERVATION_BOUND"], var.provisioning_model)' in str(
        size_mode["validation"])
