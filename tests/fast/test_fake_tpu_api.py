"""The fake TPU API (testbed/fakes/tpu_api.py) as the real google-cloud-tpu client sees it."""

from __future__ import annotations

import pytest
from google.api_core import exceptions

from testbed.fakes import tpu_api
from testbed.fakes.tpu_api import FakeTpuApi, Worker
from tests.support.tpu_api_calls import BASE, PARENT, ZONE, create, name


@pytest.fixture
def api():
    with FakeTpuApi() as fake:
        yield fake


@pytest.fixture
def client(api):
    return api.client()






def test_node_lifecycle_create_list_duplicate_delete_recreate(api, client):
    api.set_workers([Worker("10.9.0.2", external_ip="203.0.113.2"), Worker("10.9.0.3")])
    node = create(client, "run", "v4-16", network_config={"enable_external_ips": True},
                  labels={"run": "demo"}, metadata={"ssh-keys": "me:ssh-ed25519 AAAA me"},
                  scheduling_config={"spot": True}).result()
    assert node.state == node.State.READY and node.health == node.Health.HEALTHY
    assert [(e.ip_address, e.access_config.external_ip) for e in node.network_endpoints] == [
        ("10.9.0.2", "203.0.113.2"), ("10.9.0.3", "10.9.0.3")]
    fetched = client.get_node(name=name("run"))
    assert (fetched.name, fetched.id, fetched.accelerator_type) == (name("run"), node.id, "v4-16")
    assert fetched.labels["run"] == "demo" and fetched.scheduling_config.spot
    assert fetched.metadata["ssh-keys"].startswith("me:") and fetched.create_time
    assert [n.name for n in client.list_nodes(parent=PARENT)] == [name("run")]
    sent = api.requests("CreateNode")[0]
    assert sent.query["nodeId"] == "run" and sent.body["acceleratorType"] == "v4-16"

    with pytest.raises(exceptions.Conflict, match="already exists"):
        create(client, "run")
    client.delete_node(name=name("run")).result()
    with pytest.raises(exceptions.NotFound, match="was not found"):
        client.get_node(name=name("run"))
    assert list(client.list_nodes(parent=PARENT)) == []
    again = create(client, "run", "v4-16").result()
    assert again.id != node.id
    # No external IPs asked for: the workers have none, as on Google Cloud.
    assert all(not e.access_config.external_ip for e in again.network_endpoints)


def test_transitions_follow_observations_and_the_clock(api, client):
    api.set_timing("create", polls=0, seconds=300)
    operation = create(client, "slow")
    node = client.get_node(name=name("slow"))
    assert node.state == node.State.CREATING and not node.network_endpoints
    assert not operation.done()
    api.advance_clock(301)
    assert operation.result().state == node.State.READY

    api.set_timing("delete", polls=2)
    deleting = client.delete_node(name=name("slow"))
    assert client.get_node(name=name("slow")).state == node.State.DELETING
    deleting.result()   # its second observation ends the deletion
    assert api.node_names() == []


def test_stop_and_start_a_single_host_but_not_a_pod(api, client):
    create(client, "one").result()
    stopped = client.stop_node(request={"name": name("one")}).result()
    assert stopped.state == stopped.State.STOPPED
    with pytest.raises(exceptions.BadRequest, match="only when READY"):
        client.stop_node(request={"name": name("one")})
    assert client.start_node(request={"name": name("one")}).result().state == stopped.State.READY

    create(client, "pod", "v4-32").result()
    assert len(client.get_node(name=name("pod")).network_endpoints) == 4
    with pytest.raises(exceptions.BadRequest, match="single TPU nodes"):
        client.stop_node(request={"name": name("pod")})


def test_update_node_changes_only_the_masked_fields(api, client):
    create(client, "run", labels={"a": "1"}, description="first").result()
    updated = client.update_node(request={
        "node": {"name": name("run"), "labels": {"b": "2"}, "metadata": {"k": "v"},
                 "description": "ignored"},
        "update_mask": {"paths": ["labels", "metadata"]}}).result()
    assert dict(updated.labels) == {"b": "2"} and dict(updated.metadata) == {"k": "v"}
    assert updated.description == "first"
    assert api.requests("UpdateNode")[0].query["updateMask"] == "labels,metadata"
    with pytest.raises(exceptions.BadRequest, match="update_mask"):
        client.update_node(request={"node": {"name": name("run"), "runtime_version": "x"},
                                    "update_mask": {"paths": ["runtime_version"]}})


