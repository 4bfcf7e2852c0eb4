"""Terraform is never cut off between making a resource and saving it (issue 27, item 3): it runs
in a session of its own, writing to a file, so a launcher killed mid-apply leaves the apply to
finish; the next command waits for it; Ctrl-C is still its graceful stop; the state file is read
as Terraform writes it. Real terraform on a module of built-in resources whose provisioners
sleep, so that the moment to kill is one the test can see."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from launcher.terraform import state_resources
from tests.support.terraform_session import MODULE


@pytest.fixture
def module(tmp_path, monkeypatch) -> Path:
    if shutil.which("terraform") is None:
        pytest.skip("terraform is not installed (make setup-terraform installs one)")
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/dev/null")
    folder = tmp_path / "module"
    folder.mkdir()
    (folder / "main.tf").write_text(MODULE)
    return folder


def test_the_state_is_read_with_modules_keys_and_tainted_instances():
    text = json.dumps({"version": 4, "resources": [
        {"mode": "managed", "type": "terraform_data", "name": "google_compute_firewall",
         "instances": [{"index_key": "ssh", "attributes": {"id": "a"}},
                       {"index_key": "internal", "status": "tainted", "attributes": {}}]},
        {"module": "module.slice", "mode": "managed",
         "type": "google_compute_region_instance_group_manager", "name": "main",
         "instances": [{"attributes": {"instance_group_manager_id": 42}}]},
        {"mode": "managed", "type": "google_compute_resource_policy", "name": "main",
         "instances": [{"index_key": 0, "attributes": {"name": "p"}}]},
        {"mode": "data", "type": "google_project", "name": "this", "instances": [{}]},
    ]})
    found = {r.address: r for r in state_resources(text)}
    assert list(found) == ['terraform_data.google_compute_firewall["ssh"]',
                           'terraform_data.google_compute_firewall["internal"]',
                           "module.slice.google_compute_region_instance_group_manager.main",
                           "google_compute_resource_policy.main[0]"]
    assert found['terraform_data.google_compute_firewall["internal"]'].tainted
    assert not found['terraform_data.google_compute_firewall["ssh"]'].tainted
    ssh = found['terraform_data.google_compute_firewall["ssh"]']
    assert ssh.fingerprint != found['terraform_data.google_compute_firewall["internal"]'].fingerprint
