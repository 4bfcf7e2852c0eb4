"""A local Cloud TPU v2 REST API for tests, spoken to by the real google-cloud-tpu client.

    with FakeTpuApi() as api:                      # in this process, on a free port
        api.set_workers([Worker("10.0.0.2", host_keys={"ssh-ed25519": "AAAAC3Nza..."})])
        client = api.client()                      # tpu_v2.TpuClient: REST, anonymous
        client.create_node(parent="projects/p/locations/us-central2-b", node_id="run",
                           node={"accelerator_type": "v4-8",
                                 "runtime_version": "tpu-ubuntu2204-base"}).result()
        api.preempt("run")
        [r.body for r in api.requests("CreateNode")]

    python -m testbed.fakes.tpu_api --host 0.0.0.0 --port 0    # its own process; prints the port
    # and is driven over HTTP: POST /_fake/<control method> with its keyword arguments as JSON

Paths, verbs, camelCase field names and enum values are those of google-cloud-tpu 1.28
(tpu_v2/services/tpu/transports/rest_base.py, tpu_v2/types/cloud_tpu.py). A mutation returns a
google.longrunning.Operation that is done when the resource's transition ends; a transition ends
after some observations of the resource (a GET of it or of its operation, a list that holds it)
and some seconds on the fake's clock (`set_timing`, `advance_clock`). Responses name enums (the
client asks for numbers, `$alt=json;enum-encoding=int`, and parses both). Errors are
`{"error": {code, message, status, details}}` under the HTTP code of their status. Credentials
are not checked. State lives in memory, behind one lock.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import re
import secrets
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from urllib.parse import parse_qs, urlsplit

from testbed.fakes.server import FakeServer

# google.rpc.Code name -> (number, HTTP status), as Google's REST front maps them.
STATUS_CODES = {
    "CANCELLED": (1, 499), "UNKNOWN": (2, 500), "INVALID_ARGUMENT": (3, 400),
    "DEADLINE_EXCEEDED": (4, 504), "NOT_FOUND": (5, 404), "ALREADY_EXISTS": (6, 409),
    "PERMISSION_DENIED": (7, 403), "RESOURCE_EXHAUSTED": (8, 429),
    "FAILED_PRECONDITION": (9, 400), "ABORTED": (10, 409), "OUT_OF_RANGE": (11, 400),
    "UNIMPLEMENTED": (12, 501), "INTERNAL": (13, 500), "UNAVAILABLE": (14, 503),
    "DATA_LOSS": (15, 500), "UNAUTHENTICATED": (16, 401),
}
TYPE_URL = "type.googleapis.com/"
PROJECT_NUMBER = "123456789012"
# Accelerator type -> (AcceleratorConfig.Type, topology, hosts). A small, realistic default.
ACCELERATORS = {
    "v4-8": ("V4", "2x2x1", 1), "v4-16": ("V4", "2x2x2", 2), "v4-32": ("V4", "2x2x4", 4),
    "v5litepod-4": ("V5LITE_POD", "2x2", 1), "v5litepod-8": ("V5LITE_POD", "2x4", 1),
    "v5litepod-16": ("V5LITE_POD", "4x4", 4), "v5p-8": ("V5P", "2x2x1", 1),
    "v6e-8": ("V6E", "2x4", 1),
}
RUNTIME_VERSIONS = (
    "tpu-ubuntu2204-base", "tpu-vm-tf-2.16.1-pjrt", "tpu-vm-tf-2.16.1-pod-pjrt",
    "tpu-vm-tf-2.18.0-pjrt", "tpu-vm-tf-2.18.0-pod-pjrt", "v2-alpha-tpuv5-lite",
    "v2-alpha-tpuv5", "v2-alpha-tpuv6e",
)
# Request bodies carry enums as numbers (rest_numeric_enums); stored by name like responses.
_ENUM_NAMES = {"type": {2: "V2", 4: "V3", 7: "V4", 9: "V5LITE_POD", 10: "V5P", 11: "V6E"},
               "mode": {1: "READ_WRITE", 2: "READ_ONLY"}}
_NODE_INPUT = ("description", "acceleratorType", "acceleratorConfig", "runtimeVersion",
               "networkConfig", "networkConfigs", "cidrBlock", "serviceAccount",
               "schedulingConfig", "labels", "metadata", "tags", "dataDisks",
               "shieldedInstanceConfig", "multisliceNode")
_UPDATABLE = ("description", "tags", "labels", "metadata", "networkConfig.enableExternalIps")
_RESOURCE_ID = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_EMPTY = {"@type": TYPE_URL + "google.protobuf.Empty"}


class ApiError(Exception):
    """A google.rpc.Status: raised by handlers, injected by tests, carried by failed operations."""

    def __init__(self, status: str, message: str, details: list | tuple = (),
                 http_code: int | None = None):
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.details = status, message, list(details)
        self.code, self.http_code = STATUS_CODES[status][0], http_code or STATUS_CODES[status][1]

    def rpc_status(self) -> dict:
        """The form of an Operation's `error` and of a queued resource's failedData.error."""
        return {"code": self.code, "message": self.message, "details": self.details}

    def http_body(self) -> dict:
        return {"error": {"code": self.http_code, "message": self.message,
                          "status": self.status, "details": self.details}}


def _error_info(reason: str, domain: str, **metadata: str) -> dict:
    return {"@type": TYPE_URL + "google.rpc.ErrorInfo", "reason": reason, "domain": domain,
            "metadata": metadata}


def permission_denied(permission: str = "tpu.nodes.create",
                      resource: str = "projects/p/locations/z") -> ApiError:
    return ApiError("PERMISSION_DENIED", f"Permission '{permission}' denied on '{resource}'",
                    [_error_info("IAM_PERMISSION_DENIED", "iam.googleapis.com",
                                 permission=permission, resource=resource)])


def service_disabled(project: str = PROJECT_NUMBER) -> ApiError:
    """What Google answers every call when the Cloud TPU API is not enabled in the project."""
    url = f"https://console.developers.google.com/apis/api/tpu.googleapis.com/overview?project={project}"
    return ApiError(
        "PERMISSION_DENIED",
        f"Cloud TPU API has not been used in project {project} before or it is disabled. Enable "
        f"it by visiting {url} then retry. If you enabled this API recently, wait a few minutes "
        "for the action to propagate to our systems and retry.",
        [_error_info("SERVICE_DISABLED", "googleapis.com", service="tpu.googleapis.com",
                     consumer=f"projects/{project}", serviceTitle="Cloud TPU API",
                     activationUrl=url, containerInfo=project),
         {"@type": TYPE_URL + "google.rpc.Help",
          "links": [{"description": "Google developers console API activation", "url": url}]}])


def quota_exceeded(zone: str = "us-central2-b",
                   limit: str = "TPUV4PodPerProjectPerZoneForTPUAPI") -> ApiError:
    message = f"Quota limit '{limit}' has been exceeded. Limit: 0 in zone {zone}."
    return ApiError("RESOURCE_EXHAUSTED", message, [
        {"@type": TYPE_URL + "google.rpc.QuotaFailure",
         "violations": [{"subject": limit, "description": message}]}])


def no_capacity(zone: str = "us-central2-b") -> ApiError:
    return ApiError("RESOURCE_EXHAUSTED",
                    f'There is no more capacity in the zone "{zone}"; you can try in another '
                    "zone where Cloud TPU Nodes are offered (see "
                    "https://cloud.google.com/tpu/docs/regions)")


def not_found(name: str) -> ApiError:
    return ApiError("NOT_FOUND", f"Resource '{name}' was not found",
                    [{"@type": TYPE_URL + "google.rpc.ResourceInfo", "resourceName": name}])


def invalid_argument(message: str, field: str | None = None) -> ApiError:
    details = [] if field is None else [{"@type": TYPE_URL + "google.rpc.BadRequest",
                                         "fieldViolations": [{"field": field,
                                                              "description": message}]}]
    return ApiError("INVALID_ARGUMENT", message, details)


PRESETS = {f.__name__: f for f in (permission_denied, service_disabled, quota_exceeded,
                                   no_capacity, not_found, invalid_argument)}


def error_from_json(data: dict) -> ApiError:
    """`{"preset": "no_capacity", "zone": ...}` or `{"status", "message", "details"?,
    "http_code"?}`: errors as the HTTP control endpoint receives them."""
    data = dict(data)
    if "preset" in data:
        return PRESETS[data.pop("preset")](**data)
    return ApiError(**data)


@dataclass
class Worker:
    """One TPU host as networkEndpoints lists it. `host_keys` (key type -> base64 body) are
    published as guest attributes `hostkeys/<type>`; None makes up an ed25519 key."""

    ip: str
    port: int = 8470
    external_ip: str | None = None
    host_keys: dict[str, str] | None = None


@dataclass(frozen=True)
class Request:
    """One request the fake received: `rpc` is the method's proto name ('CreateNode', ...)."""

    rpc: str
    method: str
    path: str
    query: dict
    body: dict