def test_guest_attributes_publish_each_workers_host_key(api, client):
    keys = ["AAAAC3NzaC1lZDI1NTE5AAAAIA" + str(i) * 20 for i in range(3)]
    api.set_workers([Worker(f"10.9.0.{i}", host_keys={"ssh-ed25519": keys[i]}) for i in range(3)])
    create(client, "run", "v4-32").result()

    def published(**query):
        answer = client.get_guest_attributes(request={"name": name("run"), **query})
        return [[(i.namespace, i.key, i.value) for i in a.query_value.items]
                for a in answer.guest_attributes]

    api.set_guest_attribute("run", 0, "guestInventory", "hostname", "w0")
    api.set_guest_attribute("run", 0, "hostkeys", "ssh-rsa", "AAAArsa")
    assert published(query_path="hostkeys/ssh-ed25519") == [
        [("hostkeys", "ssh-ed25519", k)] for k in keys]
    assert published(worker_ids=["0"]) == [[("guestInventory", "hostname", "w0"),
                                            ("hostkeys", "ssh-ed25519", keys[0]),
                                            ("hostkeys", "ssh-rsa", "AAAArsa")]]
    assert len(published(query_path="hostkeys/", worker_ids=["0"])[0]) == 2
    assert published(query_path="hostkeys/ssh-ed25519", worker_ids=["2"]) == [
        [("hostkeys", "ssh-ed25519", keys[2])]]
    api.set_host_key("run", 1, "AAAAchanged")
    assert published(worker_ids=["1"]) == [[("hostkeys", "ssh-ed25519", "AAAAchanged")]]
    api.set_host_key("run", 0, None)
    assert published(query_path="hostkeys/ssh-ed25519", worker_ids=["0"]) == [[]]
    api.hide_guest_attributes()
    assert published() == [[], [], []]
    with pytest.raises(exceptions.BadRequest, match="worker"):
        published(worker_ids=["7"])


def test_preemption_health_and_symptoms_show_through_the_api(api, client):
    create(client, "run").result()
    api.preempt("run", health="UNHEALTHY_MAINTENANCE",
                symptoms=[("HBM_OUT_OF_MEMORY", "worker 0 ran out of HBM", 0)])
    node = client.get_node(name=name("run"))
    assert node.state == node.State.PREEMPTED
    assert node.health == node.Health.UNHEALTHY_MAINTENANCE
    assert [(s.symptom_type.name, s.details, s.worker_id) for s in node.symptoms] == [
        ("HBM_OUT_OF_MEMORY", "worker 0 ran out of HBM", "0")]
    assert len(node.network_endpoints) == 1
    with pytest.raises(exceptions.BadRequest):
        client.start_node(request={"name": name("run")})


def queued_request(node_id: str = "run", **extra) -> dict:
    return {"parent": PARENT, "queued_resource_id": "qr", "queued_resource": {
        "tpu": {"node_spec": [{"parent": PARENT, "node_id": node_id,
                               "node": {"accelerator_type": "v4-8", "runtime_version": BASE}}]},
        "spot": {}, "queueing_policy": {"valid_until_duration": {"seconds": 3600}}, **extra}}


def qr_state(client) -> str:
    return client.get_queued_resource(name=f"{PARENT}/queuedResources/qr").state.state.name


