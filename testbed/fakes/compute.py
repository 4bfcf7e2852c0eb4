"""A local Compute Engine REST API for the gce provider's tests, spoken to by the real
google-cloud-compute client: the slice's policy, template, bulk MIG and its TPU VMs.

    with FakeCompute() as api:                        # in this process, on a free port
        api.set_workers([Worker("10.0.0.2", host_keys={"ssh-ed25519": "AAAAC3Nza..."})])
        clients = api.clients()                       # compute_v1 clients: REST, anonymous
        clients.groups.insert(project="p", region="us-east5",
                              instance_group_manager_resource={...}).result()
        api.set_capacity("us-east5-b", after_polls=3) # creation waits, then gets it all
        api.set_quota(quota_exceeded("TPU_V6E", "us-east5"))  # waits on quota until cleared
        api.fail("regionInstanceGroupManagers.insert", error)  # any call ends with an error
        api.on_request("regionInstanceGroupManagers.insert", lambda: api.add_group(...))
        [r.body for r in api.requests("regionInstanceTemplates.insert")]

Paths, verbs, camelCase fields and enum names are google-cloud-compute 1.57's (compute_v1
services/*/transports/rest_base.py, types/compute.py). What it does as the real service does:
- every mutation answers a compute#operation (regional; global for a firewall rule; zonal for
  an instance) that goes PENDING, then RUNNING, then DONE as it is read (`set_timing(op_polls=)`);
  an operation that failed carries `error.errors[]` and `httpErrorStatusCode` once DONE (the
  client's ExtendedOperation raises from those);
- a MIG's insert is DONE once the group exists, before any VM; its targetSizePolicy.mode decides
  how it makes them. BULK ("all at once or none"), which Compute Engine takes only with a
  FLEX_START or RESERVATION_BOUND template (any other is refused at insert, 400 invalid): while
  its zone lacks capacity or the region quota, `status.bulkInstanceOperation.inProgress` stays
  true and `lastProgressCheck.error` says why (ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS,
  QUOTA_EXCEEDED), and no VM exists. INDIVIDUAL (the default): each managed instance waits
  CREATING with the reason in `lastAttempt.errors` until it can be made (`set_capacity(vms=)`
  lets some be made while the others wait);
- with a workload policy, `status.appliedAcceleratorTopologies[0].state` is INCOMPLETE while
  fewer VMs run than the group's size, then ACTIVATING, then ACTIVE (`fail_topology` makes it
  FAILED with `stateDetails.error`);
- PATCH updates a MIG's versions and policies (or a firewall's rules) in place, `resize` its
  target size, as the google provider's updates do;
- a VM goes PROVISIONING -> STAGING -> RUNNING over observations (a GET, a listing), and its
  guest agent publishes `hostkeys/<type>` some seconds later (`set_timing`): before that,
  getGuestAttributes answers 404 notFound for the query path, as for a path that holds nothing;
- a VM taken back (`preempt`) whose scheduling says instanceTerminationAction DELETE (spot,
  flex-start, a run limit) is deleted; its MIG lists it CREATING without an instance (the fake
  never makes it again); any other is TERMINATED;
- errors are `{"error": {code, message, errors: [{message, domain, reason}]}}` under their HTTP
  status (404 notFound, 409 alreadyExists, 400 invalid, 403 quotaExceeded...).
State lives in memory, behind one lock; credentials are not checked. Its VMs are the test
fleet's sshd workers (their addresses and real host keys), as in testbed/fakes/tpu_api.py.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from testbed.fakes.server import FakeServer
from testbed.fakes.tpu_api import Worker, _as_worker, _guest, _timestamp

PREFIX = "/compute/v1/"
TPU_MACHINE_TYPES = ("tpu7x-standard-1t", "tpu7x-standard-4t", "ct6e-standard-1t",
                     "ct6e-standard-4t", "ct6e-standard-8t", "ct5p-hightpu-4t")
_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_HTTP_REASON = {400: "invalid", 403: "forbidden", 404: "notFound", 409: "alreadyExists",
                412: "conditionNotMet", 429: "rateLimitExceeded", 503: "backendError"}


class ComputeError(Exception):
    """An error answer: the HTTP status, its message and the errors[] reason."""

    def __init__(self, http_code: int, message: str, reason: str | None = None,
                 *, code: str | None = None, details: list | None = None):
        super().__init__(message)
        self.http_code, self.message = http_code, message
        self.reason = reason or _HTTP_REASON.get(http_code, "backendError")
        self.code = code or self.reason.upper()  # what an operation's error.errors[] calls it
        self.details = details or []

    def http_body(self) -> dict:
        return {"error": {"code": self.http_code, "message": self.message,
                          "errors": [{"message": self.message, "domain": "global",
                                      "reason": self.reason}]}}

    def operation_errors(self) -> list[dict]:
        entry = {"code": self.code, "message": self.message}
        if self.details:
            entry["errorDetails"] = self.details
        return [entry]


def not_found(path: str) -> ComputeError:
    return ComputeError(404, f"The resource '{path}' was not found")


def already_exists(path: str) -> ComputeError:
    return ComputeError(409, f"The resource '{path}' already exists")


def quota_exceeded(metric: str = "TPU_V6E", region: str = "us-east5",
                   limit: float = 0.0) -> ComputeError:
    """What an insert's operation ends with when the region's quota is too small."""
    message = f"Quota '{metric}' exceeded.  Limit: {limit} in region {region}."
    return ComputeError(403, message, "quotaExceeded", code="QUOTA_EXCEEDED", details=[
        {"quotaInfo": {"metricName": f"compute.googleapis.com/{metric.lower()}",
                       "limitName": f"{metric}-per-project-region",
                       "dimensions": {"region": region}, "limit": limit}}])


def no_capacity(zone: str = "us-east5-b") -> ComputeError:
    """What a MIG waiting for capacity reports (the code Compute Engine gives TPU MIGs)."""
    return ComputeError(503, f"The zone 'projects/p/zones/{zone}' does not have enough "
                        "resources available to fulfill the request.  '(resource type:compute)'.",
                        "resourcePoolExhausted", code="ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")


def bulk_refused(model: str) -> ComputeError:
    """A MIG in bulk mode from a template of another provisioning model (Compute Engine takes
    bulk mode only with flex-start or reservation-bound templates)."""
    return ComputeError(400, "Invalid value for field 'resource.targetSizePolicy.mode': 'BULK'. "
                        "Bulk mode is supported only with instance templates that specify the "
                        f"FLEX_START or RESERVATION_BOUND provisioning model, not {model}.")


@dataclass(frozen=True)
class Request:
    rpc: str  # "regionInstanceGroupManagers.insert", ...
    method: str
    path: str
    query: dict
    body: dict


@dataclass
class _Instance:
    body: dict
    worker: Worker
    guest: dict
    polls: int = 0  # observations since it was made: PROVISIONING, STAGING, then RUNNING
    running_since: float | None = None


@dataclass
class _Operation:
    body: dict
    error: ComputeError | None  # what it ends with, once DONE
    reads: int = 0


@dataclass
class _Group:
    body: dict
    instances: list[str] = field(default_factory=list)  # instance paths, in creation order
    waits: int = 0  # observations while waiting for capacity
    names: list[str] = field(default_factory=list)  # the VMs' names, given before they exist
    waiting: ComputeError | None = None  # why the VMs it lacks are not made yet
    active_polls: int = 0  # observations with every VM running (ACTIVATING, then ACTIVE)
    topology_error: ComputeError | None = None  # fail_topology: the topology is FAILED


_RUN_STATES = ("PROVISIONING", "STAGING", "RUNNING")
_ROUTES = [(verb, re.compile(PREFIX + pattern + "$"), rpc) for verb, pattern, rpc in [
    ("POST", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/resourcePolicies",
     "resourcePolicies.insert"),
    ("GET", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/resourcePolicies", "resourcePolicies.list"),
    ("GET", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/resourcePolicies/(?P<n>[^/]+)",
     "resourcePolicies.get"),
    ("DELETE", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/resourcePolicies/(?P<n>[^/]+)",
     "resourcePolicies.delete"),
    ("POST", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceTemplates",
     "regionInstanceTemplates.insert"),
    ("GET", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceTemplates",
     "regionInstanceTemplates.list"),
    ("GET", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceTemplates/(?P<n>[^/]+)",
     "regionInstanceTemplates.get"),
    ("DELETE", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceTemplates/(?P<n>[^/]+)",
     "regionInstanceTemplates.delete"),
    ("POST", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceGroupManagers",
     "regionInstanceGroupManagers.insert"),
    ("GET", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceGroupManagers",
     "regionInstanceGroupManagers.list"),
    ("GET", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceGroupManagers/(?P<n>[^/]+)",
     "regionInstanceGroupManagers.get"),
    ("DELETE", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceGroupManagers/(?P<n>[^/]+)",
     "regionInstanceGroupManagers.delete"),
    ("PATCH", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceGroupManagers/(?P<n>[^/]+)",
     "regionInstanceGroupManagers.patch"),
    ("POST", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceGroupManagers/(?P<n>[^/]+)"
     r"/resize", "regionInstanceGroupManagers.resize"),
    ("POST", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/instanceGroupManagers/(?P<n>[^/]+)"
     r"/listManagedInstances", "regionInstanceGroupManagers.listManagedInstances"),
    ("GET", r"projects/(?P<p>[^/]+)/regions/(?P<r>[^/]+)/operations/(?P<n>[^/]+)",
     "regionOperations.get"),
    ("POST", r"projects/(?P<p>[^/]+)/global/firewalls", "firewalls.insert"),
    ("GET", r"projects/(?P<p>[^/]+)/global/firewalls/(?P<n>[^/]+)", "firewalls.get"),
    ("DELETE", r"projects/(?P<p>[^/]+)/global/firewalls/(?P<n>[^/]+)", "firewalls.delete"),
    ("PATCH", r"projects/(?P<p>[^/]+)/global/firewalls/(?P<n>[^/]+)", "firewalls.patch"),
    ("GET", r"projects/(?P<p>[^/]+)/global/operations/(?P<n>[^/]+)", "globalOperations.get"),
    ("GET", r"projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/instances", "instances.list"),
    ("GET", r"projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/instances/(?P<n>[^/]+)", "instances.get"),
    ("GET", r"projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/instances/(?P<n>[^/]+)/getGuestAttributes",
     "instances.getGuestAttributes"),
    ("DELETE", r"projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/instances/(?P<n>[^/]+)",
     "instances.delete"),
    ("GET", r"projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/operations/(?P<n>[^/]+)",
     "zoneOperations.get"),
    ("GET", r"projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/machineTypes/(?P<n>[^/]+)",
     "machineTypes.get"),
]]


def _with_template(body: dict) -> dict:
    """A MIG body as the API keeps it: the google provider sends its template as versions[]
    (one version), and the API shows it as instanceTemplate too."""
    versions = body.get("versions") or []
    if versions and versions[0].get("instanceTemplate"):
        body["instanceTemplate"] = versions[0]["instanceTemplate"]
    return body


def _template_of(body: dict) -> str:
    return body.get("instanceTemplate", "")


def _bulk(body: dict) -> bool:
    return body.get("targetSizePolicy", {}).get("mode") == "BULK"


class FakeCompute(FakeServer):
    """The fake server and its test controls (thread-safe)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        super().__init__(host, port)
        self._firewalls: dict[str, dict] = {}  # self path (projects/...) -> body
        self._policies: dict[str, dict] = {}
        self._templates: dict[str, dict] = {}
        self._groups: dict[str, _Group] = {}
        self._instances: dict[str, _Instance] = {}  # projects/P/zones/Z/instances/N -> VM
        self._ops: dict[str, _Operation] = {}
        self._failures: list[list] = []  # [rpc, error, times left or None]
        self._actions: list[list] = []  # [rpc, what to do first, times left]
        self._capacity: dict[str | None, int | None] = {None: 0}  # zone -> polls to wait
        self._partial: dict[str | None, int] = {None: 0}  # zone -> VMs made while others wait
        self._quota: ComputeError | None = None  # set_quota: every MIG waits on it
        self._topology_failures: dict[str, ComputeError] = {}  # MIG name -> once it is made
        self._boot_polls = 2  # observations from PROVISIONING to RUNNING
        self._op_polls = 2  # reads of an operation from PENDING to DONE
        self._topology_polls = 1  # observations of a full slice from ACTIVATING to ACTIVE
        self._host_key_delay_s = 0.0  # after RUNNING, before hostkeys/ are published
        self._workers: list[Worker] = []
        # zone -> the machine types it offers (None: every zone without its own list)
        self._machine_types: dict[str | None, list[str]] = {None: list(TPU_MACHINE_TYPES)}
        self._next_worker = 0
        self._next_id = 5 * 10**18 + secrets.randbelow(10**17)

    # -- test controls -------------------------------------------------------------------------
    def set_workers(self, workers: list) -> None:
        """The VMs made from now on take these workers in turn (Worker, dict or an address)."""
        with self._lock:
            self._workers = [_as_worker(w) for w in workers]
            self._next_worker = 0

    def set_capacity(self, zone: str | None = None, *, after_polls: int | None = 0,
                     vms: int = 0) -> None:
        """A MIG in `zone` (None: every zone without its own setting) waits `after_polls`
        observations for capacity, then gets all of it; None: never. `vms`: how many VMs a MIG
        in individual mode makes at once while the others wait (a bulk MIG makes none)."""
        with self._lock:
            self._capacity[zone] = after_polls
            self._partial[zone] = vms

    def set_quota(self, exceeded: ComputeError | None) -> None:
        """Every MIG waits on this quota error (quota_exceeded) until it is set to None: a bulk
        MIG in its last progress check, an individual one in its instances' last attempts."""
        with self._lock:
            self._quota = exceeded

    def fail_topology(self, group: str, error: ComputeError) -> None:
        """The MIG's applied accelerator topology turns FAILED, with this error; a MIG not made
        yet (one slice of several) fails so once it is made."""
        with self._lock:
            found = next((g for p, g in self._groups.items() if p.rsplit("/", 1)[1] == group),
                         None)
            if found is None:
                self._topology_failures[group] = error
            else:
                found.topology_error = error

    def set_machine_types(self, types: list[str], zone: str | None = None) -> None:
        """The machine types a zone offers (None: every zone without a list of its own)."""
        with self._lock:
            self._machine_types[zone] = list(types)

    def set_timing(self, *, boot_polls: int = 2, host_key_delay_s: float = 0.0,
                   op_polls: int = 2, topology_polls: int = 1) -> None:
        with self._lock:
            self._boot_polls, self._host_key_delay_s = boot_polls, host_key_delay_s
            self._op_polls, self._topology_polls = op_polls, topology_polls

    def fail(self, rpc: str, error: ComputeError, times: int | None = 1) -> None:
        """The next `times` calls of `rpc` end with `error`: an insert's operation carries it
        (as quota errors arrive), any other call answers it."""
        with self._lock:
            self._failures.append([rpc, error, times])

    def on_request(self, rpc: str, action, times: int = 1) -> None:
        """The next `times` calls of `rpc` first run `action()`, in the server, before they are
        answered: what someone else does (or a process that dies) at that moment."""
        with self._lock:
            self._actions.append([rpc, action, times])

    def add_instance(self, project: str, zone: str, name: str, *, labels: dict | None = None,
                     worker: Worker | None = None) -> dict:
        """A VM someone made by hand (no MIG): it must survive anything tpuctl does."""
        with self._lock:
            vm = self._new_instance(project, zone, name, {"labels": labels or {}}, worker)
            return copy.deepcopy(vm.body)

    def add_group(self, project: str, region: str, name: str, body: dict | None = None) -> dict:
        """A MIG someone made by hand, with the given fields."""
        with self._lock:
            path = f"projects/{project}/regions/{region}/instanceGroupManagers/{name}"
            group = self._groups[path] = _Group(self._resource(
                path, "compute#instanceGroupManager",
                {"targetSize": 0, **(body or {}), "name": name, "region": self._url(
                    f"projects/{project}/regions/{region}")}))
            self._name_instances(group)
            return copy.deepcopy(group.body)

    def add_policy(self, project: str, region: str, name: str, body: dict | None = None) -> dict:
        """A workload policy someone made by hand, with the given fields."""
        with self._lock:
            path = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
            self._check_new(self._policies, path, {"name": name})
            self._policies[path] = self._resource(path, "compute#resourcePolicy", {
                "status": "READY", **(body or {}), "name": name,
                "region": self._url(f"projects/{project}/regions/{region}")})
            return copy.deepcopy(self._policies[path])

    def preempt(self, instance: str) -> None:
        """A VM taken back (spot preemption, a flex-start VM's end): deleted when its scheduling
        says instanceTerminationAction DELETE, else TERMINATED; its guest agent gone."""
        with self._lock:
            path = self._find(instance)
            vm = self._instances[path]
            if vm.body.get("scheduling", {}).get("instanceTerminationAction") == "DELETE":
                del self._instances[path]  # the MIG's entry stays, without its instance
                return
            vm.body["status"] = "TERMINATED"
            vm.guest.clear()

    def instance_names(self) -> list[str]:
        with self._lock:
            return sorted(path.rsplit("/", 1)[1] for path in self._instances)

    def group_names(self) -> list[str]:
        with self._lock:
            return sorted(path.rsplit("/", 1)[1] for path in self._groups)

    def template_names(self) -> list[str]:
        with self._lock:
            return sorted(path.rsplit("/", 1)[1] for path in self._templates)

    def firewall(self, name: str) -> dict:
        with self._lock:
            return copy.deepcopy(next(b for p, b in self._firewalls.items()
                                      if p.rsplit("/", 1)[1] == name))

    def firewall_names(self) -> list[str]:
        with self._lock:
            return sorted(path.rsplit("/", 1)[1] for path in self._firewalls)

    def policy_names(self) -> list[str]:
        with self._lock:
            return sorted(path.rsplit("/", 1)[1] for path in self._policies)

    def instance(self, name: str) -> dict:
        with self._lock:
            return copy.deepcopy(self._instances[self._find(name)].body)

    # -- HTTP --------------------------------------------------------------------------------
    def handle(self, verb: str, raw_path: str, raw_body: bytes) -> tuple[int, dict]:
        url = urlsplit(raw_path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        with self._lock:
            try:
                body = json.loads(raw_body) if raw_body.strip() else {}
            except ValueError:
                return 400, ComputeError(400, "Invalid JSON payload received.").http_body()
            found = next(((rpc, m.groupdict()) for v, pattern, rpc in _ROUTES
                          if v == verb and (m := pattern.fullmatch(url.path))), (None, {}))
            rpc, args = found
            self._log.append(Request(rpc or "?", verb, url.path, query, body))
            for action in self._actions:
                if action[0] == rpc and action[2] > 0:
                    action[2] -= 1
                    action[1]()
            try:
                if rpc is None:
                    raise ComputeError(404, f"{verb} {url.path} is not a Compute Engine method "
                                       "this fake serves")
                error = self._injected(rpc)
                if error is not None and not rpc.endswith(".insert"):
                    raise error
                handler = getattr(self, "_" + rpc.replace(".", "_"))
                return 200, handler(args, query, body, error)
            except ComputeError as error:
                return error.http_code, error.http_body()
            except Exception as exc:  # a bug in the fake: say so rather than drop the line
                return 500, ComputeError(500, f"fake Compute Engine: {exc!r}").http_body()

    # -- resource policies and templates -------------------------------------------------------
    def _resourcePolicies_insert(self, a, query, body, error):
        return self._insert(self._policies, a, "resourcePolicies", "compute#resourcePolicy",
                            body, error, extra={"status": "READY"})

    def _resourcePolicies_get(self, a, query, body, error):
        return copy.deepcopy(self._get(self._policies, self._path(a, "resourcePolicies")))

    def _resourcePolicies_list(self, a, query, body, error):
        return self._list(self._policies, self._path(a, "resourcePolicies", named=False),
                          "compute#resourcePolicyList", query)

    def _resourcePolicies_delete(self, a, query, body, error):
        path = self._path(a, "resourcePolicies")
        self._get(self._policies, path)
        users = [g for g in self._groups.values() if g.body.get("resourcePolicies", {}).get(
            "workloadPolicy", "").endswith(path)]
        if users:
            raise ComputeError(400, f"The resource_policy resource '{path}' is already being "
                               f"used by '{users[0].body['selfLink']}'", "resourceInUseByAnotherResource")
        del self._policies[path]
        return self._operation(a, "delete", path)

    def _firewalls_insert(self, a, query, body, error):
        path = f"projects/{a['p']}/global/firewalls/{body.get('name', '')}"
        self._check_new(self._firewalls, path, body)
        if error is not None:
            return self._operation(a, "insert", path, error=error)
        self._firewalls[path] = self._resource(path, "compute#firewall", {
            "priority": 1000, "disabled": False, **copy.deepcopy(body)})
        return self._operation(a, "insert", path, target_id=self._firewalls[path]["id"])

    def _firewalls_get(self, a, query, body, error):
        return copy.deepcopy(self._get(self._firewalls,
                                       f"projects/{a['p']}/global/firewalls/{a['n']}"))

    def _firewalls_patch(self, a, query, body, error):
        path = f"projects/{a['p']}/global/firewalls/{a['n']}"
        rule = self._get(self._firewalls, path)
        if error is not None:
            return self._operation(a, "patch", path, error=error)
        rule.update({k: v for k, v in copy.deepcopy(body).items() if k not in ("name", "id")})
        return self._operation(a, "patch", path, target_id=rule["id"])

    def _firewalls_delete(self, a, query, body, error):
        path = f"projects/{a['p']}/global/firewalls/{a['n']}"
        self._get(self._firewalls, path)
        del self._firewalls[path]
        return self._operation(a, "delete", path)

    def _regionInstanceTemplates_insert(self, a, query, body, error):
        return self._insert(self._templates, a, "instanceTemplates", "compute#instanceTemplate",
                            body, error)

    def _regionInstanceTemplates_get(self, a, query, body, error):
        return copy.deepcopy(self._get(self._templates, self._path(a, "instanceTemplates")))

    def _regionInstanceTemplates_list(self, a, query, body, error):
        return self._list(self._templates, self._path(a, "instanceTemplates", named=False),
                          "compute#instanceTemplateList", query)

    def _regionInstanceTemplates_delete(self, a, query, body, error):
        path = self._path(a, "instanceTemplates")
        self._get(self._templates, path)
        users = [g for g in self._groups.values() if _template_of(g.body).endswith(path)]
        if users:
            raise ComputeError(400, f"The instance_template resource '{path}' is already being "
                               f"used by '{users[0].body['selfLink']}'", "resourceInUseByAnotherResource")
        del self._templates[path]
        return self._operation(a, "delete", path)

    # -- managed instance groups ---------------------------------------------------------------
    def _template_for(self, link: str) -> dict:
        found = next((t for p, t in self._templates.items() if link and link.endswith(p)), None)
        if found is None:
            raise ComputeError(400, f"Invalid value for field 'resource.instanceTemplate': "
                               f"'{link}'. The referenced instanceTemplate resource cannot "
                               "be found.", "invalid")
        return found

    def _check_policy(self, body: dict) -> None:
        policy = body.get("resourcePolicies", {}).get("workloadPolicy")
        if policy and not any(policy.endswith(p) for p in self._policies):
            raise ComputeError(400, f"Invalid value for field 'resource.resourcePolicies."
                               f"workloadPolicy': '{policy}'. The resource does not exist.")

    def _regionInstanceGroupManagers_insert(self, a, query, body, error):
        path = f"projects/{a['p']}/regions/{a['r']}/instanceGroupManagers/{body.get('name', '')}"
        self._check_new(self._groups, path, body)
        body = _with_template(copy.deepcopy(body))
        template = self._template_for(body.get("instanceTemplate", ""))
        model = template["properties"].get("scheduling", {}).get("provisioningModel", "STANDARD")
        if (body.get("targetSizePolicy", {}).get("mode") == "BULK"
                and model not in ("FLEX_START", "RESERVATION_BOUND")):
            raise bulk_refused(model)
        self._check_policy(body)
        if error is not None:
            return self._operation(a, "insert", path, error=error)
        group = self._groups[path] = _Group(self._resource(path, "compute#instanceGroupManager", {
            **body, "region": self._url(f"projects/{a['p']}/regions/{a['r']}"),
            "fingerprint": secrets.token_urlsafe(8)}))
        group.topology_error = self._topology_failures.pop(body.get("name", ""), None)
        self._name_instances(group)
        return self._operation(a, "insert", path, target_id=group.body["id"])

    def _regionInstanceGroupManagers_get(self, a, query, body, error):
        group = self._get(self._groups, self._path(a, "instanceGroupManagers"))
        self._observe_group(group)
        return self._group_view(group)

    def _regionInstanceGroupManagers_list(self, a, query, body, error):
        prefix = self._path(a, "instanceGroupManagers", named=False)
        for path, group in list(self._groups.items()):
            if path.startswith(prefix + "/"):
                self._observe_group(group)
        views = {p: self._group_view(g) for p, g in self._groups.items()}
        return self._list(views, prefix, "compute#regionInstanceGroupManagerList", query)

    def _regionInstanceGroupManagers_delete(self, a, query, body, error):
        path = self._path(a, "instanceGroupManagers")
        group = self._get(self._groups, path)
        for name in group.instances:
            self._instances.pop(name, None)
        del self._groups[path]
        return self._operation(a, "delete", path)

    def _regionInstanceGroupManagers_patch(self, a, query, body, error):
        """What the google provider's update sends: versions, policies, target size."""
        path = self._path(a, "instanceGroupManagers")
        group = self._get(self._groups, path)
        body = _with_template(copy.deepcopy(body))
        if "instanceTemplate" in body:
            self._template_for(body["instanceTemplate"])
        self._check_policy(body)
        wanted = body.get("resourcePolicies", {}).get("workloadPolicy")
        had = group.body.get("resourcePolicies", {}).get("workloadPolicy")
        if "resourcePolicies" in body and wanted != had and group.instances:
            raise ComputeError(400, "The workload policy of a managed instance group that has "
                               "instances cannot be changed: resize it to 0 first.")
        if error is not None:
            return self._operation(a, "patch", path, error=error)
        group.body.update(body)
        self._name_instances(group)
        return self._operation(a, "patch", path, target_id=group.body["id"])

    def _regionInstanceGroupManagers_resize(self, a, query, body, error):
        path = self._path(a, "instanceGroupManagers")
        group = self._get(self._groups, path)
        if error is not None:
            return self._operation(a, "resize", path, error=error)
        size = int(query["size"])
        for gone in group.instances[size:]:
            self._instances.pop(gone, None)
        del group.instances[size:]
        group.body["targetSize"] = size
        self._name_instances(group)
        return self._operation(a, "resize", path, target_id=group.body["id"])

    def _name_instances(self, group: _Group) -> None:
        """The names the MIG gives the VMs it is to make (BASE-xxxx), kept until it makes them."""
        wanted = int(group.body.get("targetSize", 0))
        base = group.body.get("baseInstanceName", group.body["name"])
        while len(group.names) < wanted:
            group.names.append(f"{base}-{secrets.token_hex(2)}")
        del group.names[wanted:]

    def _zone_of(self, group: _Group) -> str:
        return group.body.get("distributionPolicy", {}).get("zones", [{}])[0].get(
            "zone", "").rsplit("/", 1)[-1]

    def _instance_link(self, group: _Group, name: str) -> str:
        project = group.body["selfLink"].split("/projects/")[1].split("/")[0]
        return self._url(f"projects/{project}/zones/{self._zone_of(group)}/instances/{name}")

    def _regionInstanceGroupManagers_listManagedInstances(self, a, query, body, error):
        group = self._get(self._groups, self._path(a, "instanceGroupManagers"))
        self._observe_group(group)
        managed = []
        for path in group.instances:
            vm = self._instances.get(path)
            if vm is None:  # taken back and deleted: the MIG would make it again
                managed.append({"instance": self._url(path), "currentAction": "CREATING"})
                continue
            self._observe_instance(vm)
            managed.append({"instance": vm.body["selfLink"], "id": vm.body["id"],
                            "name": vm.body["name"], "instanceStatus": vm.body["status"],
                            "currentAction": "NONE" if vm.body["status"] == "RUNNING"
                            else "CREATING"})
        waiting = group.waiting
        for name in group.names[len(group.instances):]:
            entry = {"instance": self._instance_link(group, name), "currentAction": "CREATING"}
            if waiting is not None and not _bulk(group.body):
                entry["lastAttempt"] = {"errors": {"errors": waiting.operation_errors()}}
            managed.append(entry)
        return {"managedInstances": managed}

    def _observe_group(self, group: _Group) -> None:
        """One observation: a MIG makes the VMs it lacks once the region's quota and the zone's
        capacity allow (a bulk one all at once, an individual one each it can), and says why it
        waits (the bulk operation's last progress check; each instance's last attempt)."""
        wanted = int(group.body.get("targetSize", 0))
        status = group.body["status"]
        if len(group.instances) >= wanted:
            group.waiting = None
            running = [self._instances.get(p) for p in group.instances]
            if wanted and all(vm is not None and vm.body["status"] == "RUNNING"
                              for vm in running):
                group.active_polls += 1
            return
        zone = self._zone_of(group)
        needed = self._capacity.get(zone, self._capacity[None])
        reason = self._quota
        if reason is None and (needed is None or group.waits < needed):
            group.waits += 1
            reason = no_capacity(zone)
        bulk = _bulk(group.body)
        if reason is not None and bulk:
            status["bulkInstanceOperation"] = {
                "inProgress": True, "lastProgressCheck": {
                    "timestamp": _timestamp(self._now()),
                    "error": {"errors": reason.operation_errors()}}}
        group.waiting = reason
        if reason is None:
            self._make_vms(group, wanted)
        elif not bulk:
            self._make_vms(group, min(wanted, self._partial.get(zone, self._partial[None])))
        if bulk and reason is None:
            status["bulkInstanceOperation"] = {
                "inProgress": False, "lastProgressCheck": {"timestamp": _timestamp(self._now())}}

    def _make_vms(self, group: _Group, upto: int) -> None:
        template = self._template_for(_template_of(group.body))
        project = group.body["selfLink"].split("/projects/")[1].split("/")[0]
        while len(group.instances) < upto:
            name = group.names[len(group.instances)]
            vm = self._new_instance(project, self._zone_of(group), name, template["properties"],
                                    None)
            vm.body["metadata"] = copy.deepcopy(template["properties"].get("metadata", {}))
            vm.body["metadata"]["items"] = [*vm.body["metadata"].get("items", []), {
                "key": "created-by", "value": group.body["selfLink"].split("/compute/v1/")[1]}]
            group.instances.append(self._instance_path(vm))

    def _group_view(self, group: _Group) -> dict:
        view = copy.deepcopy(group.body)
        vms = [self._instances[p] for p in group.instances if p in self._instances]
        wanted = int(view.get("targetSize", 0))
        running = sum(vm.body["status"] == "RUNNING" for vm in vms)
        view["currentActions"] = {"none": running, "creating": wanted - running,
                                  "creatingWithoutRetries": 0, "deleting": 0, "recreating": 0}
        view["status"]["isStable"] = running == wanted
        policy = view.get("resourcePolicies", {}).get("workloadPolicy")
        if policy and group.instances:
            topology = next(p["workloadPolicy"]["acceleratorTopology"]
                            for path, p in self._policies.items() if policy.endswith(path))
            applied = {"acceleratorTopology": topology}
            if group.topology_error is not None:
                applied["state"] = "FAILED"
                applied["stateDetails"] = {
                    "timestamp": _timestamp(self._now()),
                    "error": {"errors": group.topology_error.operation_errors()}}
            elif running < wanted:
                applied["state"] = "INCOMPLETE"  # too few running VMs to activate it
            elif group.active_polls <= self._topology_polls:
                applied["state"] = "ACTIVATING"
            else:
                applied["state"] = "ACTIVE"
            view["status"]["appliedAcceleratorTopologies"] = [applied]
        return view

    # -- instances -----------------------------------------------------------------------------
    def _instances_get(self, a, query, body, error):
        path = f"projects/{a['p']}/zones/{a['z']}/instances/{a['n']}"
        vm = self._get(self._instances, path)
        self._observe_instance(vm)
        return copy.deepcopy(vm.body)

    def _instances_list(self, a, query, body, error):
        prefix = f"projects/{a['p']}/zones/{a['z']}/instances"
        for path, vm in self._instances.items():
            if path.startswith(prefix + "/"):
                self._observe_instance(vm)
        views = {p: vm.body for p, vm in self._instances.items()}
        return self._list(views, prefix, "compute#instanceList", query)

    def _instances_delete(self, a, query, body, error):
        path = f"projects/{a['p']}/zones/{a['z']}/instances/{a['n']}"
        self._get(self._instances, path)
        del self._instances[path]
        for group in self._groups.values():
            if path in group.instances:
                group.instances.remove(path)
        return self._operation(a, "delete", path, zonal=True)

    def _instances_getGuestAttributes(self, a, query, body, error):
        path = f"projects/{a['p']}/zones/{a['z']}/instances/{a['n']}"
        vm = self._get(self._instances, path)
        self._observe_instance(vm)
        query_path = query.get("queryPath", "")
        namespace, _, key = query_path.partition("/")
        published = (vm.running_since is not None and vm.body["status"] == "RUNNING"
                     and self._now() >= vm.running_since + self._host_key_delay_s)
        items = [{"namespace": ns, "key": k, "value": v} for (ns, k), v in sorted(vm.guest.items())
                 if published and ns == namespace and (not key or k == key)]
        if not items:
            raise not_found(f"{path}/guestAttributes/{query_path}")
        return {"kind": "compute#guestAttributes", "queryPath": query_path,
                "queryValue": {"items": items},
                "selfLink": vm.body["selfLink"] + f"/guestAttributes/{query_path}"}

    def _machineTypes_get(self, a, query, body, error):
        path = f"projects/{a['p']}/zones/{a['z']}/machineTypes/{a['n']}"
        if a["n"] not in self._machine_types.get(a["z"], self._machine_types[None]):
            raise not_found(path)
        return {"kind": "compute#machineType", "name": a["n"], "zone": a["z"],
                "selfLink": self._url(path), "isSharedCpu": False}

    def _new_instance(self, project: str, zone: str, name: str, properties: dict,
                      worker: Worker | None) -> _Instance:
        if worker is None:
            if not self._workers:
                raise ComputeError(500, "the fake has no workers for new VMs (set_workers)")
            worker = self._workers[self._next_worker % len(self._workers)]
            self._next_worker += 1
        path = f"projects/{project}/zones/{zone}/instances/{name}"
        body = self._resource(path, "compute#instance", {
            "name": name, "zone": self._url(f"projects/{project}/zones/{zone}"),
            "machineType": self._url(f"projects/{project}/zones/{zone}/machineTypes/"
                                     f"{properties.get('machineType', 'n1-standard-1')}"),
            "status": "PROVISIONING", "labels": dict(properties.get("labels", {})),
            "scheduling": copy.deepcopy(properties.get("scheduling", {})),
            "networkInterfaces": [{"name": "nic0", "networkIP": worker.ip, "accessConfigs": [
                {"name": "external", "type": "ONE_TO_ONE_NAT",
                 "natIP": worker.external_ip or worker.ip}]}]})
        vm = self._instances[path] = _Instance(body, worker, _guest(worker))
        if self._boot_polls <= 0:
            self._boot(vm)
        return vm

    def _observe_instance(self, vm: _Instance) -> None:
        if vm.body["status"] in ("RUNNING", "TERMINATED", "STOPPED"):
            return
        vm.polls += 1
        step = min(len(_RUN_STATES) - 1, vm.polls * (len(_RUN_STATES) - 1) // max(
            1, self._boot_polls))
        vm.body["status"] = _RUN_STATES[step]
        if vm.body["status"] == "RUNNING":
            self._boot(vm)

    def _boot(self, vm: _Instance) -> None:
        vm.body["status"] = "RUNNING"
        vm.running_since = self._now()

    # -- plumbing ------------------------------------------------------------------------------
    def _insert(self, table: dict, a: dict, collection: str, kind: str, body: dict,
                error: ComputeError | None, extra: dict | None = None) -> dict:
        path = f"projects/{a['p']}/regions/{a['r']}/{collection}/{body.get('name', '')}"
        self._check_new(table, path, body)
        if error is not None:
            return self._operation(a, "insert", path, error=error)
        table[path] = self._resource(path, kind, {
            **copy.deepcopy(body), "region": self._url(f"projects/{a['p']}/regions/{a['r']}"),
            **(extra or {})})
        return self._operation(a, "insert", path, target_id=table[path]["id"])

    @staticmethod
    def _check_new(table: dict, path: str, body: dict) -> None:
        name = body.get("name", "")
        if not _NAME.fullmatch(name):
            raise ComputeError(400, f"Invalid value for field 'resource.name': '{name}'. Must "
                               f"be a match of regex '{_NAME.pattern}'")
        if path in table:
            raise already_exists(path)

    def _resource(self, path: str, kind: str, body: dict) -> dict:
        self._next_id += 1
        status = {"status": {}} if kind == "compute#instanceGroupManager" else {}
        return {**status, **body, "kind": kind, "id": str(self._next_id),
                "creationTimestamp": _timestamp(self._now()), "selfLink": self._url(path)}

    def _operation(self, a: dict, verb: str, target: str, *, target_id: str | None = None,
                   error: ComputeError | None = None, zonal: bool = False) -> dict:
        """A new operation, PENDING as the call answers (DONE at once with op_polls 0); the
        change it stands for is already made (or, with an error, never will be)."""
        self._next_id += 1
        name = f"operation-{int(self._now() * 1000)}-{secrets.token_hex(6)}"
        where = (f"projects/{a['p']}/zones/{a['z']}" if zonal
                 else f"projects/{a['p']}/regions/{a['r']}" if "r" in a
                 else f"projects/{a['p']}/global")
        op = {"kind": "compute#operation", "id": str(self._next_id), "name": name,
              "operationType": verb, "targetLink": self._url(target), "status": "PENDING",
              "progress": 0, "insertTime": _timestamp(self._now()), "selfLink": self._url(
                  f"{where}/operations/{name}")}
        if "/global" not in where:
            op["zone" if zonal else "region"] = self._url(where)
        if target_id is not None:
            op["targetId"] = target_id
        self._ops[f"{where}/operations/{name}"] = _Operation(op, error)
        return self._read_operation(self._ops[f"{where}/operations/{name}"], advance=False)

    def _read_operation(self, held: _Operation, *, advance: bool = True) -> dict:
        """The operation as read now: each read moves it on, PENDING, RUNNING, then DONE."""
        if advance:
            held.reads += 1
        op = held.body
        if op["status"] != "DONE":
            if held.reads >= self._op_polls:
                op.update(status="DONE", progress=100, endTime=_timestamp(self._now()))
                if held.error is not None:
                    op.update(error={"errors": held.error.operation_errors()},
                              httpErrorStatusCode=held.error.http_code,
                              httpErrorMessage=HTTPStatus(held.error.http_code).phrase.upper())
            elif held.reads > 0:
                op.update(status="RUNNING", startTime=op.get("startTime")
                          or _timestamp(self._now()))
        return copy.deepcopy(op)

    def _regionOperations_get(self, a, query, body, error):
        return self._read_operation(self._get(
            self._ops, f"projects/{a['p']}/regions/{a['r']}/operations/{a['n']}"))

    def _globalOperations_get(self, a, query, body, error):
        return self._read_operation(self._get(
            self._ops, f"projects/{a['p']}/global/operations/{a['n']}"))

    def _zoneOperations_get(self, a, query, body, error):
        return self._read_operation(self._get(
            self._ops, f"projects/{a['p']}/zones/{a['z']}/operations/{a['n']}"))

    def _list(self, table: dict, prefix: str, kind: str, query: dict) -> dict:
        items = [copy.deepcopy(b) for p, b in sorted(table.items()) if p.startswith(prefix + "/")
                 and p.count("/") == prefix.count("/") + 1]
        wanted = query.get("filter", "")
        match = re.fullmatch(r"\(?name\s*=\s*\"?([^\")]+)\"?\)?", wanted.strip())
        if match:
            items = [i for i in items if i["name"] == match.group(1)]
        start = int(query.get("pageToken") or 0)
        size = int(query.get("maxResults") or 500)
        page = {"kind": kind, "items": items[start:start + size], "selfLink": self._url(prefix)}
        if start + size < len(items):
            page["nextPageToken"] = str(start + size)
        return page

    def _path(self, a: dict, collection: str, named: bool = True) -> str:
        path = f"projects/{a['p']}/regions/{a['r']}/{collection}"
        return f"{path}/{a['n']}" if named else path

    @staticmethod
    def _get(table: dict, path: str):
        if path not in table:
            raise not_found(path)
        return table[path]

    def _injected(self, rpc: str) -> ComputeError | None:
        for failure in self._failures:
            if failure[0] == rpc and failure[2] != 0:
                if failure[2] is not None:
                    failure[2] -= 1
                return failure[1]
        return None

    def _find(self, name: str) -> str:
        matches = [p for p in self._instances if p.rsplit("/", 1)[1] == name]
        if len(matches) != 1:
            raise KeyError(f"{name!r} names {len(matches)} instances")
        return matches[0]

    def _instance_path(self, vm: _Instance) -> str:
        return vm.body["selfLink"].split(PREFIX, 1)[1]

    def _url(self, path: str) -> str:
        return f"https://www.googleapis.com{PREFIX}{path}"

    def clients(self):
        """The launcher's compute_v1 clients (launcher.providers.gce_api), aimed here."""
        from launcher.providers import gce_api

        return gce_api.clients(self.endpoint)