@dataclass
class _Pending:
    finish: Callable[[], dict]   # applies the end state; returns the response or raises ApiError
    polls_left: int
    due: float
    op: str | None


@dataclass
class _Node:
    body: dict
    workers: list[Worker]
    guest: list[dict[tuple[str, str], str]]   # per worker: (namespace, key) -> value
    pending: _Pending | None = None


@dataclass
class _Queued:
    body: dict
    plan: dict
    nodes: list[tuple[str, str, dict]]   # (parent, node id, node spec)
    since: float   # when it was created or last reset
    waits: int = 0
    pending: _Pending | None = None
    failure: ApiError | None = None   # why a node of it could not be provisioned

    def node_names(self) -> list[str]:
        return [f"{parent}/nodes/{node_id}" for parent, node_id, _ in self.nodes]

    def deadline(self) -> float | None:
        policy = self.body.get("queueingPolicy", {})
        if "validUntilDuration" in policy:
            return self.since + float(policy["validUntilDuration"].rstrip("s"))
        if "validUntilTime" in policy:
            return datetime.fromisoformat(policy["validUntilTime"].replace("Z", "+00:00")).timestamp()
        return None


def _as_worker(worker: Worker | dict | str) -> Worker:
    if isinstance(worker, Worker):
        return worker
    return Worker(worker) if isinstance(worker, str) else Worker(**worker)


def _made_up_host_key() -> str:
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + secrets.token_bytes(32)
    return base64.b64encode(blob).decode()


