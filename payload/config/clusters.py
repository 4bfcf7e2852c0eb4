"""The cluster sections, one per provider (`cluster.provider`): local, ssh, gcp, gce.

    cluster = CLUSTERS["gcp"].model_validate({...}, context={"engine": "jax"})
    cluster.tpu, cluster.runtime, cluster.hourly_usd()

Each checks its own keys as the provider's API would (names, zones, ranges, images), and what
the accelerator table says of the TPU it rents (payload.cloud.accelerators).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Annotated, Literal, get_args

from pydantic import Field, PrivateAttr, field_validator

from payload.config.base import (
    MAX_LOCAL_WORKERS,
    PathText,
    Section,
    UserName,
    check,
    engine_of,
    problems_of,
)
from payload.core.engines import DEFAULT as DEFAULT_ENGINE
from payload.core.errors import UserError


class ClusterBase(Section):
    # An environment already on the workers (custom image, shared venv), used as it is.
    python: PathText | None = None
    # A folder of wheels to install from, for workers with no package index.
    wheelhouse: PathText | None = None
    # Slices that train as one job over the data-center network (JAX only): on gcp and gce that
    # many TPU slices of the one type; on local and ssh equal groups of workers standing for them.
    slices: int = Field(1, ge=1, strict=True)

    @check
    def _one_environment_source(self) -> list[str]:
        if self.python and self.wheelhouse:
            return ["set at most one of cluster.python and cluster.wheelhouse"]
        return []

    def hourly_price(self):
        """The price catalog's entry for this cluster (None: tpuctl bills nothing for it)."""
        return None

    def hourly_usd(self) -> float | None:
        """What the cluster costs per hour by tpuctl's price table (None: nothing billed)."""
        price = self.hourly_price()
        return None if price is None else price.usd_per_hour


class LocalCluster(ClusterBase):
    provider: Literal["local"]
    workers: int = Field(2, ge=1, le=MAX_LOCAL_WORKERS)


# A host name, IPv4 or IPv6 address (IPv6 zones after %): nothing a shell or ssh reads twice.
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:%-]*\Z")


class SshCluster(ClusterBase):
    provider: Literal["ssh"]
    hosts: list[str] = Field(min_length=1)
    user: UserName
    identity_file: PathText | None = None
    known_hosts: PathText
    port: int = Field(22, ge=1, le=65535)
    # Where worker 0's JAX coordinator listens when hosts[0] is not an address of its own (a
    # NAT address): its own address there, or 0.0.0.0 / :: for every interface, said on purpose.
    coordinator_bind: str | None = None

    @field_validator("coordinator_bind")
    @classmethod
    def _bind(cls, value: str | None) -> str | None:
        import ipaddress

        if value is None:
            return value
        try:
            address = ipaddress.ip_address(value)
        except ValueError:
            raise ValueError("not an IP address (worker 0's own address, or 0.0.0.0 to listen "
                             "on every interface)") from None
        if address.is_loopback or address.is_multicast:
            raise ValueError(f"a {'loopback' if address.is_loopback else 'multicast'} address, "
                             "which the other workers cannot reach")
        return str(address)

    @field_validator("hosts")
    @classmethod
    def _plain_hosts(cls, hosts: list[str]) -> list[str]:
        # One worker per host: a host listed twice would be two workers fighting over one
        # machine's TPU chips, and is nearly always a copy-paste slip (--local runs several
        # workers on one machine on purpose).
        seen = set()
        for host in hosts:
            if "@" in host:
                raise ValueError(f"'{host}': write the user as cluster.user, not in the host")
            if host.count(":") == 1 or host.startswith("["):
                raise ValueError(f"'{host}': write the port as cluster.port, not in the host")
            if not _HOST.match(host):
                raise ValueError(f"'{host}' is not a host name or address")
            if host.lower() in seen:
                raise ValueError(f"'{host}' is listed twice; each host runs one worker")
            seen.add(host.lower())
        return hosts


_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]\Z")
# REGION-LETTER: zones end in a letter a-f, AI zones in aiN and maybe a letter (us-south1-ai1b).
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-([a-f]|ai[0-9]+[a-z]?)\Z")
# A VPC network or subnetwork: its name (RFC 1035, as Compute Engine wants) or its resource path.
_NETWORK_NAME = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
_NETWORK = re.compile(rf"^({_NETWORK_NAME}|projects/[a-z][-a-z0-9.:]*[a-z0-9]/global/networks/"
                      rf"{_NETWORK_NAME})\Z")
