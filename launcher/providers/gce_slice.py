"""What `tpuctl up` asks Compute Engine for on provider gce, as data: the request bodies, pure.

    mode = provisioning(config.cluster)   # the model, the MIG's mode, what ends a VM, the wait
    variables = terraform_variables(config, user="me", public_key="ssh-ed25519 AAAA...")
    requests = slice_requests(config, user="me", public_key="ssh-ed25519 AAAA... tpuctl")
    requests.firewalls     # firewalls.insert bodies: tcp/22 from ssh_source_ranges; internal
    requests.policies      # resourcePolicies.insert bodies, one per slice: HIGH_THROUGHPUT
    requests.template      # regionInstanceTemplates.insert body: machine type, boot disk, ...
    requests.groups        # regionInstanceGroupManagers.insert bodies, one per slice

`terraform_variables` is what infra/modules/tpu_slice (which `up` applies) is given;
`slice_requests` is what Compute Engine then holds, as its REST bodies: what `up --dry-run`
shows and what `up` compares a slice made earlier with. A slice on Compute Engine is a regional
managed instance group (MIG) of TPU VMs made from a regional instance template, in one zone
(`distributionPolicy.targetShape = ANY_SINGLE_ZONE`), placed by a workload policy (its
accelerator topology; multi-host only) that the MIG names, and `defaultActionOnFailure =
DO_NOTHING` keeps a failed VM for inspection instead of recreating it. How the MIG makes its VMs
follows from the provisioning model, decided in one place (`provisioning`). The template's name
is Terraform's (`name_prefix` RUN-, so that a changed template is made before the old one goes,
while the MIG still uses it), so the bodies here carry no template name. Field names and enums
are those of google-cloud-compute 1.57 (compute_v1 ResourcePolicy, InstanceTemplate,
InstanceGroupManager, Scheduling; the REST discovery document's camelCase). Neither a resource
policy nor a MIG carries labels: tpuctl knows its own by the ids it recorded when it made them
(launcher.providers.gce_owned); the VMs carry the run's label.

Several slices (cluster.slices: N) are N MIGs, RUN-0 .. RUN-(N-1) as on gcp, each with its own
workload policy (GROUP-topology): Compute Engine documents no field that joins MIGs into one
multislice, so each MIG is one slice's ICI domain and the slices meet over the data-center
network. They share the firewall rules (one network tag: every VM of every slice reaches every
other) and the template (the same machine type, image and scheduling).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.providers import multislice
from payload.cloud import accelerators

if TYPE_CHECKING:
    from payload.config import GceCluster, RunConfig

RUN_LABEL = "tpuctl-run"  # the same label as on gcp (launcher.providers.gcp_owned.RUN_LABEL)
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Scheduling.ProvisioningModel by cluster.provisioning; a reservation makes on-demand capacity
# RESERVATION_BOUND (Compute Engine's provisioning models).
PROVISIONING_MODEL = {"on_demand": "STANDARD", "spot": "SPOT", "flex_start": "FLEX_START"}
# InstanceGroupManagerTargetSizePolicy.Mode.
BULK, INDIVIDUAL = "BULK", "INDIVIDUAL"
# "Bulk mode in MIGs is only supported with instance templates that specify either a
# reservation-bound or flex-start provisioning model" (Compute Engine, "Create a MIG that uses
# the bulk mode"); resize requests take the same two models only. STANDARD and SPOT TPU VMs go in
# the default individual mode, with the workload policy placing them in the slice's topology.
BULK_MODELS = ("FLEX_START", "RESERVATION_BOUND")
# How long `up` waits for every VM when cluster.queue_hours is left out. A bulk MIG makes no VM
# until it can make them all, so nothing bills while it waits: as long as gcp's queued requests
# (its queue_hours default). An individual MIG makes each VM as capacity allows, and those bill
# while the others wait: half an hour, as gcp waits for a TPU to be READY.
BULK_WAIT_HOURS = 24.0
INDIVIDUAL_WAIT_HOURS = 0.5


@dataclass(frozen=True, kw_only=True)
class Provisioning:
    """How Compute Engine is asked for the slice's VMs, and how long `up` waits for them."""

    model: str  # Scheduling.provisioningModel
    mode: str  # the MIG's targetSizePolicy.mode: BULK or INDIVIDUAL
    termination: str | None  # scheduling.instanceTerminationAction (DELETE), or none
    wait_s: float  # how long `up` waits for every VM (cluster.queue_hours, or by mode)

    @property
    def partial_bills(self) -> bool:
        """Whether VMs made while the others wait bill (individual mode)."""
        return self.mode == INDIVIDUAL

    def describe(self, hosts: int) -> str:
        """The dry run's line: the model, the MIG's mode and what waiting costs."""
        vms = f"{hosts} VM{'s' if hosts > 1 else ''}"
        wait = f"{self.wait_s / 3600:g} h"
        if self.mode == BULK:
            what = f"all {vms} at once or none" if hosts > 1 else "its VM once it can"
            return (f"provisioning {self.model}: the MIG in bulk mode makes {what}, and nothing "
                    f"bills while it waits for capacity (up to {wait}, cluster.queue_hours)")
        return (f"provisioning {self.model}: the MIG in individual mode (Compute Engine takes "
                "bulk mode only with flex-start or reservation-bound templates) makes each of "
                f"its {vms} as capacity allows, and those bill while the others wait; `up` "
                f"waits up to {wait} (cluster.queue_hours) for all of them, then removes the "
                "slice")