def _guest(worker: Worker) -> dict[tuple[str, str], str]:
    keys = {"ssh-ed25519": _made_up_host_key()} if worker.host_keys is None else worker.host_keys
    return {("hostkeys", kind): value for kind, value in keys.items()}


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _enum_names(value):
    if isinstance(value, list):
        return [_enum_names(v) for v in value]
    if isinstance(value, dict):
        return {k: _ENUM_NAMES[k].get(v, v) if k in _ENUM_NAMES and isinstance(v, int)
                else _enum_names(v) for k, v in value.items()}
    return value


def _typed(view: dict, type_name: str) -> dict:
    return {"@type": TYPE_URL + type_name, **view}


def _location(name: str) -> str:
    return "/".join(name.split("/")[:4])


_LOC = r"projects/[^/:]+/locations/[^/:]+"
_NODE = _LOC + r"/nodes/[^/:]+"
_QUEUED = _LOC + r"/queuedResources/[^/:]+"
_ROUTES = [(verb, re.compile(rf"/v2/(?P<target>{pattern}){re.escape(suffix)}"), rpc)
           for verb, pattern, suffix, rpc in [
    ("GET", _LOC, "/nodes", "ListNodes"),
    ("POST", _LOC, "/nodes", "CreateNode"),
    ("GET", _NODE, "", "GetNode"),
    ("DELETE", _NODE, "", "DeleteNode"),
    ("PATCH", _NODE, "", "UpdateNode"),
    ("POST", _NODE, ":stop", "StopNode"),
    ("POST", _NODE, ":start", "StartNode"),
    ("POST", _NODE, ":getGuestAttributes", "GetGuestAttributes"),
    ("GET", _LOC, "/queuedResources", "ListQueuedResources"),
    ("POST", _LOC, "/queuedResources", "CreateQueuedResource"),
    ("GET", _QUEUED, "", "GetQueuedResource"),
    ("DELETE", _QUEUED, "", "DeleteQueuedResource"),
    ("POST", _QUEUED, ":reset", "ResetQueuedResource"),
    ("GET", _LOC, "/acceleratorTypes", "ListAcceleratorTypes"),
    ("GET", _LOC + "/acceleratorTypes/[^/:]+", "", "GetAcceleratorType"),
    ("GET", _LOC, "/runtimeVersions", "ListRuntimeVersions"),
    ("GET", _LOC + "/runtimeVersions/[^/:]+", "", "GetRuntimeVersion"),
    ("GET", _LOC + "/operations/[^/:]+", "", "GetOperation"),
]]
CONTROLS = ("set_workers", "set_endpoints", "set_host_key", "set_guest_attribute",
            "hide_guest_attributes", "set_timing", "plan_queued_resource", "set_queued_state",
            "fail", "fail_operation", "clear_failures", "preempt", "set_state", "set_health",
            "set_symptoms", "set_accelerator_types", "set_runtime_versions", "set_max_page_size",
            "advance_clock", "requests", "node", "node_names", "queued_resource")