_SUBNETWORK = re.compile(rf"^({_NETWORK_NAME}|projects/[a-z][-a-z0-9.:]*[a-z0-9]/regions/"
                         rf"[a-z]+-[a-z]+[0-9]+/subnetworks/{_NETWORK_NAME})\Z")
# TPU node names: a letter first, then lowercase letters, digits and dashes (as the API wants).
TPU_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9_.-]{1,61}[a-z0-9]\Z")
_RESERVATION = re.compile(r"^projects/([a-z0-9][a-z0-9-]*[a-z0-9]|[0-9]+)/locations/"
                          r"([a-z]+-[a-z]+[0-9]+-[a-z0-9]+)/reservations/"
                          r"([a-z]([-a-z0-9]{0,61}[a-z0-9])?)\Z")
# A queued request waits at most this long for capacity; the API takes a duration.
MAX_QUEUE_HOURS = 24 * 30


def default_bucket(project: str) -> str:
    """The bucket `tpuctl up` uses when cluster.bucket is not set (project ids are unique)."""
    return f"{project}-tpuctl"


def _is_ip_address(value: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


class GoogleCloud(ClusterBase):
    """The keys every Google Cloud provider (gcp, gce) shares, with their one set of checks."""

    project: str
    zone: str
    # Who may reach the workers' port 22 (CIDRs); `tpuctl up` needs it, there is no default.
    ssh_source_ranges: list[str] | None = None
    network: str = "default"
    subnetwork: str | None = None
    # Default: PROJECT-tpuctl, created by `up` unless it exists (then used, never deleted).
    bucket: str | None = None
    user: UserName | None = None  # default: the login name of whoever runs tpuctl
    identity_file: PathText | None = None  # default: a key tpuctl makes and `up` installs

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        if not _PROJECT.match(value):
            raise ValueError(f"'{value}' is not a Google Cloud project id (6-30 lowercase "
                             "letters, digits and dashes, starting with a letter)")
        return value

    @field_validator("zone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if not _ZONE.match(value):
            raise ValueError(f"'{value}' is not a Google Cloud zone (REGION-LETTER, the letter "
                             "a-f; for example us-central2-b)")
        return value

    @field_validator("network")
    @classmethod
    def _network(cls, value: str) -> str:
        if not _NETWORK.match(value):
            raise ValueError(f"'{value}' is not a VPC network: its name (lowercase letters, "
                             "digits and dashes, such as default) or projects/P/global/networks/N")
        return value

    @field_validator("subnetwork")
    @classmethod
    def _subnetwork(cls, value: str | None) -> str | None:
        if value is not None and not _SUBNETWORK.match(value):
            raise ValueError(f"'{value}' is not a subnetwork: its name (lowercase letters, "
                             "digits and dashes) or projects/P/regions/R/subnetworks/S")
        return value

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str | None) -> str | None:
        if value is not None and _is_ip_address(value):
            raise ValueError(f"'{value}' is an IP address, which Cloud Storage refuses as a "
                             "bucket name; use a name such as my-project-tpuctl")
        if value is not None and (not _BUCKET.match(value) or value.startswith("goog")
                                  or "google" in value or ".." in value):
            raise ValueError(f"'{value}' is not a bucket name: 3-63 lowercase letters, digits, "
                             "dashes, dots and underscores, not starting with goog")
        return value

    @field_validator("ssh_source_ranges")
    @classmethod
    def _ranges(cls, value: list[str] | None) -> list[str] | None:
        import ipaddress

        networks = []
        for cidr in value or ():
            try:
                network = ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"'{cidr}' is not a CIDR range (for example 203.0.113.7/32)"
                                 ) from None
            if "/" not in cidr:
                # Terraform's firewall rule refuses it later, after `up` has started.
                raise ValueError(f"'{cidr}' is an address, not a range; write {cidr}/"
                                 f"{network.max_prefixlen} for that one address")
            networks.append(network)
        for version in (4, 6):
            # Ranges that together cover every address (0.0.0.0/1 + 128.0.0.0/1) are the
            # whole internet as surely as 0.0.0.0/0.
            merged = ipaddress.collapse_addresses(n for n in networks if n.version == version)
            if any(n.prefixlen == 0 for n in merged):
                raise ValueError(f"{', '.join(value)} together open SSH to the whole internet "
                                 f"(every IPv{version} address); list the addresses you connect "
                                 "from (for example your IP/32)")
        return value

    @property
    def bucket_name(self) -> str:
        return self.bucket or default_bucket(self.project)

    @property
    def tpu(self):
        """The accelerator table's entry for one slice this cluster rents (chips, HBM, peak)."""
        raise NotImplementedError

    @property
    def tpu_topology(self):
        """Every slice this cluster rents (payload.cloud.accelerators.Topology): what prices,
        fit checks and plans count."""
        from payload.cloud import accelerators

        return accelerators.topology_of(self.tpu, self.slices)


