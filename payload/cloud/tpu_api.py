"""The Cloud TPU API (v2) as tpuctl uses it: one client, plain records, errors as one line.

    api = TpuApi(project="my-project", zone="us-central2-b")
    node = api.get_node("my-run")                 # a Node record, or None when there is none
    node.state, node.uid, node.endpoints          # READY, its unique id, one per worker
    api.host_keys("my-run", workers=4)            # {0: "AAAAC3Nza...", ...} from guest attributes
    api.delete_node("my-run")

TPUCTL_TPU_API_ENDPOINT (read here only, on the launcher and on workers alike) points the client
at a stand-in with anonymous credentials, the way STORAGE_EMULATOR_HOST does for Cloud Storage.
Otherwise Application Default Credentials are used; without them every call is one line saying
how to set them up. google-cloud-tpu is imported on first use.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from payload.cloud import google_errors, stand_ins
from payload.cloud.google_errors import CREDENTIALS_HINT, GoogleApi
from payload.core.errors import UserError

ENDPOINT_ENV = stand_ins.TPU_API_ENV
HOST_KEY_TYPE = "ssh-ed25519"
GUEST_ATTRIBUTES_POLICY = "constraints/compute.disableGuestAttributesAccess"
# States in which a node bills and can run a job; everything else is trouble for a job.
RUNNING_STATES = ("READY",)
GONE_STATES = ("PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "HIDDEN",
               "HIDING")
QUEUE_DONE_STATES = ("ACTIVE", "FAILED", "SUSPENDED")


def stand_in() -> str | None:
    """The stand-in endpoint tests (and dry runs against a fake) set, or None for Google."""
    return stand_ins.endpoint(ENDPOINT_ENV)


@dataclass(frozen=True)
class Endpoint:
    internal_ip: str
    external_ip: str | None


@dataclass(frozen=True, kw_only=True)
class Node:
    """A TPU node as the API reports it."""

    name: str  # the short name (node id)
    uid: str  # unique per creation: a recreated node has another
    state: str
    health: str
    health_description: str
    symptoms: tuple[str, ...]
    accelerator_type: str
    runtime_version: str
    endpoints: tuple[Endpoint, ...]
    create_time: float | None  # seconds since the epoch
    labels: dict

    @property
    def ready(self) -> bool:
        return self.state in RUNNING_STATES

    def describe(self) -> str:
        parts = [self.state]
        if self.health and self.health != "HEALTH_UNSPECIFIED":
            parts.append(f"health {self.health}")
        if self.health_description:
            parts.append(self.health_description)
        parts += list(self.symptoms)
        return ", ".join(parts)


@dataclass(frozen=True, kw_only=True)
class QueuedResource:
    name: str
    state: str
    error: str  # the API's own reason when FAILED or SUSPENDED
    node_ids: tuple[str, ...]
    # A queued request has no unique id of its own: its creation time, with its name and zone,
    # tells one request from another made later under the same name.
    create_time: float | None = None
    labels: dict = field(default_factory=dict)  # its node's, as the request asks for them


def _enum_name(value) -> str:
    return getattr(value, "name", str(value))


def _node_record(raw) -> Node:
    endpoints = tuple(
        Endpoint(internal_ip=e.ip_address,
                 external_ip=(e.access_config.external_ip or None) if e.access_config else None)
        for e in raw.network_endpoints)
    created = raw.create_time.timestamp() if raw.create_time else None
    return Node(
        name=raw.name.rsplit("/", 1)[-1], uid=str(raw.id), state=_enum_name(raw.state),
        health=_enum_name(raw.health), health_description=raw.health_description or "",
        symptoms=tuple(f"{_enum_name(s.symptom_type)}: {s.details}".rstrip(": ")
                       for s in raw.symptoms),
        accelerator_type=raw.accelerator_type, runtime_version=raw.runtime_version,
        endpoints=endpoints, create_time=created, labels=dict(raw.labels))


def _queued_record(raw) -> QueuedResource:
    state = _enum_name(raw.state.state) if raw.state else "STATE_UNSPECIFIED"
    error = ""
    if raw.state and raw.state.failed_data and raw.state.failed_data.error:
        error = raw.state.failed_data.error.message
    specs = list(raw.tpu.node_spec) if raw.tpu else []
    labels = dict(specs[0].node.labels) if specs and specs[0].node else {}
    return QueuedResource(name=raw.name.rsplit("/", 1)[-1], state=state, error=error,
                          node_ids=tuple(i for spec in specs for i in _node_ids(spec, raw.name)),
                          create_time=raw.create_time.timestamp() if raw.create_time else None,
                          labels=labels)


def _node_ids(spec, queued_name: str) -> tuple[str, ...]:
    """The nodes one node_spec asks for: its node_id, or for several slices (multislice_params)
    PREFIX-0 .. PREFIX-(N-1), the prefix defaulting to the queued resource's id (the API's
    rule, QueuedResource.Tpu.NodeSpec.MultisliceParams)."""
    if "multislice_params" in spec:
        multi = spec.multislice_params
        prefix = multi.node_id_prefix or queued_name.rsplit("/", 1)[-1]
        return tuple(f"{prefix}-{i}" for i in range(multi.node_count))
    return (spec.node_id,)


def _client():
    """A TpuClient: REST against the stand-in with anonymous credentials, or Google with ADC."""
    try:
        from google.api_core.client_options import ClientOptions
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import tpu_v2
    except ImportError:
        raise UserError("the gcp provider needs google-cloud-tpu",
                        hint="pip install 'tpuctl[launcher]'") from None
    endpoint = stand_in()
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        return tpu_v2.TpuClient(credentials=AnonymousCredentials(), transport="rest",
                                client_options=ClientOptions(api_endpoint=endpoint))
    try:
        import google.auth

        credentials, _ = google.auth.default(
            scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError:
        raise UserError("no Google Cloud credentials", hint=CREDENTIALS_HINT) from None
    return tpu_v2.TpuClient(credentials=credentials)


def check_credentials() -> None:
    """Fail with one line when calls to Google could not be authenticated."""
    _client()


def _is_quota(exc: Exception, message: str) -> bool:
    from google.api_core import exceptions as gexc

    return isinstance(exc, gexc.ResourceExhausted | gexc.TooManyRequests)


API = GoogleApi(title="Cloud TPU API", service="tpu.googleapis.com", speaker="the TPU API",
                permission_hint="check that your account may manage TPUs in {project} "
                                "(roles/tpu.admin) and that the project id is right",
                quota_hint="no quota or capacity there now: set cluster.queued: true to "
                           "wait for it, or list cluster.fallback_zones",
                is_quota=_is_quota)


def api_errors(project: str, what: str) -> contextlib.AbstractContextManager[None]:
    """Turn the API's errors into one line with the API's own reason and what to do."""
    return google_errors.api_errors(project, what, API)

class TpuApi:
    """The TPU API for one project and zone (other zones by argument)."""

    def __init__(self, *, project: str, zone: str):
        self.project, self.zone = project, zone
        self._api = None

    @property
    def client(self):
        if self._api is None:
            self._api = _client()
        return self._api

    def parent(self, zone: str | None = None) -> str:
        return f"projects/{self.project}/locations/{zone or self.zone}"

    def node_path(self, name: str, zone: str | None = None) -> str:
        return f"{self.parent(zone)}/nodes/{name}"

    def queued_path(self, name: str, zone: str | None = None) -> str:
        return f"{self.parent(zone)}/queuedResources/{name}"

    def errors(self, what: str):
        return api_errors(self.project, what)

    # -- nodes -------------------------------------------------------------------------------
    def get_node(self, name: str, zone: str | None = None) -> Node | None:
        from google.api_core import exceptions as gexc

        with self.errors(f"looking up TPU {name}"):
            try:
                return _node_record(self.client.get_node(name=self.node_path(name, zone)))
            except gexc.NotFound:
                return None

    def list_nodes(self, zone: str | None = None) -> list[Node]:
        with self.errors(f"listing TPUs in {zone or self.zone}"):
            return [_node_record(n) for n in self.client.list_nodes(parent=self.parent(zone))]

    def delete_node(self, name: str, zone: str | None = None, *, timeout_s: float = 1800) -> bool:
        """Delete a node and wait until it is gone; False when there was none."""
        from google.api_core import exceptions as gexc

        with self.errors(f"deleting TPU {name}"):
            try:
                operation = self.client.delete_node(name=self.node_path(name, zone))
            except gexc.NotFound:
                return False
            operation.result(timeout=timeout_s)
        return True

    def host_keys(self, name: str, workers: int, zone: str | None = None) -> dict[int, str]:
        """Each worker's published ssh-ed25519 host key (the base64 body), by worker index."""
        from google.cloud import tpu_v2

        keys: dict[int, str] = {}
        with self.errors(f"reading the host keys of TPU {name}"):
            for worker in range(workers):
                reply = self.client.get_guest_attributes(request=tpu_v2.GetGuestAttributesRequest(
                    name=self.node_path(name, zone), query_path="hostkeys/",
                    worker_ids=[str(worker)]))
                for attribute in reply.guest_attributes:
                    for item in attribute.query_value.items:
                        if item.namespace == "hostkeys" and item.key == HOST_KEY_TYPE:
                            keys[worker] = item.value.strip()
        return keys

    def accelerator_types(self, zone: str | None = None) -> list[str]:
        with self.errors(f"listing the accelerator types of {zone or self.zone}"):
            return [t.type_ for t in self.client.list_accelerator_types(parent=self.parent(zone))]

    def runtime_versions(self, zone: str | None = None) -> list[str]:
        with self.errors(f"listing the runtime versions of {zone or self.zone}"):
            return [r.version for r in
                    self.client.list_runtime_versions(parent=self.parent(zone))]

    # -- queued resources --------------------------------------------------------------------
    def get_queued(self, name: str, zone: str | None = None) -> QueuedResource | None:
        from google.api_core import exceptions as gexc

        with self.errors(f"looking up the queued request {name}"):
            try:
                return _queued_record(self.client.get_queued_resource(
                    name=self.queued_path(name, zone)))
            except gexc.NotFound:
                return None

    def list_queued(self, zone: str | None = None) -> list[QueuedResource]:
        with self.errors(f"listing queued requests in {zone or self.zone}"):
            return [_queued_record(q) for q in
                    self.client.list_queued_resources(parent=self.parent(zone))]

    def create_queued(self, name: str, node: dict, *, spot: bool, valid_for_s: float,
                      reservation: str | None = None, zone: str | None = None,
                      node_count: int = 1) -> bool:
        """Ask for a node through the queue, with a deadline always set: `node_count` > 1 asks
        for that many slices at once (multislice_params), nodes NAME-0 .. NAME-(N-1), made
        all or none. False when a request of that name was there already: then it is not
        necessarily this caller's."""
        from google.api_core import exceptions as gexc
        from google.cloud import tpu_v2
        from google.protobuf import duration_pb2

        spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=self.parent(zone),
                                                  node=tpu_v2.Node(**node))
        if node_count > 1:
            spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                node_count=node_count, node_id_prefix=name)
        else:
            spec.node_id = name
        request = tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]),
            queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(
                valid_until_duration=duration_pb2.Duration(seconds=int(valid_for_s))),
        )
        if spot:
            request.spot = tpu_v2.QueuedResource.Spot()
        if reservation:
            request.reservation_name = reservation
        with self.errors(f"queueing a request for TPU {name}"):
            try:
                self.client.create_queued_resource(
                    parent=self.parent(zone), queued_resource_id=name,
                    queued_resource=request).result(timeout=600)
            except gexc.AlreadyExists:
                return False
        return True

    def delete_queued(self, name: str, zone: str | None = None, *,
                      timeout_s: float = 1800) -> bool:
        """Delete a queued request and its node (force); False when there was none."""
        from google.api_core import exceptions as gexc
        from google.cloud import tpu_v2

        with self.errors(f"deleting the queued request {name}"):
            try:
                operation = self.client.delete_queued_resource(
                    request=tpu_v2.DeleteQueuedResourceRequest(
                        name=self.queued_path(name, zone), force=True))
            except gexc.NotFound:
                return False
            operation.result(timeout=timeout_s)
        return True


def wait_for(poll, done, *, timeout_s: float, every_s: float = 10.0, on_wait=None):
    """Call `poll()` until `done(result)`, sleeping `every_s` between; the last result."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = poll()
        if done(result) or time.monotonic() >= deadline:
            return result
        if on_wait is not None:
            on_wait(result)
        time.sleep(every_s)