def provisioning(cluster: GceCluster) -> Provisioning:
    """The one place that decides how the slice's VMs are provisioned, per model: bulk mode for
    flex-start and reservation-bound (the only models Compute Engine takes it with), individual
    mode for on-demand and spot. Every VM that Compute Engine may take back or end is deleted,
    never stopped: a spot or flex-start VM cannot be restarted, a stopped one keeps its disk
    billing, and reservation-bound templates want DELETE ("Create a MIG that uses the bulk mode":
    "On VM termination ... Delete")."""
    model = "RESERVATION_BOUND" if cluster.reservation else PROVISIONING_MODEL[
        cluster.provisioning]
    mode = BULK if model in BULK_MODELS else INDIVIDUAL
    ended = model != "STANDARD" or cluster.max_run_seconds is not None
    hours = cluster.queue_hours or (BULK_WAIT_HOURS if mode == BULK else INDIVIDUAL_WAIT_HOURS)
    return Provisioning(model=model, mode=mode, termination="DELETE" if ended else None,
                        wait_s=hours * 3600)


@dataclass(frozen=True, kw_only=True)
class SliceNames:
    """The names of what `up` makes for a run (all in the cluster's region)."""

    # One MIG per slice: the run's name for one, RUN-0 .. RUN-(N-1) for several (as gcp names
    # its nodes); its VMs are named GROUP-xxxx by Compute Engine.
    groups: tuple[str, ...]
    policies: tuple[str, ...]  # each MIG's own workload policy, GROUP-topology
    template_prefix: str  # the template's name is this and a suffix Terraform's provider makes
    ssh_rule: str  # firewall: tcp/22 from cluster.ssh_source_ranges to the VMs
    internal_rule: str  # firewall: the slice's VMs reach each other (JAX's coordinator)
    tag: str  # the network tag both rules target

    @classmethod
    def of(cls, run_name: str, slices: int = 1) -> SliceNames:
        # Compute Engine names: a letter first, 63 characters at most. The run's name is used
        # whole (cut, it could end in a dash, or name two runs alike): the config keeps it
        # within payload.config.gce_name_problems, which leaves room for the longest suffix.
        groups = multislice.slice_names(run_name, slices)
        return cls(groups=groups, policies=tuple(f"{group}-topology" for group in groups),
                   template_prefix=f"{run_name}-", ssh_rule=f"{run_name}-ssh",
                   internal_rule=f"{run_name}-internal", tag=f"tpuctl-{run_name}")

    def owned(self, *, policy: bool = True) -> list[tuple[str, str]]:
        """(kind, name) of everything `up` makes under a name known before it does, in the
        order it makes them (the rules, every slice's policy, every slice's MIG); `policy`:
        whether a slice has a workload policy (a one-VM slice has none). The template's name is
        only known once made (`is_template`)."""
        return [("firewalls", self.ssh_rule), ("firewalls", self.internal_rule),
                *([("policies", p) for p in self.policies] if policy else []),
                *[("groups", g) for g in self.groups]]

    def is_template(self, name: str) -> bool:
        """Whether `name` is one the google provider makes from the run's `name_prefix`: the
        prefix and a unique id of hexadecimal digits (26 of them; 9 after a prefix longer than
        37 characters), so that another run's prefix (RUN-2-) never matches."""
        suffix = 9 if len(self.template_prefix) > 37 else 26
        return re.fullmatch(re.escape(self.template_prefix) + f"[0-9a-f]{{{suffix}}}",
                            name) is not None