class GcpCluster(GoogleCloud):
    provider: Literal["gcp"]
    accelerator_type: str
    # Default: the base image the run's engine takes on this accelerator type.
    runtime_version: str | None = None
    provisioning: Literal["on_demand", "spot", "preemptible"] = "on_demand"
    # Wait in a queue for capacity (a queued resource) instead of failing when there is none.
    queued: bool = False
    queue_hours: float = Field(24.0, gt=0, le=MAX_QUEUE_HOURS)
    reservation: str | None = None
    # Zones of the same region to try when the first has no capacity.
    fallback_zones: list[str] = Field(default_factory=list)
    tpu_name: str | None = None  # default: the run's name
    # train.engine, which decides the route (image, packages) on the TPU: handed over by
    # parse_config as validation context, since the section cannot see train itself.
    _engine: str = PrivateAttr(default=DEFAULT_ENGINE)

    @field_validator("accelerator_type")
    @classmethod
    def _accelerator(cls, value: str) -> str:
        from payload.cloud import accelerators

        try:
            accelerators.check_tpu_api(accelerators.accelerator(value))
        except UserError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("tpu_name")
    @classmethod
    def _tpu_name(cls, value: str | None) -> str | None:
        if value is not None and not TPU_NAME.match(value):
            raise ValueError(f"'{value}' is not a TPU name: a letter first, then up to 62 "
                             "lowercase letters, digits and dashes")
        return value

    def take_context(self, context: dict) -> None:
        self._engine = engine_of(context)

    # Every problem at once, what the type can run first, then where: a v6e-8 in us-central2-b
    # is refused for both in one round, not for the zone and then the route.
    @check
    def _route(self) -> list[str]:
        from payload.cloud import accelerators

        acc = accelerators.accelerator(self.accelerator_type)
        problems = problems_of("cluster.accelerator_type", accelerators.check_engine, acc,
                               self._engine)
        if not problems and self.runtime_version is not None:
            problems += problems_of("cluster.runtime_version", accelerators.runtime_for, acc,
                                    self._engine, self.runtime_version)
        return problems

    @check
    def _zones(self) -> list[str]:
        from payload.cloud import accelerators

        acc = accelerators.accelerator(self.accelerator_type)
        problems = problems_of("cluster.zone", accelerators.check_zone, acc, self.zone)
        region = accelerators.region_of(self.zone)
        for zone in self.fallback_zones:
            if zone == self.zone or accelerators.region_of(zone) != region:
                problems.append(f"cluster.fallback_zones: {zone} must be another zone of "
                                f"{region} (the bucket's region), not {self.zone} itself")
            else:
                problems += problems_of("cluster.fallback_zones", accelerators.check_zone, acc,
                                        zone)
        return problems

    @check
    def _reservation_capacity(self) -> list[str]:
        if self.reservation and self.provisioning != "on_demand":
            return [f"cluster.reservation takes on_demand capacity, not {self.provisioning}; "
                    "drop one of them"]
        return []

    @check
    def _reservation_zone(self) -> list[str]:
        # The TPU API names a reservation by its full path, in the zone the request is made in
        # (Google's TF release CI: projects/P/locations/Z/reservations/R).
        if self.reservation is None:
            return []
        found = _RESERVATION.match(self.reservation)
        if not found:
            return [f"cluster.reservation: '{self.reservation}' is not a reservation path; "
                    f"write projects/PROJECT/locations/{self.zone}/reservations/NAME"]
        if found.group(2) != self.zone:
            return [f"cluster.reservation is in {found.group(2)}, but the TPU is asked for in "
                    f"{self.zone}; use a reservation of that zone or set cluster.zone to its zone"]
        return []

    @check
    def _queued_capacity(self) -> list[str]:
        # A queued request asks for spot or on-demand capacity: preemptible has no queue.
        if self.provisioning == "preemptible" and (self.queued or self.reservation):
            return ["cluster.provisioning: preemptible cannot be queued (a queued request "
                    "takes spot or on-demand capacity); use provisioning: spot, or queued: false"]
        return []

    def hourly_price(self):
        from payload.cloud import prices

        return prices.hourly_cost(self.accelerator_type, self.zone, self.provisioning,
                                  self.slices)

    @property
    def tpu(self):
        from payload.cloud import accelerators

        return accelerators.accelerator(self.accelerator_type)

    @property
    def engine(self) -> str:
        """The run's train.engine, as this section was validated with it."""
        return self._engine

    @property
    def runtime(self) -> str:
        """The runtime image: as configured, or the run's engine's default for the type."""
        from payload.cloud import accelerators

        return accelerators.runtime_for(accelerators.accelerator(self.accelerator_type),
                                        self._engine, self.runtime_version)