class FakeTpuApi(FakeServer):
    """The fake server and its test controls (thread-safe; node and queued-resource arguments
    take a short id such as "run" or a full resource name)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__(host, port)
        self._nodes: dict[str, _Node] = {}
        self._queued: dict[str, _Queued] = {}
        self._ops: dict[str, dict] = {}
        self._failures: list[list] = []   # [where, rpc, error, times left or None]
        self._timing = {action: (1, 0.0) for action in ("create", "delete", "stop", "start")}
        self._plans: dict[str | None, dict] = {}
        self.plan_queued_resource(None)
        self._accelerators: dict[str | None, list[str]] = {None: list(ACCELERATORS)}
        self._runtimes: dict[str | None, list[str]] = {None: list(RUNTIME_VERSIONS)}
        self._worker_factory: Callable[[str, str], list] = self._default_workers
        self._guest_hidden = False
        self._max_page_size = 50
        self._next_id = 10**18 + secrets.randbelow(10**17)
        self._next_host = 2

    def client(self):
        return tpu_client(self.endpoint)

    # -- test controls -------------------------------------------------------------------------
    def set_workers(self, workers: list) -> None:
        """Nodes created from now on get these workers (Worker, {"ip": ...} or an address)."""
        with self._lock:
            self._worker_factory = lambda node_id, accelerator_type: list(workers)

    def set_worker_factory(self, factory: Callable[[str, str], list]) -> None:
        """factory(node_id, accelerator_type) -> the workers of each node created from now on."""
        with self._lock:
            self._worker_factory = factory

    def set_endpoints(self, node: str, workers: list) -> None:
        """Replace an existing node's workers (and so its host keys)."""
        with self._lock:
            found = self._nodes[self._name(node, self._nodes)]
            found.workers = [_as_worker(w) for w in workers]
            found.guest = [_guest(w) for w in found.workers]

    def set_guest_attribute(self, node: str, worker: int, namespace: str, key: str,
                            value: str | None) -> None:
        """Publish (or, with None, withdraw) one guest attribute of one worker."""
        with self._lock:
            attributes = self._nodes[self._name(node, self._nodes)].guest[worker]
            if value is None:
                attributes.pop((namespace, key), None)
            else:
                attributes[(namespace, key)] = value

    def set_host_key(self, node: str, worker: int, key: str | None,
                     key_type: str = "ssh-ed25519") -> None:
        self.set_guest_attribute(node, worker, "hostkeys", key_type, key)

    def hide_guest_attributes(self, hidden: bool = True) -> None:
        """As under the org policy compute.disableGuestAttributesAccess: workers show no items."""
        with self._lock:
            self._guest_hidden = hidden

    def set_timing(self, action: str, polls: int = 1, seconds: float = 0.0) -> None:
        """create/delete/stop/start end after `polls` observations and `seconds` (0, 0: at once)."""
        with self._lock:
            self._timing[action] = (polls, seconds)

    def plan_queued_resource(self, queued_resource: str | None = None, *,
                             wait_polls: int | None = 0, wait_seconds: float = 0.0,
                             outcome: str = "ACTIVE", error: ApiError | None = None) -> None:
        """What a queued resource with this id (None: any without a plan of its own) does once
        created or reset: WAITING_FOR_RESOURCES for `wait_polls` observations (None: until its
        deadline) and `wait_seconds`, then PROVISIONING its nodes -> ACTIVE, or FAILED."""
        with self._lock:
            self._plans[queued_resource] = {"wait_polls": wait_polls,
                                            "wait_seconds": wait_seconds, "outcome": outcome,
                                            "error": error}

    def set_queued_state(self, queued_resource: str, state: str,
                         error: ApiError | None = None) -> None:
        with self._lock:
            self._set_queued_state(self._queued[self._name(queued_resource, self._queued)],
                                   state, error)

    def fail(self, rpc: str, error: ApiError, times: int | None = 1) -> None:
        """The next `times` calls of `rpc` ("CreateNode", ...; "*": any) answer `error`;
        times=None: every call until clear_failures()."""
        with self._lock:
            self._failures.append(["call", rpc, error, times])

    def fail_operation(self, rpc: str, error: ApiError, times: int | None = 1) -> None:
        """The next `times` CreateNode / StartNode operations end with `error` (the node is gone,
        or stays STOPPED), as capacity errors arrive: `fail_operation("CreateNode",
        no_capacity(zone))`."""
        with self._lock:
            self._failures.append(["operation", rpc, error, times])

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    def preempt(self, node: str, *, health: str | None = None, symptoms: list = ()) -> None:
        """The node goes PREEMPTED (its queued resource SUSPENDED), keeping its endpoints."""
        with self._lock:
            found = self._nodes[self._name(node, self._nodes)]
            self._abort(found, "the node was preempted")
            found.body["state"] = "PREEMPTED"
            self.set_health(node, health)
            self.set_symptoms(node, symptoms)
            queued = self._queued.get(found.body.get("queuedResource", ""))
            if queued is not None:
                self._set_queued_state(queued, "SUSPENDED")

    def set_state(self, node: str, state: str) -> None:
        """Set Node.State directly (a transition under way still ends as planned)."""
        with self._lock:
            self._nodes[self._name(node, self._nodes)].body["state"] = state

    def set_health(self, node: str, health: str | None, description: str | None = None) -> None:
        with self._lock:
            body = self._nodes[self._name(node, self._nodes)].body
            for key, value in (("health", health), ("healthDescription", description)):
                if value is None:
                    body.pop(key, None)
                else:
                    body[key] = value

    def set_symptoms(self, node: str, symptoms: list) -> None:
        """symptoms: (symptom_type, details, worker_id) tuples, e.g. ("HBM_OUT_OF_MEMORY", ...)."""
        with self._lock:
            body = self._nodes[self._name(node, self._nodes)].body
            body.pop("symptoms", None)
            if symptoms:
                body["symptoms"] = [
                    {"createTime": _timestamp(self._now()), "symptomType": kind,
                     "details": details, "workerId": str(worker)}
                    for kind, details, worker in symptoms]

    def set_accelerator_types(self, types: list[str], zone: str | None = None) -> None:
        """The types a zone offers (None: every zone without a table of its own)."""
        with self._lock:
            self._accelerators[zone] = list(types)

    def set_runtime_versions(self, versions: list[str], zone: str | None = None) -> None:
        with self._lock:
            self._runtimes[zone] = list(versions)

    def set_max_page_size(self, size: int) -> None:
        """The most items a list returns per page, also when the client asks for none."""
        with self._lock:
            self._max_page_size = size

    def node(self, node: str) -> dict:
        """The node as get_node would show it, without counting as an observation."""
        with self._lock:
            return self._node_view(self._nodes[self._name(node, self._nodes)])

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def queued_resource(self, queued_resource: str) -> dict:
        with self._lock:
            return copy.deepcopy(self._queued[self._name(queued_resource, self._queued)].body)

    # -- HTTP --------------------------------------------------------------------------------
    def handle(self, verb: str, raw_path: str, raw_body: bytes) -> tuple[int, dict]:
        url = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        with self._lock:
            try:
                body = json.loads(raw_body) if raw_body.strip() else {}
            except ValueError:
                body = None
            if not isinstance(body, dict):
                return 400, invalid_argument("the request body is not a JSON object").http_body()
            if url.path.startswith("/_fake/") and verb == "POST":
                return self._control(url.path.removeprefix("/_fake/"), body)
            rpc, target = next(((rpc, m["target"]) for v, pattern, rpc in _ROUTES
                                if v == verb and (m := pattern.fullmatch(url.path))),
                               (None, ""))
            self._log.append(Request(rpc or "?", verb, url.path, query, body))
            try:
                if rpc is None:
                    raise ApiError("NOT_FOUND", f"{verb} {url.path} is not a TPU v2 method")
                error = self._injected("call", rpc)
                if error is not None:
                    raise error
                return 200, getattr(self, "_" + rpc)(target, query, body)
            except ApiError as error:
                return error.http_code, error.http_body()
            except Exception as exc:   # a bug in the fake: say so rather than drop the line
                return 500, ApiError("INTERNAL", f"fake TPU API: {exc!r}").http_body()

    def _control(self, method: str, kwargs: dict) -> tuple[int, dict]:
        if method not in CONTROLS:
            return 404, {"error": f"no control {method!r}; known: {', '.join(CONTROLS)}"}
        if isinstance(kwargs.get("error"), dict):
            kwargs["error"] = error_from_json(kwargs["error"])
        try:
            result = getattr(self, method)(**kwargs)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            return 400, {"error": f"{type(exc).__name__}: {exc}"}
        if isinstance(result, list):
            result = [asdict(r) if isinstance(r, Request) else r for r in result]
        return 200, {"result": result}

    # -- nodes -------------------------------------------------------------------------------
    def _ListNodes(self, parent, query, body):
        for name in [n for n in self._nodes if n.startswith(parent + "/nodes/")]:
            self._observe(self._nodes[name])
        return self._page([self._node_view(self._nodes[n]) for n in sorted(self._nodes)
                           if n.startswith(parent + "/nodes/")], query, "nodes")

    def _GetNode(self, name, query, body):
        node = self._get(name, self._nodes)
        self._observe(node)
        if name not in self._nodes:
            raise not_found(name)
        return self._node_view(node)

    def _CreateNode(self, parent, query, body):
        node = self._new_node(parent, query.get("nodeId", ""), body)
        return self._transition(node, "create", "create", self._created(node, "CreateNode"))

    def _DeleteNode(self, name, query, body):
        node = self._get(name, self._nodes)
        node.body["state"] = "DELETING"
        node.body.pop("health", None)

        def finish():
            self._drop_node(name)
            return _EMPTY
        return self._transition(node, "delete", "delete", finish)

    def _StopNode(self, name, query, body):
        node = self._get(name, self._nodes)
        if len(node.workers) > 1:
            raise ApiError("FAILED_PRECONDITION",
                           "Stop is only available for single TPU nodes; delete a TPU Pod instead")
        self._require_state(node, "READY", "stopped")
        node.body["state"] = "STOPPING"

        def finish():
            node.body["state"] = "STOPPED"
            node.body.pop("health", None)
            return _typed(self._node_view(node), "google.cloud.tpu.v2.Node")
        return self._transition(node, "stop", "stop", finish)

    def _StartNode(self, name, query, body):
        node = self._get(name, self._nodes)
        self._require_state(node, "STOPPED", "started")
        node.body["state"] = "STARTING"
        return self._transition(node, "start", "start", self._created(node, "StartNode"))

    def _UpdateNode(self, name, query, body):
        node = self._get(name, self._nodes)
        paths = [re.sub(r"_(\w)", lambda m: m[1].upper(), p)
                 for p in query.get("updateMask", "").split(",") if p]
        if not paths or any(p not in _UPDATABLE for p in paths):
            raise invalid_argument(f"update_mask must name fields among {', '.join(_UPDATABLE)}",
                                   "update_mask")
        for path in paths:
            if path == "networkConfig.enableExternalIps":
                enabled = body.get("networkConfig", {}).get("enableExternalIps", False)
                node.body.setdefault("networkConfig", {})["enableExternalIps"] = enabled
            elif path in body:
                node.body[path] = copy.deepcopy(body[path])
            else:
                node.body.pop(path, None)
        op = self._new_op(name, "update")
        self._complete(op, _typed(self._node_view(node), "google.cloud.tpu.v2.Node"))
        return copy.deepcopy(self._ops[op])

    def _GetGuestAttributes(self, name, query, body):
        node = self._get(name, self._nodes)
        self._observe(node)
        path = body.get("queryPath", "")
        namespace, _, key = path.partition("/")
        answers = []
        for worker in body.get("workerIds") or [str(i) for i in range(len(node.guest))]:
            if not worker.isdigit() or int(worker) >= len(node.guest):
                raise invalid_argument(f"worker {worker!r} does not exist", "worker_ids")
            items = [] if self._guest_hidden or node.body["state"] != "READY" else [
                {"namespace": ns, "key": k, "value": v}
                for (ns, k), v in sorted(node.guest[int(worker)].items())
                if not path or (ns == namespace and (not key or k == key))]
            answers.append({"queryPath": path, **({"queryValue": {"items": items}} if items else {})})
        return {"guestAttributes": answers}

    def _new_node(self, parent: str, node_id: str, spec: dict,
                  queued_resource: str | None = None) -> _Node:
        name = self._check_node(parent, node_id, spec)
        spec = _enum_names({k: copy.deepcopy(v) for k, v in spec.items() if k in _NODE_INPUT})
        workers = [_as_worker(w) for w in
                   self._worker_factory(node_id, spec.get("acceleratorType", ""))]
        project = parent.split("/")[1]
        network = {"network": f"projects/{project}/global/networks/default",
                   "subnetwork": f"projects/{project}/regions/{parent.split('/')[3][:-2]}"
                                 "/subnetworks/default", **spec.get("networkConfig", {})}
        self._next_id += 1
        body = {"serviceAccount": {"email": f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com",
                                   "scope": ["https://www.googleapis.com/auth/cloud-platform"]},
                "schedulingConfig": {}, "cidrBlock": "10.130.0.0/20", **spec,
                "networkConfig": network, "name": name, "id": str(self._next_id),
                "state": "CREATING", "createTime": _timestamp(self._now()), "apiVersion": "V2"}
        if queued_resource:
            body["queuedResource"] = queued_resource
        node = self._nodes[name] = _Node(body, workers, [_guest(w) for w in workers])
        return node

    def _check_node(self, parent: str, node_id: str, spec: dict) -> str:
        name = f"{parent}/nodes/{node_id}"
        if not _RESOURCE_ID.fullmatch(node_id):
            raise invalid_argument(f"node id {node_id!r} must match {_RESOURCE_ID.pattern}",
                                   "node_id")
        if name in self._nodes:
            raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists")
        zone = parent.split("/")[3]
        accelerator, runtime = spec.get("acceleratorType", ""), spec.get("runtimeVersion", "")
        if not (accelerator or "acceleratorConfig" in spec) or (
                accelerator and accelerator not in self._accelerators.get(zone, self._accelerators[None])):
            raise invalid_argument(f'Accelerator type "{accelerator}" is not available in zone '
                                   f'"{zone}"', "node.accelerator_type")
        if runtime not in self._runtimes.get(zone, self._runtimes[None]):
            raise invalid_argument(f'Runtime version "{runtime}" is not available in zone '
                                   f'"{zone}"', "node.runtime_version")
        return name

    def _created(self, node: _Node, rpc: str,
                 queued: _Queued | None = None) -> Callable[[], dict]:
        """How a create or start ends: READY and HEALTHY, or an injected operation error (a
        created node is then gone, a started one STOPPED; a queued resource keeps the error)."""
        def finish():
            error = self._injected("operation", rpc)
            if error is None:
                node.body.update(state="READY", health="HEALTHY")
                return _typed(self._node_view(node), "google.cloud.tpu.v2.Node")
            if rpc == "StartNode":
                node.body["state"] = "STOPPED"
            else:
                self._drop_node(node.body["name"])
            if queued is not None:
                queued.failure = error
            raise error
        return finish

    def _node_view(self, node: _Node) -> dict:
        view = copy.deepcopy(node.body)
        if "schedulingConfig" in view:
            # proto3 JSON leaves out false flags: an on-demand node's answer is `{}`.
            view["schedulingConfig"] = {k: v for k, v in view["schedulingConfig"].items() if v}
        if view["state"] != "CREATING":
            external = view["networkConfig"].get("enableExternalIps", False)
            view["networkEndpoints"] = [
                {"ipAddress": w.ip, "port": w.port,
                 **({"accessConfig": {"externalIp": w.external_ip or w.ip}} if external else {})}
                for w in node.workers]
        return view

    def _default_workers(self, node_id: str, accelerator_type: str) -> list[Worker]:
        hosts = ACCELERATORS.get(accelerator_type, ("", "", 1))[2]
        first, self._next_host = self._next_host, self._next_host + hosts
        return [Worker(f"10.130.{n // 250}.{n % 250 + 2}", external_ip=f"34.1.{n // 250}.{n % 250 + 2}")
                for n in range(first, first + hosts)]

    def _drop_node(self, name: str) -> None:
        node = self._nodes.pop(name, None)
        if node is not None:
            self._abort(node, "the node was deleted")

    @staticmethod
    def _require_state(node: _Node, state: str, verb: str) -> None:
        if node.body["state"] != state:
            raise ApiError("FAILED_PRECONDITION", f"Node '{node.body['name']}' can be {verb} "
                                                  f"only when {state}, not {node.body['state']}")

    # -- queued resources --------------------------------------------------------------------
    def _ListQueuedResources(self, parent, query, body):
        prefix = parent + "/queuedResources/"
        for name in [n for n in self._queued if n.startswith(prefix)]:
            self._observe_queued(self._queued[name])
        return self._page([copy.deepcopy(self._queued[n].body) for n in sorted(self._queued)
                           if n.startswith(prefix)], query, "queuedResources")

    def _GetQueuedResource(self, name, query, body):
        self._observe_queued(self._get(name, self._queued))
        return copy.deepcopy(self._get(name, self._queued).body)

    def _CreateQueuedResource(self, parent, query, body):
        queued_id = query.get("queuedResourceId", "")
        name = f"{parent}/queuedResources/{queued_id}"
        if not _RESOURCE_ID.fullmatch(queued_id):
            raise invalid_argument(f"queued resource id {queued_id!r} is invalid",
                                   "queued_resource_id")
        if name in self._queued:
            raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists")
        nodes = []
        for spec in body.get("tpu", {}).get("nodeSpec", []):
            multi = spec.get("multisliceParams")
            if multi is not None and "nodeId" in spec:   # one oneof, name_strategy
                raise invalid_argument("set node_id or multislice_params, not both",
                                       "queued_resource.tpu.node_spec")
            if multi is not None and int(multi.get("nodeCount", 0)) <= 1:
                raise invalid_argument("multislice_params.node_count must be > 1",
                                       "queued_resource.tpu.node_spec.multislice_params")
            node = spec.get("node", {})
            if multi is not None:   # the API marks each node of a multislice request
                node = {**node, "multisliceNode": True}
            ids = [spec.get("nodeId", "")] if multi is None else [
                f"{multi.get('nodeIdPrefix') or queued_id}-{i}"
                for i in range(int(multi["nodeCount"]))]
            nodes += [(spec.get("parent") or parent, node_id, node) for node_id in ids]
        if not nodes:
            raise invalid_argument("tpu.node_spec is required", "queued_resource.tpu.node_spec")
        for node_parent, node_id, spec in nodes:
            self._check_node(node_parent, node_id, spec)
        now = self._now()
        kept = ("tpu", "spot", "guaranteed", "queueingPolicy", "reservationName")
        queued = self._queued[name] = _Queued(
            {**{k: copy.deepcopy(body[k]) for k in kept if k in body}, "name": name,
             "createTime": _timestamp(now)},
            dict(self._plans.get(queued_id, self._plans[None])), nodes, now)
        self._set_queued_state(queued, "ACCEPTED", initiator="USER")
        op = self._new_op(name, "create")
        self._complete(op, _typed(copy.deepcopy(queued.body), "google.cloud.tpu.v2.QueuedResource"))
        return copy.deepcopy(self._ops[op])

    def _DeleteQueuedResource(self, name, query, body):
        queued = self._get(name, self._queued)
        live = [n for n in queued.node_names() if n in self._nodes]
        state = queued.body["state"]["state"]
        force = query.get("force", "").lower() == "true"
        if live and not force and state not in ("ACCEPTED", "FAILED", "SUSPENDED"):
            raise ApiError("FAILED_PRECONDITION",
                           f"Queued resource '{name}' is {state} and still has nodes: delete "
                           "them first, or delete with force")
        doomed = live if force else []
        for node in doomed:
            self._abort(self._nodes[node], "the queued resource is being deleted")
            self._nodes[node].body["state"] = "DELETING"
        self._set_queued_state(queued, "DELETING", initiator="USER")

        def finish():
            for node in doomed:
                self._drop_node(node)
            del self._queued[name]
            return _EMPTY
        return self._transition(queued, "delete", "delete", finish)

    def _ResetQueuedResource(self, name, query, body):
        queued = self._get(name, self._queued)
        if queued.body["state"]["state"] not in ("FAILED", "SUSPENDED"):
            raise ApiError("FAILED_PRECONDITION", f"Queued resource '{name}' can be reset only "
                                                  "when FAILED or SUSPENDED")
        for node in queued.node_names():
            self._drop_node(node)
        queued.waits, queued.since, queued.failure = 0, self._now(), None
        queued.plan = dict(self._plans.get(name.rsplit("/", 1)[1], self._plans[None]))
        self._set_queued_state(queued, "ACCEPTED", initiator="USER")
        op = self._new_op(name, "reset")
        self._complete(op, _typed(copy.deepcopy(queued.body), "google.cloud.tpu.v2.QueuedResource"))
        return copy.deepcopy(self._ops[op])

    def _observe_queued(self, queued: _Queued) -> None:
        """One observation: its nodes move on, then the request takes its next scripted step."""
        for node in queued.node_names():
            if node in self._nodes:
                self._observe(self._nodes[node])
        if queued.pending is not None:
            self._observe(queued)
            return
        plan, now = queued.plan, self._now()
        state = queued.body["state"]["state"]
        if state in ("ACCEPTED", "WAITING_FOR_RESOURCES"):
            if queued.deadline() is not None and now >= queued.deadline():
                self._set_queued_state(queued, "FAILED", ApiError(
                    "DEADLINE_EXCEEDED", "The queued resource was not provisioned before the "
                                         "deadline of its queueing policy"))
            elif (plan["wait_polls"] is None or queued.waits < plan["wait_polls"]
                  or now < queued.since + plan["wait_seconds"]):
                queued.waits += 1
                self._set_queued_state(queued, "WAITING_FOR_RESOURCES")
            elif plan["outcome"] == "FAILED":
                zone = queued.body["name"].split("/")[3]
                self._set_queued_state(queued, "FAILED", plan["error"] or no_capacity(zone))
            else:
                self._provision(queued)
        live = [self._nodes.get(n) for n in queued.node_names()]
        state = queued.body["state"]["state"]
        if state == "PROVISIONING" and None in live:
            self._set_queued_state(queued, "FAILED", queued.failure or ApiError(
                "INTERNAL", "A node of the queued resource could not be provisioned"))
        elif state == "PROVISIONING" and all(n.body["state"] == "READY" for n in live):
            self._set_queued_state(queued, "ACTIVE")
        elif state == "ACTIVE" and None in live:
            self._set_queued_state(queued, "SUSPENDED")

    def _provision(self, queued: _Queued) -> None:
        try:
            for parent, node_id, spec in queued.nodes:
                if "spot" in queued.body:
                    spec = {**spec, "schedulingConfig": {**spec.get("schedulingConfig", {}),
                                                         "spot": True}}
                node = self._new_node(parent, node_id, spec, queued.body["name"])
                self._transition(node, "create", "create", self._created(node, "CreateNode", queued),
                                 with_op=False)
        except ApiError as error:
            self._set_queued_state(queued, "FAILED", error)
        else:
            self._set_queued_state(queued, "PROVISIONING")

    @staticmethod
    def _set_queued_state(queued: _Queued, state: str, error: ApiError | None = None,
                          initiator: str = "SERVICE") -> None:
        queued.body["state"] = {"state": state, "stateInitiator": initiator}
        if error is not None:
            queued.body["state"]["failedData"] = {"error": error.rpc_status()}

    # -- catalogue and operations -------------------------------------------------
    def _ListAcceleratorTypes(self, parent, query, body):
        types = self._accelerators.get(parent.split("/")[3], self._accelerators[None])
        return self._page([self._accelerator(parent, t) for t in types], query,
                          "acceleratorTypes")

    def _GetAcceleratorType(self, name, query, body):
        parent, _, kind = name.partition("/acceleratorTypes/")
        if kind not in self._accelerators.get(parent.split("/")[3], self._accelerators[None]):
            raise not_found(name)
        return self._accelerator(parent, kind)

    @staticmethod
    def _accelerator(parent: str, kind: str) -> dict:
        view = {"name": f"{parent}/acceleratorTypes/{kind}", "type": kind}
        if kind in ACCELERATORS:
            view["acceleratorConfigs"] = [{"type": ACCELERATORS[kind][0],
                                           "topology": ACCELERATORS[kind][1]}]
        return view

    def _ListRuntimeVersions(self, parent, query, body):
        versions = self._runtimes.get(parent.split("/")[3], self._runtimes[None])
        return self._page([{"name": f"{parent}/runtimeVersions/{v}", "version": v}
                           for v in versions], query, "runtimeVersions")

    def _GetRuntimeVersion(self, name, query, body):
        parent, _, version = name.partition("/runtimeVersions/")
        if version not in self._runtimes.get(parent.split("/")[3], self._runtimes[None]):
            raise not_found(name)
        return {"name": name, "version": version}

    def _GetOperation(self, name, query, body):
        op = self._get(name, self._ops)
        target = op["metadata"]["target"]
        if target in self._nodes:
            self._observe(self._nodes[target])
        elif target in self._queued:
            self._observe_queued(self._queued[target])
        return copy.deepcopy(op)

    # -- transitions and plumbing --------------------------------------------------------------
    def _transition(self, resource, action: str, verb: str, finish: Callable[[], dict],
                    with_op: bool = True) -> dict | None:
        """Start a transition that ends with `finish` after the configured observations and
        seconds; returns its Operation."""
        self._abort(resource, f"superseded by {verb}")
        op = self._new_op(resource.body["name"], verb) if with_op else None
        polls, seconds = self._timing[action]
        resource.pending = _Pending(finish, polls, self._now() + seconds, op)
        if polls <= 0 and seconds <= 0:
            self._finish(resource)
        return copy.deepcopy(self._ops[op]) if op else None

    def _observe(self, resource) -> None:
        pending = resource.pending
        if pending is not None:
            pending.polls_left -= 1
            if pending.polls_left <= 0 and self._now() >= pending.due:
                self._finish(resource)

    def _finish(self, resource) -> None:
        pending, resource.pending = resource.pending, None
        try:
            self._complete(pending.op, pending.finish())
        except ApiError as error:
            self._complete(pending.op, error=error)

    def _abort(self, resource, why: str) -> None:
        pending, resource.pending = resource.pending, None
        if pending is not None:
            self._complete(pending.op, error=ApiError("ABORTED", why))

    def _new_op(self, target: str, verb: str) -> str:
        now = self._now()
        name = f"{_location(target)}/operations/operation-{int(now * 1000)}-{secrets.token_hex(8)}"
        self._ops[name] = {"name": name, "done": False, "metadata": {
            "@type": TYPE_URL + "google.cloud.tpu.v2.OperationMetadata",
            "createTime": _timestamp(now), "target": target, "verb": verb, "apiVersion": "v2"}}
        return name

    def _complete(self, op: str | None, response: dict | None = None,
                  error: ApiError | None = None) -> None:
        if op is None:
            return
        self._ops[op].update(done=True, **({"response": response} if error is None
                                             else {"error": error.rpc_status()}))
        self._ops[op]["metadata"]["endTime"] = _timestamp(self._now())

    def _injected(self, where: str, rpc: str) -> ApiError | None:
        for failure in self._failures:
            if failure[0] == where and failure[1] in (rpc, "*") and failure[3] != 0:
                if failure[3] is not None:
                    failure[3] -= 1
                return failure[2]
        return None

    def _page(self, items: list, query: dict, key: str) -> dict:
        try:
            start = int(base64.urlsafe_b64decode(query.get("pageToken") or "MA=="))
        except ValueError:
            raise invalid_argument("page_token is not valid", "page_token") from None
        size = int(query.get("pageSize") or 0)
        size = min(size, self._max_page_size) if size > 0 else self._max_page_size
        page = {key: items[start:start + size]}
        if start + size < len(items):
            page["nextPageToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
        return page

    @staticmethod
    def _get(name: str, table: dict):
        if name not in table:
            raise not_found(name)
        return table[name]

    @staticmethod
    def _name(short: str, table: dict) -> str:
        """A full resource name from a short id (unique among the live resources)."""
        matches = [n for n in table if n == short or n.rsplit("/", 1)[-1] == short]
        if len(matches) != 1:
            raise KeyError(f"{short!r} names {len(matches)} resources: {matches}")
        return matches[0]


def tpu_client(endpoint: str):
    """The real tpu_v2.TpuClient, on REST with anonymous credentials, pointed at `endpoint`."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2

    return tpu_v2.TpuClient(credentials=AnonymousCredentials(), transport="rest",
                            client_options=ClientOptions(api_endpoint=endpoint))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A local Cloud TPU v2 REST API for tests.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    args = parser.parse_args(argv)
    api = FakeTpuApi(args.host, args.port)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(api.port, flush=True)
    api.serve_forever()


if __name__ == "__main__":
    main()