@dataclass(frozen=True, kw_only=True)
class SliceRequests:
    names: SliceNames
    region: str
    provisioning: Provisioning
    firewalls: tuple[dict, ...]
    policies: tuple[dict, ...]  # one per slice; none for one-VM slices: no placement needed
    template: dict  # no name: Terraform's provider gives it one from names.template_prefix
    groups: tuple[dict, ...]  # one per slice; their instanceTemplate is the one Terraform made

    def in_order(self) -> list[tuple[str, dict]]:
        """(kind, body) of what `up` inserts, in order (firewalls, policies, template, MIGs)."""
        return [*(("firewalls", rule) for rule in self.firewalls),
                *(("policies", policy) for policy in self.policies),
                ("templates", self.template), *(("groups", group) for group in self.groups)]


def region_of(config: RunConfig) -> str:
    return accelerators.region_of(config.cluster.zone)


def scheduling(cluster: GceCluster) -> dict:
    """The template's scheduling: the provisioning model, a run limit, what ends a VM."""
    chosen = provisioning(cluster)
    sent: dict = {"provisioningModel": chosen.model, "onHostMaintenance": "TERMINATE",
                  "automaticRestart": False}
    if chosen.termination:
        sent["instanceTerminationAction"] = chosen.termination
    if cluster.max_run_seconds is not None:
        sent["maxRunDuration"] = {"seconds": str(cluster.max_run_seconds)}
    return sent


def reservation_affinity(cluster) -> dict:
    if not cluster.reservation:
        return {"consumeReservationType": "NO_RESERVATION"}
    return {"consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name", "values": [cluster.reservation]}


def boot_disk(cluster: GceCluster) -> dict:
    """The boot disk: the image (Google's TPU OS image of the generation unless cluster.image),
    the generation's disk type and size (payload.cloud.accelerators.COMPUTE_BOOT)."""
    boot = accelerators.COMPUTE_BOOT[cluster.slice.generation]
    return {"boot": True, "autoDelete": True, "initializeParams": {
        "sourceImage": cluster.boot_image, "diskType": boot.disk_type,
        "diskSizeGb": str(accelerators.BOOT_DISK_GB)}}


