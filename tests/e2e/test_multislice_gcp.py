"""Several slices on gcp (issue 35, item 4): one queued request of N nodes through the TPU API
(multislice_params), brought up, shown, billed, recovered and taken down as one, and never a
hand-made node of one of its names touched.

The TPU API is testbed/fakes/tpu_api.py, driven by the real google-cloud-tpu client; `up` and
`down` run real terraform on the twin module (the bucket, firewall and service account: the
slices themselves are the queue's); Cloud Storage is the in-memory emulator. No worker is
reached over SSH: each slice's workers are addresses with published host keys. e2e only because
terraform is a subprocess; nothing trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from testbed.fakes.tpu_api import FakeTpuApi, Worker, no_capacity
from tests.support.cloud import storage_server, use_cloud_stand_ins
from tests.support.cloud_owned import COPIED_LABEL, HOST_KEY, PROJECT, ZONE, config_file, invoke

SLICES = ("tpurun-0", "tpurun-1")


@pytest.fixture(scope="module")
def storage_url():
    with storage_server("127.0.0.1") as url:
        yield url


def slice_workers(node_id: str, accelerator_type: str) -> list[Worker]:
    """Two hosts per v4-16 slice, each slice on its own addresses: 10.9.SLICE.2 and .3."""
    index = int(node_id.rsplit("-", 1)[1]) if node_id.startswith("tpurun-") else 9
    return [Worker(f"10.9.{index}.{i}", host_keys={"ssh-ed25519": HOST_KEY}) for i in (2, 3)]


@pytest.fixture
def cloud(storage_url, tpuctl_home, monkeypatch):
    from payload.core import storage

    use_cloud_stand_ins(monkeypatch, storage_url, poll_s=0.05)
    for bucket in list(storage.client().list_buckets()):  # each test starts from nothing
        for blob in bucket.list_blobs(versions=True):
            blob.delete()
    if storage.client().lookup_bucket("test-project-tpuctl") is None:
        storage.client().create_bucket("test-project-tpuctl")
    with FakeTpuApi(host="127.0.0.1") as api:
        monkeypatch.setenv("TPUCTL_TPU_API_ENDPOINT", api.endpoint)
        api.set_worker_factory(slice_workers)
        yield api
    storage._client = None


def two_slices(folder: Path, **cluster) -> Path:
    """The ownership tests' run (v4-16: two hosts) as two slices of the JAX engine."""
    path = config_file(folder, slices=2, **cluster)
    raw = yaml.safe_load(path.read_text())
    raw["train"]["engine"] = "jax"
    raw["output_dir"] = "gs://test-project-tpuctl/tpurun"
    path.write_text(yaml.safe_dump(raw))
    return path


def provider(config: Path):
    from launcher.providers.gcp import GcpProvider
    from payload.config import load_config

    return GcpProvider.from_config(load_config(config), num_workers=None)


def uids(api: FakeTpuApi) -> dict[str, str]:
    return {name.rsplit("/", 1)[1]: api.node(name)["id"] for name in api.node_names()}


def queued_requests() -> list:
    from payload.cloud.tpu_api import TpuApi

    return TpuApi(project=PROJECT, zone=ZONE).list_queued()


def billing() -> list[dict]:
    from payload.cloud import budget

    return budget.read_nodes("gs://test-project-tpuctl/tpurun")


def test_two_slices_are_one_queued_request_up_status_fleet_billing_down(cloud, tmp_path,
                                                                        tpuctl_home):
    config = two_slices(tmp_path)
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, up.output
    assert "queueing a request for 2 x v4-16" in up.output
    assert "TPU tpurun-0 and tpurun-1 are READY in us-central2-b: 4 worker(s)" in up.output
    [request] = cloud.requests("CreateQueuedResource")
    [spec] = request.body["tpu"]["nodeSpec"]
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "tpurun"}
    assert "nodeId" not in spec and not cloud.requests("CreateNode")  # not Terraform's
    made = uids(cloud)
    assert sorted(made) == list(SLICES)
    assert all(cloud.node(n)["multisliceNode"] for n in SLICES)
    owned = json.loads((tpuctl_home / "gcp/tpurun/owned.json").read_text())
    assert sorted(n["uid"] for n in owned["nodes"]) == sorted(made.values())

    # The live fleet: every slice's workers, slice by slice, one known_hosts line each.
    gcp = provider(config)
    fleet = gcp.fleet()
    assert [w.address for w in fleet.workers] == ["10.9.0.2", "10.9.0.3", "10.9.1.2", "10.9.1.3"]
    assert fleet.hardware.slices == 2 and fleet.hardware.tpu_name == "tpurun"
    known = (tpuctl_home / "gcp/tpurun/known_hosts").read_text().splitlines()
    assert [line.split()[0] for line in known] == [w.host for w in fleet.workers]
    assert gcp.site.uid == f"{made['tpurun-0']},{made['tpurun-1']}"
    assert gcp.trouble() is None

    status = invoke("status", "-c", config)
    assert status.exit_code == 0, status.output
    for name in SLICES:
        assert f"TPU {name} (v4-16 in us-central2-b): READY" in status.output
    assert "worker-3: 10.9.1.3" in status.output and status.output.count("  cost: $") == 2
    assert gcp.billing().startswith("TPU tpurun-0 and tpurun-1 are still up (2 slices x $")

    gcp.record_billing("gs://test-project-tpuctl/tpurun")  # what a job's start does
    assert sorted(n["uid"] for n in billing()) == sorted(made.values())

    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert cloud.node_names() == [] and queued_requests() == []
    assert "nothing of run tpurun is left billing" in down.output
    assert all(n["deleted"] is not None for n in billing())  # the record closed: every slice