def test_queued_resource_waits_then_becomes_active_with_its_node(api, client):
    api.plan_queued_resource("qr", wait_polls=2)
    queued = client.create_queued_resource(request=queued_request()).result()
    assert queued.state.state.name == "ACCEPTED" and "spot" in queued
    assert queued.queueing_policy.valid_until_duration.total_seconds() == 3600
    assert [qr_state(client) for _ in range(4)] == [
        "WAITING_FOR_RESOURCES", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"]
    node = client.get_node(name=name("run"))
    assert node.state == node.State.READY and node.scheduling_config.spot
    assert node.queued_resource == f"{PARENT}/queuedResources/qr"

    with pytest.raises(exceptions.BadRequest, match="force"):
        client.delete_queued_resource(name=f"{PARENT}/queuedResources/qr")
    client.delete_queued_resource(request={"name": f"{PARENT}/queuedResources/qr",
                                           "force": True}).result()
    assert list(client.list_queued_resources(parent=PARENT)) == []
    assert list(client.list_nodes(parent=PARENT)) == []
    assert api.requests("DeleteQueuedResource")[-1].query["force"] == "true"


def test_queued_resource_failure_carries_the_reason_and_reset_retries(api, client):
    api.plan_queued_resource(outcome="FAILED",
                             error=tpu_api.ApiError("RESOURCE_EXHAUSTED", "no v4 left"))
    client.create_queued_resource(request=queued_request()).result()
    queued = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr")
    assert queued.state.state.name == "FAILED"
    assert (queued.state.failed_data.error.code, queued.state.failed_data.error.message) == (
        8, "no v4 left")
    api.plan_queued_resource()   # capacity came back
    client.reset_queued_resource(name=f"{PARENT}/queuedResources/qr").result()
    assert [qr_state(client) for _ in range(2)] == ["PROVISIONING", "ACTIVE"]


def test_queued_resource_fails_at_its_deadline(api, client):
    api.plan_queued_resource(wait_polls=None)
    client.create_queued_resource(request=queued_request()).result()
    assert qr_state(client) == "WAITING_FOR_RESOURCES"
    api.advance_clock(3601)
    queued = client.get_queued_resource(name=f"{PARENT}/queuedResources/qr")
    assert queued.state.state.name == "FAILED" and queued.state.failed_data.error.code == 4
    client.delete_queued_resource(name=f"{PARENT}/queuedResources/qr").result()
    assert api.node_names() == []


def test_preempting_a_queued_node_suspends_its_request(api, client):
    client.create_queued_resource(request=queued_request()).result()
    assert [qr_state(client) for _ in range(2)] == ["PROVISIONING", "ACTIVE"]
    api.preempt("run")
    assert qr_state(client) == "SUSPENDED"
    client.delete_queued_resource(name=f"{PARENT}/queuedResources/qr").result()
    assert client.get_node(name=name("run")).state.name == "PREEMPTED"   # not deleted by it


@pytest.mark.parametrize(("error", "raised", "reason"), [
    (tpu_api.permission_denied("tpu.nodes.create", PARENT), exceptions.Forbidden,
     "IAM_PERMISSION_DENIED"),
    (tpu_api.service_disabled("4242"), exceptions.Forbidden, "SERVICE_DISABLED"),
    (tpu_api.quota_exceeded(ZONE), exceptions.TooManyRequests, None),
    (tpu_api.no_capacity(ZONE), exceptions.TooManyRequests, None),
    (tpu_api.not_found(name("run")), exceptions.NotFound, None),
    (tpu_api.invalid_argument("bad node", "node"), exceptions.BadRequest, None),
])
def test_injected_errors_reach_the_client_as_google_exceptions(api, client, error, raised,
                                                               reason):
    api.fail("CreateNode", error)
    with pytest.raises(raised) as caught:
        create(client, "run")
    assert error.message in caught.value.message and caught.value.reason == reason
    assert caught.value.details == error.details
    create(client, "run").result()   # only the next call fails
    api.fail("*", error, times=None)
    for _ in range(2):
        with pytest.raises(raised):
            client.get_node(name=name("run"))
    api.clear_failures()
    client.get_node(name=name("run"))


def test_service_disabled_names_the_api_and_how_to_enable_it(api, client):
    api.fail("ListNodes", tpu_api.service_disabled("4242"))
    with pytest.raises(exceptions.Forbidden) as caught:
        list(client.list_nodes(parent=PARENT))
    assert caught.value.domain == "googleapis.com"
    assert caught.value.metadata["service"] == "tpu.googleapis.com"
    assert "tpu.googleapis.com/overview?project=4242" in caught.value.message


def test_capacity_error_ends_the_create_operation(api, client):
    api.fail_operation("CreateNode", tpu_api.no_capacity(ZONE))
    operation = create(client, "run")
    with pytest.raises(exceptions.ResourceExhausted, match="no more capacity in the zone"):
        operation.result()
    assert api.node_names() == []
    create(client, "run").result()


def test_list_nodes_pages_and_the_catalogue(api, client):
    api.set_timing("create", polls=0)
    for i in range(5):
        assert create(client, f"n{i}").done()
    api.set_max_page_size(2)
    pager = client.list_nodes(parent=PARENT)
    assert [n.name.rsplit("/", 1)[1] for n in pager] == [f"n{i}" for i in range(5)]
    tokens = [r.query.get("pageToken") for r in api.requests("ListNodes")]
    assert len(tokens) == 3 and tokens[0] is None and all(tokens[1:])
    with pytest.raises(exceptions.BadRequest, match="page_token"):
        client.list_nodes(request={"parent": PARENT, "page_token": "!!"})

    types = [t.type_ for t in client.list_accelerator_types(parent=PARENT)]
    assert {"v4-8", "v4-32", "v5litepod-16"} <= set(types)
    assert client.get_accelerator_type(
        name=f"{PARENT}/acceleratorTypes/v4-32").accelerator_configs[0].topology == "2x2x4"
    assert BASE in [v.version for v in client.list_runtime_versions(parent=PARENT)]
    api.set_accelerator_types(["v5litepod-8"], zone=ZONE)
    with pytest.raises(exceptions.BadRequest, match="not available in zone"):
        create(client, "n9", "v4-8")
    with pytest.raises(exceptions.NotFound):
        client.get_runtime_version(name=f"{PARENT}/runtimeVersions/tpu-vm-tf-9.9.9")