def firewall_rules(config: RunConfig, names: SliceNames, network: str) -> tuple[dict, ...]:
    """SSH from the user's ranges only, and every protocol between the slice's own VMs (a
    custom VPC has no default-allow-internal rule), both to the run's network tag."""
    description = f"tpuctl run {config.name}"
    ssh = {"name": names.ssh_rule, "network": network, "direction": "INGRESS",
           "description": description, "targetTags": [names.tag],
           "sourceRanges": list(config.cluster.ssh_source_ranges or []),
           "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}]}
    internal = {"name": names.internal_rule, "network": network, "direction": "INGRESS",
                "description": description, "targetTags": [names.tag],
                "sourceTags": [names.tag],
                "allowed": [{"IPProtocol": p} for p in ("tcp", "udp", "icmp")]}
    return (ssh, internal)


def slice_requests(config: RunConfig, *, user: str, public_key: str,
                   service_account: str | None = None) -> SliceRequests:
    """The insert bodies for the config's slices (no call is made)."""
    cluster = config.cluster
    acc = cluster.slice
    names = SliceNames.of(config.name, cluster.slices)
    region = region_of(config)
    project = cluster.project
    chosen = provisioning(cluster)
    policies = tuple({"name": name, "region": region,
                      "description": f"tpuctl run {config.name}: the slice's ICI topology",
                      "workloadPolicy": {"type": "HIGH_THROUGHPUT",
                                         "acceleratorTopology": cluster.topology,
                                         "acceleratorTopologyMode": "AUTO_CONNECT"}}
                     for name in names.policies) if acc.is_multi_host else ()
    network_path = (cluster.network if cluster.network.startswith("projects/")
                    else f"projects/{project}/global/networks/{cluster.network}")
    network = {"network": network_path,
               # An external address: the launcher reaches the workers over SSH from outside.
               "accessConfigs": [{"name": "external", "type": "ONE_TO_ONE_NAT"}]}
    if cluster.subnetwork:
        network["subnetwork"] = (cluster.subnetwork if cluster.subnetwork.startswith("projects/")
                                 else f"projects/{project}/regions/{region}/subnetworks/"
                                      f"{cluster.subnetwork}")
    properties = {
        "machineType": cluster.machine_type,
        "labels": {RUN_LABEL: config.name},
        "disks": [boot_disk(cluster)],
        "networkInterfaces": [network],
        "metadata": {"items": [
            # The guest agent publishes the VM's host keys as guest attributes only with this:
            # tpuctl's known_hosts is written from them (strict SSH from the first connection).
            {"key": "enable-guest-attributes", "value": "TRUE"},
            {"key": "ssh-keys", "value": f"{user}:{public_key.strip()}"},
            {"key": "block-project-ssh-keys", "value": "TRUE"},
        ]},
        "scheduling": scheduling(cluster),
        "reservationAffinity": reservation_affinity(cluster),
        # The API attaches no account unless asked ("default": the project's default compute
        # service account); the scope lets any API through, the account's IAM grants decide.
        "serviceAccounts": [{"email": service_account or "default", "scopes": [SCOPE]}],
        "tags": {"items": [names.tag]},
    }
    # The workload policy goes on the MIG only: Compute Engine applies it to a MIG's VMs
    # ("About workload policies in MIGs"; its A4X MIG page: a template that names a placement
    # policy cannot make a MIG with a workload policy).
    template = {"region": region, "description": f"tpuctl run {config.name}",
                "properties": properties}
    groups = tuple(_group(config, name, mode=chosen.mode, region=region,
                          policy=names.policies[i] if policies else None)
                   for i, name in enumerate(names.groups))
    return SliceRequests(names=names, region=region, provisioning=chosen,
                         firewalls=firewall_rules(config, names, network_path), policies=policies,
                         template=template, groups=groups)


def _group(config: RunConfig, name: str, *, policy: str | None, mode: str, region: str) -> dict:
    """One slice's MIG: its VMs in one zone, placed by its own workload policy (multi-host)."""
    cluster = config.cluster
    group = {
        "name": name, "region": region, "baseInstanceName": name,
        "description": f"tpuctl run {config.name}",
        "targetSize": cluster.slice.hosts,
        "targetSizePolicy": {"mode": mode},
        "distributionPolicy": {"targetShape": "ANY_SINGLE_ZONE",
                               "zones": [{"zone": f"zones/{cluster.zone}"}]},
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
        "updatePolicy": {"type": "OPPORTUNISTIC", "instanceRedistributionType": "NONE"},
    }
    if policy is not None:
        group["resourcePolicies"] = {"workloadPolicy": f"projects/{cluster.project}/regions/"
                                                       f"{region}/resourcePolicies/{policy}"}
    return group


def terraform_variables(config: RunConfig, *, user: str, public_key: str,
                        service_account: str | None = None) -> dict:
    """infra/modules/tpu_slice's variables for the config's slices: the one place that maps the
    run config to them (the module's variables.tf has exactly these). Every slice is in the
    one module's state: a MIG and a workload policy per name in names.groups and
    names.policies (count), one template and the rules for all of them."""
    cluster = config.cluster
    names = SliceNames.of(config.name, cluster.slices)
    chosen = provisioning(cluster)
    disk = boot_disk(cluster)["initializeParams"]
    return {
        "project": cluster.project, "region": region_of(config), "zone": cluster.zone,
        "run_name": config.name,
        "names": {"groups": list(names.groups), "template_prefix": names.template_prefix,
                  "policies": list(names.policies), "ssh_rule": names.ssh_rule,
                  "internal_rule": names.internal_rule, "tag": names.tag},
        "machine_type": cluster.machine_type, "topology": cluster.topology,
        "hosts": cluster.slice.hosts, "image": disk["sourceImage"],
        "boot_disk_type": disk["diskType"], "boot_disk_gb": int(disk["diskSizeGb"]),
        "provisioning_model": chosen.model, "size_mode": chosen.mode,
        "termination_action": chosen.termination,
        "max_run_seconds": cluster.max_run_seconds,
        "reservation": cluster.reservation, "network": cluster.network,
        "subnetwork": cluster.subnetwork,
        "ssh_source_ranges": list(cluster.ssh_source_ranges or []), "ssh_user": user,
        "ssh_public_key": public_key.strip(), "service_account": service_account or "default",
    }