@pytest.mark.parametrize("failure", ["one-slice-fails", "one-slice-without-host-keys"])
def test_a_partial_bring_up_leaves_no_slice_billing(cloud, tmp_path, monkeypatch, failure):
    """One slice fails (its node is never made) or comes up with a worker that publishes no
    host key after the other came up: every slice and the request are deleted."""
    from launcher.providers import gcp_site

    if failure == "one-slice-fails":
        cloud.fail_operation("CreateNode", no_capacity(ZONE))
    else:
        monkeypatch.setattr(gcp_site, "HOST_KEYS_WAIT_S", 0.5)

        def second_keyless(node_id, accelerator_type):
            workers = slice_workers(node_id, accelerator_type)
            if node_id == "tpurun-1":
                workers[1] = Worker(workers[1].ip, host_keys={})
            return workers
        cloud.set_worker_factory(second_keyless)
    result = invoke("up", "-c", two_slices(tmp_path))
    assert result.exit_code != 0
    assert "nothing that bills is left" in str(result.exception)
    assert cloud.node_names() == [] and queued_requests() == []
    assert cloud.requests("DeleteQueuedResource")


def test_a_hand_made_node_of_a_slice_name_is_never_taken_or_deleted(cloud, tmp_path):
    """tpurun-1 made by hand (the run's label copied onto it): `up` refuses before queueing
    anything, `down` and `status` leave it alone."""
    hand = cloud.client().create_node(
        parent=f"projects/{PROJECT}/locations/{ZONE}", node_id="tpurun-1",
        node={"accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base",
              "labels": COPIED_LABEL}).result()
    config = two_slices(tmp_path)
    up = invoke("up", "-c", config)
    assert up.exit_code != 0
    assert "TPU tpurun-1 in us-central2-b (id" in str(up.exception)
    assert "was not made by tpuctl" in str(up.exception)
    assert not cloud.requests("CreateQueuedResource")
    status = invoke("status", "-c", config)
    assert "TPU tpurun-0: none in us-central2-b" in status.output
    assert "tpurun-1 in us-central2-b (id" in status.output and "/h" not in status.output
    down = invoke("down", "-c", config)
    assert "was not made by tpuctl" in down.output or "was not made by tpuctl" in str(
        down.exception)
    assert uids(cloud) == {"tpurun-1": str(hand.id)}


def test_one_lost_slice_restarts_every_slice(cloud, tmp_path, tpuctl_home):
    """A preempted slice is trouble for the whole job; `recover` (what --auto-resume calls)
    deletes every slice, the one still READY too, and queues them again as one request; the
    billing record closes the old slices, and the next job start records the new ones."""
    out = "gs://test-project-tpuctl/tpurun"
    config = two_slices(tmp_path)
    assert invoke("up", "-c", config).exit_code == 0
    gcp = provider(config)
    gcp.fleet()
    gcp.record_billing(out)
    first = uids(cloud)
    cloud.preempt("tpurun-1")
    assert gcp.trouble() == "TPU tpurun-1 is PREEMPTED"
    events = []
    gcp.recover(events.append)
    assert "deleting TPU tpurun-0 (READY" in "\n".join(events)
    again = uids(cloud)
    assert sorted(again) == list(SLICES)
    assert not set(again.values()) & set(first.values())  # every slice is new
    assert all(cloud.node(n)["state"] == "READY" for n in SLICES)
    fleet = gcp.fleet()
    assert len(fleet.workers) == 4 and gcp.trouble() is None
    gcp.record_billing(out)
    record = {n["uid"]: n["deleted"] for n in billing()}
    assert set(record) == set(first.values()) | set(again.values())
    assert all(record[u] is not None for u in first.values())
    assert all(record[u] is None for u in again.values())
    assert invoke("down", "-c", config).exit_code == 0
    assert cloud.node_names() == []
