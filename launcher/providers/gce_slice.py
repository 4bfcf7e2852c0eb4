"""What `tpuctl up` asks Compute Engine for on provider gce, as data: the request bodies, pure.

    variables = terraform_variables(config, user="me", public_key="ssh-ed25519 AAAA...")
    requests = slice_requests(config, user="me", public_key="ssh-ed25519 AAAA... tpuctl")
    requests.firewalls     # firewalls.insert bodies: tcp/22 from ssh_source_ranges; internal
    requests.policy        # resourcePolicies.insert body: HIGH_THROUGHPUT, acceleratorTopology
    requests.template      # regionInstanceTemplates.insert body: machine type, image, scheduling
    requests.group         # regionInstanceGroupManagers.insert body: bulk mode, one zone

`terraform_variables` is what infra/modules/tpu_slice (which `up` applies) is given;
`slice_requests` is what Compute Engine then holds, as its REST bodies: what `up --dry-run`
shows and what `up` compares a slice made earlier with. A slice on Compute Engine is a regional
managed instance group (MIG) of TPU VMs made from a
regional instance template and placed by a workload policy (its accelerator topology). The MIG
runs in bulk mode: `targetSizePolicy.mode = BULK` creates every VM at once or none,
`distributionPolicy.targetShape = ANY_SINGLE_ZONE` keeps them in one zone, and
`defaultActionOnFailure = DO_NOTHING` keeps a failed VM for inspection instead of recreating it.
Field names and enums are those of google-cloud-compute 1.57 (compute_v1 ResourcePolicy,
InstanceTemplate, InstanceGroupManager, Scheduling; the REST discovery document's camelCase).
Neither a resource policy nor a MIG carries labels: tpuctl knows its own by the ids it recorded
when it made them (launcher.providers.gcp_owned's rule); the VMs carry the run's label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from payload.cloud import accelerators

if TYPE_CHECKING:
    from payload.config import RunConfig

RUN_LABEL = "tpuctl-run"  # the same label as on gcp (launcher.providers.gcp_owned.RUN_LABEL)
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Scheduling.ProvisioningModel by cluster.provisioning; a reservation makes on-demand capacity
# RESERVATION_BOUND (Compute Engine's provisioning models).
PROVISIONING_MODEL = {"on_demand": "STANDARD", "spot": "SPOT", "flex_start": "FLEX_START"}


@dataclass(frozen=True, kw_only=True)
class SliceNames:
    """The names of what `up` makes for a run (all in the cluster's region)."""

    group: str  # the MIG; its VMs are named GROUP-xxxx by Compute Engine
    template: str
    policy: str
    ssh_rule: str  # firewall: tcp/22 from cluster.ssh_source_ranges to the VMs
    internal_rule: str  # firewall: the slice's VMs reach each other (JAX's coordinator)
    tag: str  # the network tag both rules target

    @classmethod
    def of(cls, run_name: str) -> SliceNames:
        # Compute Engine names: a letter first, 63 characters at most. The run's name is used
        # whole (cut, it could end in a dash, or name two runs alike): the config keeps it
        # within payload.config.GCE_MAX_NAME, which leaves room for the longest suffix.
        return cls(group=run_name, template=f"{run_name}-template",
                   policy=f"{run_name}-topology", ssh_rule=f"{run_name}-ssh",
                   internal_rule=f"{run_name}-internal", tag=f"tpuctl-{run_name}")

    def owned(self, *, policy: bool = True) -> list[tuple[str, str]]:
        """(kind, name) of everything `up` makes, in the order it makes them; `policy`: whether
        the slice has a workload policy (a one-VM slice has none)."""
        return [("firewalls", self.ssh_rule), ("firewalls", self.internal_rule),
                *([("policies", self.policy)] if policy else []),
                ("templates", self.template), ("groups", self.group)]


@dataclass(frozen=True, kw_only=True)
class SliceRequests:
    names: SliceNames
    region: str
    firewalls: tuple[dict, ...]
    policy: dict | None  # None for a one-VM slice: a single VM needs no placement
    template: dict
    group: dict

    def in_order(self) -> list[tuple[str, dict]]:
        """(kind, body) of what `up` inserts, in order (SliceNames.owned's order)."""
        found = [("firewalls", rule) for rule in self.firewalls]
        if self.policy is not None:
            found.append(("policies", self.policy))
        return [*found, ("templates", self.template), ("groups", self.group)]


def region_of(config: RunConfig) -> str:
    return accelerators.region_of(config.cluster.zone)


def scheduling(cluster) -> dict:
    """The template's scheduling: the provisioning model, a run limit, what ends a VM."""
    model = PROVISIONING_MODEL[cluster.provisioning]
    if cluster.reservation:
        model = "RESERVATION_BOUND"
    sent: dict = {"provisioningModel": model, "onHostMaintenance": "TERMINATE",
                  "automaticRestart": False}
    if cluster.provisioning == "spot":
        # A spot VM taken back is deleted, not stopped: it cannot be restarted anyway, and a
        # stopped VM would keep its disk billing.
        sent["instanceTerminationAction"] = "DELETE"
    if cluster.max_run_seconds is not None:
        sent["maxRunDuration"] = {"seconds": str(cluster.max_run_seconds)}
        sent["instanceTerminationAction"] = "DELETE"
    return sent


def reservation_affinity(cluster) -> dict:
    if not cluster.reservation:
        return {"consumeReservationType": "NO_RESERVATION"}
    return {"consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name", "values": [cluster.reservation]}


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
    """The insert bodies for the config's slice (no call is made)."""
    cluster = config.cluster
    acc = cluster.slice
    names = SliceNames.of(config.name)
    region = region_of(config)
    project = cluster.project
    policy = None
    if acc.is_multi_host:
        policy = {"name": names.policy, "region": region,
                  "description": f"tpuctl run {config.name}: the slice's ICI topology",
                  "workloadPolicy": {"type": "HIGH_THROUGHPUT",
                                     "acceleratorTopology": cluster.topology,
                                     "acceleratorTopologyMode": "AUTO_CONNECT"}}
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
        "disks": [{"boot": True, "autoDelete": True,
                   "initializeParams": {"sourceImage": cluster.boot_image}}],
        "networkInterfaces": [network],
        "metadata": {"items": [
            # The guest agent publishes the VM's host keys as guest attributes only with this:
            # tpuctl's known_hosts is written from them (strict SSH from the first connection).
            {"key": "enable-guest-attributes", "value": "TRUE"},
            {"key": "ssh-keys", "value": f"{user}:{public_key.strip()}"},
        ]},
        "scheduling": scheduling(cluster),
        "reservationAffinity": reservation_affinity(cluster),
    }
    # The API attaches no account unless asked ("default": the project's default compute
    # service account); the scope lets any API through, the account's IAM grants decide.
    properties["serviceAccounts"] = [{"email": service_account or "default", "scopes": [SCOPE]}]
    properties["tags"] = {"items": [names.tag]}
    if policy is not None:
        properties["resourcePolicies"] = [names.policy]
    template = {"name": names.template, "region": region,
                "description": f"tpuctl run {config.name}", "properties": properties}
    group = {
        "name": names.group, "region": region, "baseInstanceName": names.group,
        "description": f"tpuctl run {config.name}",
        "instanceTemplate": f"projects/{project}/regions/{region}/instanceTemplates/"
                            f"{names.template}",
        "targetSize": acc.hosts,
        "targetSizePolicy": {"mode": "BULK"},
        "distributionPolicy": {"targetShape": "ANY_SINGLE_ZONE",
                               "zones": [{"zone": f"zones/{cluster.zone}"}]},
        "instanceLifecyclePolicy": {"defaultActionOnFailure": "DO_NOTHING"},
        "updatePolicy": {"type": "OPPORTUNISTIC", "instanceRedistributionType": "NONE"},
    }
    if policy is not None:
        group["resourcePolicies"] = {"workloadPolicy": f"projects/{project}/regions/{region}/"
                                                       f"resourcePolicies/{names.policy}"}
    return SliceRequests(names=names, region=region,
                         firewalls=firewall_rules(config, names, network_path), policy=policy,
                         template=template, group=group)


def terraform_variables(config: RunConfig, *, user: str, public_key: str,
                        service_account: str | None = None) -> dict:
    """infra/modules/tpu_slice's variables for the config's slice: the one place that maps the
    run config to them (the module's variables.tf has exactly these)."""
    cluster = config.cluster
    names = SliceNames.of(config.name)
    return {
        "project": cluster.project, "region": region_of(config), "zone": cluster.zone,
        "run_name": config.name,
        "names": {"group": names.group, "template": names.template, "policy": names.policy,
                  "ssh_rule": names.ssh_rule, "internal_rule": names.internal_rule,
                  "tag": names.tag},
        "machine_type": cluster.machine_type, "topology": cluster.topology,
        "hosts": cluster.slice.hosts, "image": cluster.boot_image,
        "provisioning_model": scheduling(cluster)["provisioningModel"],
        "max_run_seconds": cluster.max_run_seconds,
        "reservation": cluster.reservation, "network": cluster.network,
        "subnetwork": cluster.subnetwork,
        "ssh_source_ranges": list(cluster.ssh_source_ranges or []), "ssh_user": user,
        "ssh_public_key": public_key.strip(), "service_account": service_account or "default",
    }