# Flex-start VMs run at most seven days (Compute Engine's flex-start provisioning model); the
# same bound is kept for a run limit on on-demand and spot VMs, where a longer one is a typo.
MAX_RUN_HOURS = 7 * 24
# Compute Engine's shortest run limit (scheduling.maxRunDuration): 30 seconds ("Limit the run
# time of a VM"); the limit is sent in whole seconds.
MIN_RUN_SECONDS = 30
# A Compute Engine reservation: its name, or projects/P/reservations/R (a shared one).
_COMPUTE_RESERVATION = re.compile(rf"^(projects/[a-z][-a-z0-9]*[a-z0-9]/reservations/)?"
                                  rf"{_NETWORK_NAME}\Z")
# The boot image forms Compute Engine takes as a disk's sourceImage: an image or the newest of
# an image family, of a project (projects/P/global/images/...) or of the run's own project
# (global/images/...). Project ids may be domain-scoped (example.com:my-project).
_IMAGE = re.compile(rf"(projects/([a-z][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{{4,28}}[a-z0-9]/)?"
                    rf"global/images/(family/)?{_NETWORK_NAME}\Z")
# The run's name names what `up` makes (NAME, NAME-topology, NAME-ssh, NAME-internal, the tag
# tpuctl-NAME, and the template's name_prefix NAME-: launcher.providers.gce_slice), whole. The
# google provider takes a name_prefix of at most 54 characters (63 with its shortest unique
# suffix), which leaves the run's name 53; the fixed suffixes (-topology, the longest) fit too.
GCE_MAX_NAME = 54 - len("-")


def gce_name_problems(name: str, slices: int = 1) -> list[str]:
    """What is wrong with a run's name as the names of a gce slice (it is checked as a run
    name on its own elsewhere). Several slices are NAME-i, each with a workload policy
    NAME-i-topology: Compute Engine's 63 characters leave the name that much less."""
    if not TPU_NAME.match(name):
        return [f"name: '{name}' also names the run's VMs and instance group, and Compute "
                "Engine names start with a letter; rename the run"]
    if len(name) > GCE_MAX_NAME:
        return [f"name: '{name}' is {len(name)} characters; on provider gce it also names the "
                f"run's instance template (name prefix {name}-, at most 54 characters for "
                "Terraform's google provider) and the rest of its slice: use at most "
                f"{GCE_MAX_NAME}"]
    longest = 63 - len(f"-{slices - 1}-topology") if slices > 1 else GCE_MAX_NAME
    if len(name) > longest:
        return [f"name: '{name}' is {len(name)} characters; on provider gce with "
                f"{slices} slices it also names each slice's workload policy "
                f"({name}-{slices - 1}-topology, at most 63 characters): use at most {longest}"]
    return []


