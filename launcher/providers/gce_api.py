"""What the gce provider asks Compute Engine, through google-cloud-compute, as plain values.

    api = ComputeApi(project="my-project", region="us-east5")
    group = api.group("trillium")                  # Group(...) or None
    vms = api.managed_instances("trillium")        # [Vm(...)], in the MIG's order
    api.host_keys(vm)                              # {"ssh-ed25519": "AAAA..."}, {} until published

TPUCTL_COMPUTE_API_ENDPOINT points the clients at a stand-in with anonymous credentials (the
tests' testbed/fakes/compute.py), as TPUCTL_TPU_API_ENDPOINT does for the TPU API; otherwise
Application Default Credentials. google-cloud-compute is imported on first use.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime

from payload.cloud import google_errors, stand_ins
from payload.cloud.google_errors import CREDENTIALS_HINT, GoogleApi
from payload.core.errors import UserError

ENDPOINT_ENV = stand_ins.COMPUTE_API_ENV


@dataclass(frozen=True)
class Clients:
    firewalls: object  # global
    policies: object
    templates: object
    groups: object
    instances: object
    machine_types: object


def stand_in() -> str | None:
    return stand_ins.endpoint(ENDPOINT_ENV)


def clients(endpoint: str | None = None) -> Clients:
    """The compute_v1 clients: REST against `endpoint` (or the stand-in) with anonymous
    credentials, or Google with Application Default Credentials."""
    try:
        from google.api_core.client_options import ClientOptions
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import compute_v1
    except ImportError:
        raise UserError("the gce provider needs google-cloud-compute",
                        hint="pip install 'tpuctl[launcher]'") from None
    endpoint = endpoint or stand_in()
    if endpoint:
        from google.auth.credentials import AnonymousCredentials

        options = {"credentials": AnonymousCredentials(), "transport": "rest",
                   "client_options": ClientOptions(api_endpoint=endpoint)}
    else:
        try:
            import google.auth

            credentials, _ = google.auth.default(
                scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except DefaultCredentialsError:
            raise UserError("no Google Cloud credentials", hint=CREDENTIALS_HINT) from None
        options = {"credentials": credentials}
    made = Clients(firewalls=compute_v1.FirewallsClient(**options),
                   policies=compute_v1.ResourcePoliciesClient(**options),
                   templates=compute_v1.RegionInstanceTemplatesClient(**options),
                   groups=compute_v1.RegionInstanceGroupManagersClient(**options),
                   instances=compute_v1.InstancesClient(**options),
                   machine_types=compute_v1.MachineTypesClient(**options))
    if endpoint:
        _poll_at_the_stand_in(made, options)
    return made


def _poll_at_the_stand_in(made: Clients, options: dict) -> None:
    """google-cloud-compute 1.57 follows an operation with an operations client it builds
    itself, from the credentials alone (transports/base.py, `_region_operations_client` and
    its global and zonal kin): it would poll Google, not the stand-in, for any operation not
    DONE when the call answers. Hand each client the operations clients of the stand-in."""
    from google.cloud import compute_v1

    polling = {"region_operations": compute_v1.RegionOperationsClient(**options),
               "global_operations": compute_v1.GlobalOperationsClient(**options),
               "zone_operations": compute_v1.ZoneOperationsClient(**options)}
    for client in (made.firewalls, made.policies, made.templates, made.groups, made.instances):
        client._transport._extended_operations_services.update(polling)


@dataclass(frozen=True)
class Group:
    """A regional MIG as `status` and `up` read it."""

    name: str
    uid: str
    target_size: int
    template: str  # the instance template's resource path
    policy: str | None  # the workload policy's resource path
    bulk_in_progress: bool
    last_error: str | None  # the bulk operation's last progress check, when it failed
    is_stable: bool
    creating: int
    topology_state: str | None  # appliedAcceleratorTopologies[0].state
    created: float | None
    mode: str = "INDIVIDUAL"  # targetSizePolicy.mode (unset: the API's default, individual)
    topology_error: str | None = None  # appliedAcceleratorTopologies[0].stateDetails.error


@dataclass(frozen=True)
class Vm:
    name: str
    uid: str
    zone: str
    status: str  # PROVISIONING, STAGING, RUNNING, STOPPING, TERMINATED, ...
    internal_ip: str
    external_ip: str | None
    labels: dict
    created: float | None
    # scheduling.maxRunDuration's end, as Compute Engine counts it from the VM's creation
    max_run_s: float | None = None

    @property
    def ssh_address(self) -> str:
        return self.external_ip or self.internal_ip


def _seconds(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _path_of(link: str) -> str:
    return link.split("/compute/v1/", 1)[-1]


def _first_error(error) -> str | None:
    """`CODE: message` of the first entry of a compute#error (an operation's, a progress
    check's, an instance's last attempt), or None."""
    if not error or not error.errors:
        return None
    first = error.errors[0]
    return f"{first.code}: {' '.join(first.message.split())}"


def _vm(raw) -> Vm:
    nic = raw.network_interfaces[0] if raw.network_interfaces else None
    external = (nic.access_configs[0].nat_i_p or None) if nic and nic.access_configs else None
    scheduling = raw.scheduling
    max_run = (float(scheduling.max_run_duration.seconds)
               if scheduling and scheduling.max_run_duration
               and scheduling.max_run_duration.seconds else None)
    return Vm(name=raw.name, uid=str(raw.id), zone=raw.zone.rsplit("/", 1)[-1],
              status=raw.status, internal_ip=nic.network_i_p if nic else "",
              external_ip=external, labels=dict(raw.labels),
              created=_seconds(raw.creation_timestamp), max_run_s=max_run)


def _group(raw) -> Group:
    status = raw.status
    bulk = status.bulk_instance_operation if status else None
    check = bulk.last_progress_check if bulk else None
    applied = list(status.applied_accelerator_topologies) if status else []
    details = applied[0].state_details if applied else None
    # The google provider sends the template as the group's one version; the API shows it as
    # instanceTemplate too.
    template = raw.versions[0].instance_template if raw.versions else raw.instance_template
    return Group(
        name=raw.name, uid=str(raw.id), target_size=int(raw.target_size),
        template=_path_of(template),
        policy=(_path_of(raw.resource_policies.workload_policy)
                if raw.resource_policies and raw.resource_policies.workload_policy else None),
        bulk_in_progress=bool(bulk and bulk.in_progress),
        last_error=_first_error(check.error if check else None),
        is_stable=bool(status and status.is_stable),
        creating=int(raw.current_actions.creating) if raw.current_actions else 0,
        topology_state=applied[0].state if applied else None,
        created=_seconds(raw.creation_timestamp),
        mode=(raw.target_size_policy.mode if raw.target_size_policy
              and raw.target_size_policy.mode else "INDIVIDUAL"),
        topology_error=_first_error(details.error if details else None))


# kind -> the name argument of its get and delete; firewalls are global, the rest regional.
# (Terraform makes them: infra/modules/tpu_slice.)
_NAME_ARGUMENT = {"firewalls": "firewall", "policies": "resource_policy",
                  "templates": "instance_template", "groups": "instance_group_manager"}


class ComputeApi:
    """Compute Engine for one project and region (a zone by argument where it matters)."""

    def __init__(self, *, project: str, region: str):
        self.project, self.region = project, region
        self._clients: Clients | None = None

    @property
    def clients(self) -> Clients:
        if self._clients is None:
            self._clients = clients()
        return self._clients

    def _client(self, kind: str):
        return getattr(self.clients, kind)

    # -- the three regional resources of a slice -------------------------------------------
    def _where(self, kind: str) -> dict:
        return ({"project": self.project} if kind == "firewalls"
                else {"project": self.project, "region": self.region})

    def get(self, kind: str, name: str):
        """The raw resource of that name, or None."""
        from google.api_core import exceptions as gexc

        with api_errors(self.project, f"reading {name}"):
            try:
                return self._client(kind).get(**self._where(kind), **{_NAME_ARGUMENT[kind]: name})
            except gexc.NotFound:
                return None

    def delete(self, kind: str, name: str) -> bool:
        """Delete it and wait; False when it was not there."""
        from google.api_core import exceptions as gexc

        with api_errors(self.project, f"deleting {name}"):
            try:
                self._client(kind).delete(**self._where(kind),
                                          **{_NAME_ARGUMENT[kind]: name}).result()
            except gexc.NotFound:
                return False
        return True

    def group(self, name: str) -> Group | None:
        raw = self.get("groups", name)
        return None if raw is None else _group(raw)

    def managed_instances(self, group: str) -> list[Vm]:
        """The MIG's VMs, each read with instances.get, in a stable order (by name)."""
        return self.managed(group)[0]

    def managed(self, group: str) -> tuple[list[Vm], str | None]:
        """The MIG's VMs that exist (as managed_instances), and why it has not made the others
        yet: the first of its instances' last creation attempt errors (an individual MIG says
        quota and capacity there; a bulk one in its progress check, Group.last_error)."""
        with api_errors(self.project, f"listing the VMs of {group}"):
            managed = list(self.clients.groups.list_managed_instances(
                project=self.project, region=self.region, instance_group_manager=group))
        waiting = next((error for m in managed if (error := _first_error(
            m.last_attempt.errors if m.last_attempt else None))), None)
        found = [self.instance_at(m.instance) for m in managed]
        return sorted((vm for vm in found if vm is not None), key=lambda vm: vm.name), waiting

    def names(self, kind: str, matching) -> list[str]:
        """The names of every resource of that kind (in the region) for which `matching(name)`."""
        with api_errors(self.project, f"listing {kind}"):
            return [r.name for r in self._client(kind).list(**self._where(kind))
                    if matching(r.name)]

    def instance_at(self, link: str) -> Vm | None:
        parts = _path_of(link).split("/")  # projects/P/zones/Z/instances/N
        return self.instance(parts[3], parts[5])

    def instance(self, zone: str, name: str) -> Vm | None:
        from google.api_core import exceptions as gexc

        with api_errors(self.project, f"reading VM {name}"):
            try:
                return _vm(self.clients.instances.get(project=self.project, zone=zone,
                                                      instance=name))
            except gexc.NotFound:
                return None

    def machine_type_offered(self, zone: str, name: str) -> bool:
        """Whether the zone offers the machine type to this project (machineTypes.get)."""
        from google.api_core import exceptions as gexc

        with api_errors(self.project, f"looking up {name} in {zone}"):
            try:
                self.clients.machine_types.get(project=self.project, zone=zone,
                                               machine_type=name)
            except gexc.NotFound:
                return False
        return True

    def host_keys(self, vm: Vm) -> dict[str, str]:
        """The host keys the VM's guest agent published (hostkeys/<type>); {} before that."""
        from google.api_core import exceptions as gexc

        with api_errors(self.project, f"reading the host keys of {vm.name}"):
            try:
                from google.cloud import compute_v1

                found = self.clients.instances.get_guest_attributes(
                    request=compute_v1.GetGuestAttributesInstanceRequest(
                        project=self.project, zone=vm.zone, instance=vm.name,
                        query_path="hostkeys/"))
            except gexc.NotFound:
                return {}
        return {item.key: item.value for item in found.query_value.items
                if item.namespace == "hostkeys"}


def _is_quota(exc: Exception, message: str) -> bool:
    return "QUOTA_EXCEEDED" in message or "Quota '" in message


API = GoogleApi(title="Compute Engine API", service="compute.googleapis.com",
                speaker="Compute Engine",
                permission_hint="check that your account may manage Compute Engine in "
                                "{project} (roles/compute.instanceAdmin.v1)",
                quota_hint="ask for more TPU quota in that region (IAM & Admin > Quotas), "
                           "or a smaller topology",
                is_quota=_is_quota,
                disabled_markers=("has not been used in project", "is disabled"))


def api_errors(project: str, what: str) -> contextlib.AbstractContextManager[None]:
    """Compute Engine's errors as one line with its own reason and what to do."""
    return google_errors.api_errors(project, what, API)
