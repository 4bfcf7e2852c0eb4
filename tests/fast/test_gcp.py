"""The gcp provider end to end against stand-ins: `tpuctl up` runs real terraform on the twin
module (whose TPU resource creates the node through the TPU API, as google_tpu_v2_vm does), the
TPU API is testbed/fakes/tpu_api.py driven by the real google-cloud-tpu client, and the node's
workers are the real sshd fleet, publishing the fleet's real host keys as guest attributes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testbed.fakes.tpu_api import FakeTpuApi
from tests.support.cloud import (
    attach_fleet,
    storage_server,
    use_cloud_stand_ins,
)
from tests.support.runners import invoke


@pytest.fixture
def cloud(fleet, storage_emulator, tmp_path, tpuctl_home, monkeypatch):
    """A fake TPU API whose nodes are the fleet's first `hosts` workers, terraform on the twin."""
    if fleet.port != 22:
        pytest.skip("TPU workers listen on port 22: needs the fleet in network namespaces")
    from payload.core import storage

    use_cloud_stand_ins(monkeypatch, storage_emulator, poll_s=0.1)
    # The project's bucket exists already: `up` uses it as it is (and never deletes it).
    if storage.client().lookup_bucket("test-project-tpuctl") is None:
        storage.client().create_bucket("test-project-tpuctl")
    # On the fleet's bridge: the launcher here and the workers in their namespaces both reach it
    # (worker 0 deletes its own TPU through it after `train --down`).
    with FakeTpuApi(host=f"{fleet.subnet}.1") as api:
        monkeypatch.setenv("TPUCTL_TPU_API_ENDPOINT", api.endpoint)
        attach_fleet(api, fleet)
        yield api
    storage._client = None


def test_up_dry_run_needs_no_credentials_and_touches_nothing(tmp_path, tpuctl_home,
                                                             monkeypatch):
    monkeypatch.delenv("TPUCTL_TPU_API_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    for accelerator, price in (("v4-8", "$12.88/h"), ("v4-32", "$51.52/h")):
        path = tmp_path / accelerator / "tpuctl.yaml"
        path.parent.mkdir()
        path.write_text(yaml.safe_dump({
            "name": "priced",
            "cluster": {"provider": "gcp", "project": "my-project", "zone": "us-central2-b",
                        "accelerator_type": accelerator},
            "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "roberta"},
            "train": {"steps": 10, "batch_size": 16, "learning_rate": 1e-3}}))
        result = invoke("up", "-c", path, "--dry-run")
        assert result.exit_code == 0, result.output
        assert price in result.output and "prices change" in result.output
        assert "gs://my-project-tpuctl" in result.output
        assert "missing: cluster.ssh_source_ranges" in result.output
        # The training plan too, before any TPU exists: the table's hosts, the same price.
        plan = invoke("train", "-c", path, "--dry-run")
        assert plan.exit_code == 0, plan.output
        assert f"cost: {price}" in plan.output
        workers = "1 worker" if accelerator == "v4-8" else "4 workers"  # never "1 workers"
        assert f"{workers}, hardware tpu/{accelerator}/priced" in plan.output
    assert not tpuctl_home.exists()


DOCTOR_CHECKS = ("Google Cloud credentials", "Cloud TPU API enabled in test-project",
                 "v4-16 offered", "runtime version offered", "TPU quota", "bucket",
                 "OS Login off", "guest attributes allowed (host keys)",
                 "SSH reachable from here")


def _doctor_config(tmp_path: Path, **cluster) -> Path:
    path = tmp_path / "tpuctl.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tpurun", "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2"},
        "cluster": {"provider": "gcp", "project": "test-project", "zone": "us-central2-b",
                    "accelerator_type": "v4-16", **cluster},
        "train": {"steps": 4, "batch_size": 8, "learning_rate": 1e-3}}))
    return path


def _verdicts(output: str) -> dict[str, str]:
    """check name -> verdict, from doctor's lines `VERDICT NAME: detail`."""
    found = {}
    for line in output.splitlines():
        verdict, _, rest = line.partition(" ")
        found[rest.strip().split(":")[0]] = verdict
    return found


def test_doctor_without_credentials_still_lists_every_check(tmp_path, tpuctl_home, monkeypatch):
    """Issue 18: every check is shown, not only the first failing one; those that need what
    failed say so."""
    monkeypatch.delenv("TPUCTL_TPU_API_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    result = invoke("doctor", "-c", _doctor_config(tmp_path))
    assert result.exit_code == 1, result.output
    verdicts = _verdicts(result.output)
    assert list(verdicts) == list(DOCTOR_CHECKS), result.output
    assert verdicts["Google Cloud credentials"] == "fix"
    assert all(v == "skip" for name, v in verdicts.items() if name != DOCTOR_CHECKS[0])
    assert result.output.count("needs credentials (above)") == len(DOCTOR_CHECKS) - 2


def test_doctor_with_the_api_off_still_checks_the_bucket(tmp_path, tpuctl_home, monkeypatch):
    from payload.core import storage
    from testbed.fakes.tpu_api import service_disabled

    with storage_server() as url, FakeTpuApi() as api:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
        monkeypatch.setenv("TPUCTL_TPU_API_ENDPOINT", api.endpoint)
        monkeypatch.setattr(storage, "_client", None)
        api.fail("ListAcceleratorTypes", service_disabled("test-project"), times=None)
        result = invoke("doctor", "-c", _doctor_config(tmp_path))
    assert result.exit_code == 1, result.output
    verdicts = _verdicts(result.output)
    assert list(verdicts) == list(DOCTOR_CHECKS), result.output
    assert verdicts["Cloud TPU API enabled in test-project"] == "fix"
    assert "gcloud services enable tpu.googleapis.com" in result.output
    assert "gs://test-project-tpuctl does not exist yet" in result.output  # asked all the same
    for name in ("v4-16 offered", "runtime version offered", "SSH reachable from here"):
        assert f"skip  {name}: needs the Cloud TPU API (above)" in result.output


def test_self_delete_deletes_only_the_node_with_the_runs_id():
    """The TPU self-delete (worker 0, `train --down`) checks the node's id: one recreated under
    the same name is left alone."""
    from payload.cloud import self_delete

    with FakeTpuApi() as api:
        api.client().create_node(parent="projects/p/locations/us-central2-b", node_id="run",
                                 node={"accelerator_type": "v4-8",
                                       "runtime_version": "tpu-ubuntu2204-base"}).result()
        uid = api.node("run")["id"]
        spec = {"api": "tpu", "project": "p", "zone": "us-central2-b", "name": "run",
                "uid": str(int(uid) + 1), "api_endpoint": api.endpoint}
        assert "another node now" in self_delete.delete_own(spec)
        assert len(api.node_names()) == 1
        assert self_delete.delete_own({**spec, "uid": uid}).startswith("deleting TPU run")
        api.advance_clock(3600)
        assert self_delete.delete_own(spec) == "TPU run is already gone"