class GceCluster(GoogleCloud):
    """Compute Engine TPU VMs (TPU7x, v6e, v5p): a machine type and a topology; a slice is a
    regional managed instance group, in the mode its provisioning model takes
    (launcher.providers.gce_slice.provisioning)."""

    provider: Literal["gce"]
    machine_type: str  # e.g. tpu7x-standard-4t, ct6e-standard-4t, ct5p-hightpu-4t
    topology: str  # e.g. 2x2x1; hosts = chips of the topology / chips per VM
    provisioning: Literal["on_demand", "spot", "flex_start"] = "on_demand"
    # Compute Engine stops and deletes the VMs after this long (scheduling.maxRunDuration);
    # flex-start requires it. A number: `true` is not one hour.
    max_run_hours: float | None = Field(None, gt=0, le=MAX_RUN_HOURS, strict=True)
    reservation: str | None = None
    # Default: Google's TPU OS image of the generation (payload.cloud.accelerators.COMPUTE_BOOT).
    image: str | None = None
    # How long `up` waits for every VM of the slice (capacity, quota) before it removes the
    # request; default by provisioning model (launcher.providers.gce_slice.provisioning).
    queue_hours: float | None = Field(None, gt=0, le=MAX_QUEUE_HOURS, strict=True)

    @field_validator("machine_type")
    @classmethod
    def _machine_type(cls, value: str) -> str:
        from payload.cloud import accelerators

        try:
            accelerators.machine_type(value)
        except UserError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("max_run_hours")
    @classmethod
    def _run_limit(cls, value: float | None) -> float | None:
        if value is not None and int(value * 3600) < MIN_RUN_SECONDS:
            least = math.ceil(MIN_RUN_SECONDS / 3600 * 1e4) / 1e4
            raise ValueError(f"{value:g} hours is {int(value * 3600)} seconds, and Compute "
                             f"Engine's shortest run limit is {MIN_RUN_SECONDS} seconds; give "
                             f"at least {least:g} (or leave it out for no limit)")
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is None or _IMAGE.match(value):
            return value
        example = ("projects/ubuntu-os-accelerator-images/global/images/family/"
                   "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e")
        if "://" in value:
            raise ValueError(f"'{value}' is a URL; Compute Engine takes an image by its path, "
                             f"such as {example}")
        raise ValueError(f"'{value}' is not a Compute Engine image: write projects/PROJECT/"
                         "global/images/IMAGE, projects/PROJECT/global/images/family/FAMILY (the "
                         f"family's newest image, such as {example}), or global/images/... for "
                         "an image of the run's project; leave it out for the default")

    @field_validator("reservation")
    @classmethod
    def _reservation(cls, value: str | None) -> str | None:
        if value is not None and not _COMPUTE_RESERVATION.match(value):
            raise ValueError(f"'{value}' is not a Compute Engine reservation: its name, or "
                             "projects/PROJECT/reservations/NAME for a shared one")
        return value

    @check
    def _topology(self) -> list[str]:
        from payload.cloud import accelerators

        return problems_of("cluster.topology", accelerators.compute_slice, self.machine_type,
                           self.topology)

    @check
    def _zone_offers(self) -> list[str]:
        """The zone against the slice, or against the machine type's generation when the
        topology is wrong (the zone is then named in the same round as the topology)."""
        from payload.cloud import accelerators

        try:
            acc = self.slice
        except UserError:
            machine = accelerators.machine_type(self.machine_type)
            acc = dataclasses.replace(
                accelerators.compute_slice(machine.name, machine.topologies[0]),
                name=machine.name)
        return problems_of("cluster.zone", accelerators.check_zone, acc, self.zone)

    @check
    def _flex_start_limit(self) -> list[str]:
        if self.provisioning == "flex_start" and self.max_run_hours is None:
            return ["cluster.provisioning: flex_start needs cluster.max_run_hours (how long the "
                    f"VMs may run, at most {MAX_RUN_HOURS} hours)"]
        return []

    @check
    def _reservation_capacity(self) -> list[str]:
        if self.reservation and self.provisioning != "on_demand":
            return [f"cluster.reservation takes on_demand capacity, not "
                    f"{self.provisioning.replace('_', '-')}; drop one of them"]
        return []

    @property
    def slice(self):
        """The slice as the accelerator table sees it (chips, hosts, peak, zones)."""
        from payload.cloud import accelerators

        return accelerators.compute_slice(self.machine_type, self.topology)

    @property
    def tpu(self):
        return self.slice

    @property
    def boot_image(self) -> str:
        """cluster.image, or Google's TPU OS image of the slice's generation."""
        from payload.cloud import accelerators

        return self.image or accelerators.default_image(self.slice.generation)

    @property
    def image_note(self) -> str | None:
        """Why the boot image may not see the TPU (a warning for the dry run), or None."""
        from payload.cloud import accelerators

        return accelerators.image_note(self.boot_image, self.slice.generation)

    @property
    def max_run_seconds(self) -> int | None:
        """The run limit as Compute Engine is given it (scheduling.maxRunDuration), or None."""
        return None if self.max_run_hours is None else int(self.max_run_hours * 3600)

    def hourly_price(self):
        from payload.cloud import prices

        return prices.hourly_price(self.tpu_topology, self.zone, self.provisioning)


Cluster = Annotated[LocalCluster | SshCluster | GcpCluster | GceCluster,
                    Field(discriminator="provider")]
# `cluster.provider` -> its section, read off the union above (the one list of providers).
CLUSTERS: dict[str, type[ClusterBase]] = {
    get_args(kind.model_fields["provider"].annotation)[0]: kind
    for kind in get_args(get_args(Cluster)[0])
}
