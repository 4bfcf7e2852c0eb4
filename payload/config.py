"""The run config (`tpuctl.yaml`): typed, frozen, validated before anything runs.

    config = load_config("tpuctl.yaml")
    config.data.seq_len, config.cluster.provider

Unknown keys, wrong types and out-of-range values become one `UserError` naming the key and what
is allowed. Relative local paths are resolved against the config file's folder, so a run behaves
the same from any working directory; the resolved config is what gets written next to outputs.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticUndefined

from payload.core.errors import UserError, UserErrors
from payload.core.families import FAMILIES, positions_needed, t5_expanded_length
from payload.core.sizes import SHAPE_DEFAULTS, SIZES

MIN_SEQ_LEN = 16
# Local worker processes share this machine's cores; more than this is a typo.
MAX_LOCAL_WORKERS = 64
# Byte-level BPE starts from all 256 byte symbols before it learns any merge.
BYTE_ALPHABET = 256
# The smallest useful vocabulary for the other kinds, on top of the special tokens.
MIN_LEARNED_PIECES = 64
# Bounds past any real run: a value beyond them is a typo (1e30 steps would never end, and a
# learning rate over 1 sends AdamW and Adafactor to NaN within steps).
MAX_STEPS = 1_000_000_000
MAX_LEARNING_RATE = 1.0
# train.engine (payload.engines holds each one behind the seam).
EngineName = Literal["tensorflow", "jax"]
ENGINE_DEFAULT = "tensorflow"


class _Section(BaseModel):
    # Infinity and NaN are never a sensible setting (`learning_rate: .inf` would train to NaN).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              allow_inf_nan=False)


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _check_scheme(value: str, what: str, *, quote: bool = True) -> str:
    """Local paths and gs:// only: another scheme (s3://) would become a relative local folder."""
    if value.startswith("gs:") and not value.startswith("gs://"):
        # gs:/x (one slash) would otherwise be read as a local folder named gs:.
        raise ValueError(f"'{value}' is not a gs:// URL; write gs://BUCKET/PATH")
    match = _SCHEME.match(value)
    if match and match.group(1) != "gs":
        shown = f"'{value}' uses" if quote else "uses"
        raise ValueError(f"{shown} {match.group(1)}://, which tpuctl cannot {what}; use a "
                         "local path or gs://BUCKET/PATH")
    return value


class _ClusterBase(_Section):
    # An environment already on the workers (custom image, shared venv), used as it is.
    python: str | None = None
    # A folder of wheels to install from, for workers with no package index.
    wheelhouse: str | None = None

    @model_validator(mode="after")
    def _one_environment_source(self):
        if self.python and self.wheelhouse:
            raise ValueError("set at most one of cluster.python and cluster.wheelhouse")
        return self

    def hourly_price(self):
        """The price catalog's entry for this cluster (None: tpuctl bills nothing for it)."""
        return None

    def hourly_usd(self) -> float | None:
        """What the cluster costs per hour by tpuctl's price table (None: nothing billed)."""
        price = self.hourly_price()
        return None if price is None else price.usd_per_hour


class LocalCluster(_ClusterBase):
    provider: Literal["local"]
    workers: int = Field(2, ge=1, le=MAX_LOCAL_WORKERS)


# A host name, IPv4 or IPv6 address (IPv6 zones after %): nothing a shell or ssh reads twice.
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:%-]*\Z")


class SshCluster(_ClusterBase):
    provider: Literal["ssh"]
    hosts: list[str] = Field(min_length=1)
    user: str
    identity_file: str | None = None
    known_hosts: str
    port: int = Field(22, ge=1, le=65535)

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


def _engine_of(info: ValidationInfo) -> str:
    """The train.engine a section is validated for (parse_config's context); an engine that is
    not one is reported by the train section, and the default stands in for it here."""
    engine = (info.context or {}).get("engine")
    return engine if engine in get_args(EngineName) else ENGINE_DEFAULT


def _problems_of(key: str, check, *args) -> list[str]:
    """Run an accelerator-table check: its one-line refusal, naming the key, or nothing."""
    try:
        check(*args)
    except UserError as exc:
        return [f"{key}: {exc}"]
    return []


class _Problems(ValueError):
    """Several problems a validator found at once: parse_config shows each as a line of its
    own. Any other error is one problem, whatever its text holds (a value may end in a
    newline)."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = list(problems)


def _raise_all(problems: list[str]) -> None:
    if problems:
        raise _Problems(problems)


def _is_ip_address(value: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


class _GoogleCloud(_ClusterBase):
    """The keys every Google Cloud provider (gcp, gce) shares, with their one set of checks."""

    project: str
    zone: str
    # Who may reach the workers' port 22 (CIDRs); `tpuctl up` needs it, there is no default.
    ssh_source_ranges: list[str] | None = None
    network: str = "default"
    subnetwork: str | None = None
    # Default: PROJECT-tpuctl, created by `up` unless it exists (then used, never deleted).
    bucket: str | None = None
    user: str | None = None  # default: the login name of whoever runs tpuctl
    identity_file: str | None = None  # default: a key tpuctl makes and `up` installs

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
        """The accelerator table's entry for the TPU this cluster rents (chips, HBM, peak)."""
        raise NotImplementedError


class GcpCluster(_GoogleCloud):
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
    _engine: str = PrivateAttr(default=ENGINE_DEFAULT)

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

    @model_validator(mode="after")
    def _offered(self, info: ValidationInfo):
        from payload.cloud import accelerators

        self._engine = _engine_of(info)
        # Every problem at once, what the type can run first, then where: a v6e-8 in
        # us-central2-b is refused for both in one round, not for the zone and then the route.
        problems = []
        acc = accelerators.accelerator(self.accelerator_type)
        problems += _problems_of("cluster.accelerator_type", accelerators.check_engine, acc,
                                 self._engine)
        if not problems and self.runtime_version is not None:
            problems += _problems_of("cluster.runtime_version", accelerators.runtime_for, acc,
                                     self._engine, self.runtime_version)
        problems += _problems_of("cluster.zone", accelerators.check_zone, acc, self.zone)
        region = accelerators.region_of(self.zone)
        for zone in self.fallback_zones:
            if zone == self.zone or accelerators.region_of(zone) != region:
                problems.append(f"cluster.fallback_zones: {zone} must be another zone of "
                                f"{region} (the bucket's region), not {self.zone} itself")
            else:
                problems += _problems_of("cluster.fallback_zones", accelerators.check_zone, acc,
                                         zone)
        if self.reservation and self.provisioning != "on_demand":
            problems.append(f"cluster.reservation takes on_demand capacity, not "
                            f"{self.provisioning}; drop one of them")
        _raise_all(problems)
        return self

    @model_validator(mode="after")
    def _queued_capacity(self):
        # The TPU API names a reservation by its full path, in the zone the request is made in
        # (Google's TF release CI: projects/P/locations/Z/reservations/R).
        if self.reservation is not None:
            found = _RESERVATION.match(self.reservation)
            if not found:
                raise ValueError(f"cluster.reservation: '{self.reservation}' is not a "
                                 f"reservation path; write projects/PROJECT/locations/"
                                 f"{self.zone}/reservations/NAME")
            if found.group(2) != self.zone:
                raise ValueError(f"cluster.reservation is in {found.group(2)}, but the TPU "
                                 f"is asked for in {self.zone}; use a reservation of that zone "
                                 "or set cluster.zone to its zone")
        # A queued request asks for spot or on-demand capacity: preemptible has no queue.
        if self.provisioning == "preemptible" and (self.queued or self.reservation):
            raise ValueError("cluster.provisioning: preemptible cannot be queued (a queued "
                             "request takes spot or on-demand capacity); use provisioning: "
                             "spot, or queued: false")
        return self

    def hourly_price(self):
        from payload.cloud import prices

        return prices.hourly_cost(self.accelerator_type, self.zone, self.provisioning)

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


def gce_name_problems(name: str) -> list[str]:
    """What is wrong with a run's name as the names of a gce slice (it is checked as a run
    name on its own elsewhere)."""
    if not TPU_NAME.match(name):
        return [f"name: '{name}' also names the run's VMs and instance group, and Compute "
                "Engine names start with a letter; rename the run"]
    if len(name) > GCE_MAX_NAME:
        return [f"name: '{name}' is {len(name)} characters; on provider gce it also names the "
                f"run's instance template (name prefix {name}-, at most 54 characters for "
                "Terraform's google provider) and the rest of its slice: use at most "
                f"{GCE_MAX_NAME}"]
    return []


class GceCluster(_GoogleCloud):
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

    @model_validator(mode="after")
    def _offered(self):
        from payload.cloud import accelerators

        problems = _problems_of("cluster.topology", accelerators.compute_slice,
                                self.machine_type, self.topology)
        if not problems:
            problems += _problems_of("cluster.zone", accelerators.check_zone, self.slice,
                                     self.zone)
        if self.provisioning == "flex_start" and self.max_run_hours is None:
            problems.append("cluster.provisioning: flex_start needs cluster.max_run_hours (how "
                            f"long the VMs may run, at most {MAX_RUN_HOURS} hours)")
        if self.reservation and self.provisioning != "on_demand":
            problems.append(f"cluster.reservation takes on_demand capacity, not "
                            f"{self.provisioning.replace('_', '-')}; drop one of them")
        _raise_all(problems)
        return self

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

        return prices.hourly_price(self.slice, self.zone, self.provisioning)


Cluster = Annotated[LocalCluster | SshCluster | GcpCluster | GceCluster,
                    Field(discriminator="provider")]
# `cluster.provider` -> its section, read off the union above (the one list of providers).
CLUSTERS: dict[str, type[_ClusterBase]] = {
    get_args(kind.model_fields["provider"].annotation)[0]: kind
    for kind in get_args(get_args(Cluster)[0])
}


class DataConfig(_Section):
    corpus: list[str] = Field(min_length=1)
    text_column: str = "text"
    # How plain-text files hold documents: one per line, or separated by blank lines.
    document_split: Literal["line", "blank_line"] = "line"
    seq_len: int = Field(128, ge=MIN_SEQ_LEN)
    # 0 holds nothing out: prepare then skips the validation split (what a prepare-only run or
    # a benchmark may want), and a job that trains is refused (check_stages).
    validation_fraction: float = Field(0.01, ge=0.0, lt=1.0)
    records_per_shard: int = Field(10_000, gt=0)
    # A longer document almost always means a file in the wrong format (a whole book on one line).
    max_document_mb: float = Field(4.0, gt=0)
    # For `hf:NAME` corpora.
    hf_config: str | None = None
    hf_split: str = "train"

    @field_validator("corpus", mode="before")
    @classmethod
    def _listify(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("corpus")
    @classmethod
    def _schemes(cls, value: list[str]) -> list[str]:
        return [_check_scheme(entry, "read") for entry in value]


class TokenizerConfig(_Section):
    kind: Literal["unigram", "bpe", "wordpiece", "sentencepiece"] = "unigram"
    vocab_size: int = Field(32_000, gt=0, le=1_000_000)
    # Reuse an existing Hugging Face tokenizer folder instead of training one.
    path: str | None = None
    # Train on the first megabytes of each input (proportionally); null trains on everything.
    sample_mb: float | None = Field(256.0, gt=0)
    min_frequency: int = Field(2, ge=1)

    @field_validator("path")
    @classmethod
    def _scheme(cls, value: str | None) -> str | None:
        return value if value is None else _check_scheme(value, "read", quote=False)


class ModelConfig(_Section):
    family: Literal["bert", "roberta", "gpt2", "t5"]
    # The architecture, described once: a published size by name, the shape keys (defaults for
    # any left out; all four defaults when nothing describes it), a transformers config.json,
    # or a model folder to continue pretraining (its weights, its tokenizer).
    size: str | None = None
    hidden_size: int | None = Field(None, gt=0)
    num_layers: int | None = Field(None, gt=0)
    num_heads: int | None = Field(None, gt=0)
    intermediate_size: int | None = Field(None, gt=0)
    config: str | None = None
    init_from: str | None = None
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    # Dropout on the attention weights (transformers' attention_probs_dropout_prob / attn_pdrop),
    # when it should differ from model.dropout: the JAX engine's fused attention kernels have
    # none, so a rate above 0 keeps it on the reference attention (payload.engines.jax.attention).
    attention_dropout: float | None = Field(None, ge=0.0, lt=1.0)
    mlm_probability: float = Field(0.15, gt=0.0, lt=1.0)
    noise_density: float = Field(0.15, gt=0.0, lt=1.0)
    mean_noise_span_length: float = Field(3.0, ge=1.0)

    @field_validator("init_from")
    @classmethod
    def _init_scheme(cls, value: str | None) -> str | None:
        return value if value is None else _check_scheme(value, "read", quote=False)

    @model_validator(mode="before")
    @classmethod
    def _one_architecture(cls, raw: Any) -> Any:
        # Unset and null are the same: the resolved config written for the workers says
        # `size: null` beside the shape keys (or the other way round) and must load again.
        if not isinstance(raw, dict):
            return raw
        given = [key for key in ("size", *SHAPE_DEFAULTS, "config", "init_from")
                 if raw.get(key) is not None]
        kinds: dict[str, str] = {}  # one key named per kind of description
        for key in given:
            kinds.setdefault("shape" if key in SHAPE_DEFAULTS else key, key)
        if len(kinds) > 1:
            first, second = list(kinds.values())[:2]
            raise ValueError(
                f"model.{first} and model.{second} both describe the architecture: set only one "
                "of model.size, the shape keys (hidden_size, num_layers, num_heads, "
                "intermediate_size), model.config, model.init_from"
            )
        if not kinds or "shape" in kinds:
            raw = {**raw, **{k: v for k, v in SHAPE_DEFAULTS.items() if raw.get(k) is None}}
        return raw

    @model_validator(mode="after")
    def _shape_checks(self):
        sizes = SIZES[self.family]
        if self.size is not None and self.size not in sizes:
            raise ValueError(
                f"model.size '{self.size}' is not a {self.family} size; choose one of "
                f"{', '.join(sizes)}"
            )
        if self.hidden_size is not None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.num_heads={self.num_heads} does not divide model.hidden_size="
                f"{self.hidden_size}; pick a hidden size that is a multiple of the head count"
            )
        return self


class TrainConfig(_Section):
    # Which framework trains (payload.engines): the same shards, checkpoint rules and model/
    # folder either way. TPU v6e and later have JAX only.
    engine: EngineName = ENGINE_DEFAULT
    steps: int = Field(gt=0, le=MAX_STEPS)
    batch_size: int = Field(gt=0)
    learning_rate: float = Field(gt=0.0, le=MAX_LEARNING_RATE)
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    weight_decay: float = Field(0.01, ge=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    optimizer: Literal["adamw", "adafactor"] = "adamw"
    bf16: bool = False
    # The JAX engine's rematerialisation of its layers' activations (recomputed in the backward
    # pass instead of kept): none, dots (keep the products, recompute the rest), full (keep
    # each layer's input only, about a third more compute), or auto: the least that fits the
    # chip's memory by the run plan's estimate (payload.engines.jax.memory).
    remat: Literal["auto", "none", "dots", "full"] = "auto"
    checkpoint_every: int = Field(500, gt=0)
    keep_checkpoints: int = Field(3, gt=0)
    eval_every: int = Field(500, gt=0)
    eval_batches: int = Field(20, gt=0)
    seed: int = 0
    # Hard stops, counted as billed (payload.cloud.budget): at the limit the run checkpoints,
    # exports and stops.
    max_hours: float | None = Field(None, gt=0)
    max_cost: float | None = Field(None, gt=0)  # USD, by the price table (gcp only)

    @field_validator("steps", "warmup_steps", mode="before")
    @classmethod
    def _countable(cls, value: Any) -> Any:
        # 1.0e+30 is a float too large for Pydantic to even parse as an integer: say the limit.
        if isinstance(value, float) and value > MAX_STEPS:
            raise ValueError(f"must be at most {MAX_STEPS:,}")
        return value


# A Hub repository id: OWNER/NAME, each letters, digits, '-', '_' and '.', not starting or
# ending with '-' or '.', NAME at most 96 characters (the Hub's own rule).
HUB_REPO = re.compile(r"^[A-Za-z0-9]([\w.-]{0,94}[A-Za-z0-9])?/[A-Za-z0-9]([\w.-]{0,94}[A-Za-z0-9])?\Z")


class HubConfig(_Section):
    # Publish model/ (with a generated model card) to this Hugging Face model repository after
    # export; `tpuctl train --push-to-hub OWNER/NAME` sets it for one run.
    repo: str | None = None
    private: bool = False  # for a repository the run creates; an existing one stays as it is

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str | None) -> str | None:
        if value is not None and (not HUB_REPO.match(value) or ".." in value or "--" in value):
            raise ValueError(f"'{value}' is not a Hub repository id: write OWNER/NAME (letters, "
                             "digits, '-', '_', '.')")
        return value


_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\Z")
_PROJECT_MARKERS = (".git", "pyproject.toml")


def check_output_dir_path(value: str) -> str:
    """output_dir must be a folder of the run's own: tpuctl writes in it and deletes inside it,
    so a root (of the filesystem, a mount, the home folder, a project) is refused."""
    _check_scheme(value, "write to", quote=False)  # the value is shown with the error
    if value.startswith("gs://"):
        bucket, _, prefix = value[len("gs://"):].partition("/")
        if not bucket or not prefix.strip("/"):
            raise ValueError(f"a whole bucket cannot be an output_dir; use gs://"
                             f"{bucket or 'BUCKET'}/NAME")
        return value
    path = os.path.realpath(os.path.expanduser(value))
    home = os.path.realpath(os.path.expanduser("~"))
    what = None
    if path == os.path.dirname(path):
        what = "the filesystem root"
    elif path == home:
        what = "your home folder"
    elif home.startswith(path.rstrip(os.sep) + os.sep):
        what = "a folder that holds your home folder"
    elif os.path.ismount(path):
        what = "the root of a mounted filesystem"
    else:
        found = next((m for m in _PROJECT_MARKERS if os.path.exists(os.path.join(path, m))), None)
        if found:
            what = f"a project's root folder (it holds {found})"
    if what:
        raise ValueError(f"{what} cannot be an output_dir (tpuctl deletes inside it); use a "
                         f"folder of the run's own, such as {os.path.join(path, 'runs', 'NAME')}")
    return value


class RunConfig(_Section):
    name: str
    output_dir: str  # gcp default: gs://BUCKET/NAME
    cluster: Cluster = Field(default_factory=lambda: LocalCluster(provider="local"))
    data: DataConfig
    tokenizer: TokenizerConfig = Field(default_factory=lambda: TokenizerConfig())
    model: ModelConfig
    train: TrainConfig
    hub: HubConfig = Field(default_factory=lambda: HubConfig())

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, value: str) -> str:
        return check_output_dir_path(value)

    @model_validator(mode="before")
    @classmethod
    def _gcp_output_dir(cls, raw: Any) -> Any:
        """On gcp, output_dir defaults to gs://BUCKET/NAME."""
        if isinstance(raw, dict) and raw.get("output_dir") is None:
            cluster, name = raw.get("cluster"), raw.get("name")
            if (isinstance(cluster, dict) and cluster.get("provider") in ("gcp", "gce")
                    and isinstance(name, str) and isinstance(cluster.get("project"), str)):
                bucket = cluster.get("bucket") or default_bucket(cluster["project"])
                raw = {**raw, "output_dir": f"gs://{bucket}/{name}"}
        return raw

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"'{value}' must be 1-63 lowercase letters, digits and dashes, starting and "
                "ending with a letter or digit (it names the job, the TPU and bucket paths)"
            )
        return value

    @model_validator(mode="after")
    def _cross_checks(self):
        _raise_all(_cross_problems(name=self.name, cluster=self.cluster, data=self.data,
                                   tokenizer=self.tokenizer, model=self.model, train=self.train))
        return self

    @property
    def trains_tokenizer(self) -> bool:
        """Whether the tokenizer stage trains one: not when tokenizer.path or model.init_from
        brings it."""
        return self.tokenizer.path is None and self.model.init_from is None

    @property
    def record_len(self) -> int:
        """Tokens per stored record: `seq_len`, or T5's longer pre-corruption row."""
        if self.model.family == "t5":
            return t5_expanded_length(
                self.data.seq_len, self.model.noise_density, self.model.mean_noise_span_length
            )
        return self.data.seq_len


def _cross_problems(*, name: str | None, cluster, data, tokenizer, model, train) -> list[str]:
    """What is wrong between sections. Each section is None when it is itself invalid (its own
    problems are reported): the checks that need it are left out, the others still run."""
    problems = []
    if (name is not None and isinstance(cluster, GcpCluster) and cluster.tpu_name is None
            and not TPU_NAME.match(name)):
        problems.append(f"name: '{name}' also names the TPU, and TPU names start with a "
                        "letter; rename the run or set cluster.tpu_name")
    if name is not None and isinstance(cluster, GceCluster):
        problems += gce_name_problems(name)
    if train is not None and isinstance(cluster, GceCluster) and train.engine != "jax":
        # Google documents JAX and PyTorch on TPU7x, and no TensorFlow route reaches v6e.
        problems.append(f"train.engine: {train.engine} does not run on provider gce (Compute "
                        "Engine TPU VMs run JAX only); set train.engine: jax")
    family = FAMILIES[model.family] if model is not None else None
    if family is not None and data is not None and data.seq_len > family.max_positions:
        problems.append(f"data.seq_len={data.seq_len} is over what {family.name} allows "
                        f"({family.max_positions}); lower data.seq_len")
    if model is not None and tokenizer is not None:
        if model.init_from and tokenizer.path:
            problems.append("model.init_from brings its own tokenizer: remove tokenizer.path")
        if tokenizer.path is None and model.init_from is None:  # the tokenizer stage trains
            minimum = len(family.special_tokens) + (
                BYTE_ALPHABET if tokenizer.kind == "bpe" else MIN_LEARNED_PIECES)
            if tokenizer.vocab_size < minimum:
                problems.append(
                    f"tokenizer.vocab_size={tokenizer.vocab_size} is too small for "
                    f"{tokenizer.kind} with {family.name}'s {len(family.special_tokens)} "
                    f"special tokens; use at least {minimum}")
    if train is not None and cluster is not None and train.max_cost is not None and (
            cluster.hourly_usd() is None):
        problems.append("train.max_cost needs a price per hour, and tpuctl's price table has "
                        "none for this cluster (only cloud TPUs are priced, and not every "
                        "type or provisioning); use train.max_hours instead")
    if train is not None and train.engine != "jax" and train.remat != "auto":
        problems.append(f"train.remat: {train.remat} rematerialises the JAX engine's layers; "
                        f"the {train.engine} engine has no such setting: remove it or set "
                        "train.engine: jax")
    if (model is not None and model.family == "t5" and model.attention_dropout is not None
            and model.attention_dropout != model.dropout):
        problems.append("model.attention_dropout: T5 has one dropout rate for all its layers "
                        "(transformers' dropout_rate); set model.dropout instead")
    if train is not None and train.warmup_steps > train.steps:
        problems.append(f"train.warmup_steps={train.warmup_steps} is more than train.steps="
                        f"{train.steps}")
    problems += _state_problems(cluster=cluster, data=data, tokenizer=tokenizer, model=model,
                                train=train)
    return problems


def _state_problems(*, cluster, data, tokenizer, model, train) -> list[str]:
    """A model whose training state the TPU's chips cannot hold, as the engine would lay it
    out (payload.engines.sharding_plan), refused with the engine and the type: here when the
    config alone gives the shape and vocabulary; a model read from files is checked by the run
    plan (`train --dry-run`) and the train stage."""
    if not (isinstance(cluster, _GoogleCloud) and None not in (data, tokenizer, model, train)):
        return []
    if model.init_from or model.config or tokenizer.path:
        return []
    from payload.core.sizes import parameter_count, transformers_config
    from payload.engines import Workload, sharding_plan

    acc = cluster.tpu
    architecture = transformers_config(model, vocab_size=tokenizer.vocab_size,
                                       seq_len=data.seq_len)
    params = parameter_count(architecture)
    workload = Workload.of(architecture, model=model, data=data, train=train, platform="tpu",
                           generation=acc.generation)
    key = f"model.size {model.size}" if model.size else "model"
    return _problems_of(key, lambda: sharding_plan(
        train.engine, params, num_devices=acc.chips, hbm_bytes_per_chip=acc.hbm_gib_per_chip << 30,
        optimizer=train.optimizer, where=acc.name, workload=workload))


def _valid_sections(raw: dict) -> dict:
    """Each section the cross-section checks read, validated on its own (None where invalid),
    so that a config with a bad section still gets those checks for the others."""
    from pydantic import TypeAdapter

    context = _context(raw)
    found: dict[str, Any] = {}
    for key, kind in (("cluster", Cluster), ("data", DataConfig),
                      ("tokenizer", TokenizerConfig), ("model", ModelConfig),
                      ("train", TrainConfig)):
        info = RunConfig.model_fields[key]
        try:
            found[key] = (TypeAdapter(kind).validate_python(raw[key], context=context)
                          if key in raw
                          else info.get_default(call_default_factory=True))
        except (ValidationError, TypeError):
            found[key] = None
        if found[key] is PydanticUndefined:
            found[key] = None
    name = raw.get("name")
    found["name"] = name if isinstance(name, str) and _NAME.match(name) else None
    return found


def _field_name(loc: tuple) -> str:
    # Drop pydantic's union tags (e.g. "local", "function-after[...]") from the location.
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in CLUSTERS))]
    return ".".join(parts)


def _bound(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 10_000 else str(value)


# Pydantic's own wording ("Input should be greater than 0") in the project's words.
_WORDING = {
    "greater_than": lambda c: (f"at least {c['gt'] + 1}" if isinstance(c["gt"], int)
                               else f"more than {c['gt']}"),
    "greater_than_equal": lambda c: f"at least {_bound(c['ge'])}",
    "less_than": lambda c: f"less than {_bound(c['lt'])}",
    "less_than_equal": lambda c: f"at most {_bound(c['le'])}",
    "int_parsing": lambda c: "a whole number (an integer)",
    "int_type": lambda c: "a whole number (an integer)",
    "int_from_float": lambda c: "a whole number (an integer)",
    "float_parsing": lambda c: "a number",
    "float_type": lambda c: "a number",
    "bool_parsing": lambda c: "true or false",
    "bool_type": lambda c: "true or false",
    "string_type": lambda c: "text",
    "literal_error": lambda c: f"one of {c.get('expected', '')}",
    "list_type": lambda c: "a list",
    "too_short": lambda c: (f"a list of at least {c.get('min_length', 1)} entries"
                            if c.get("min_length", 1) != 1 else "a list of at least one entry"),
    "too_long": lambda c: f"a list of at most {c.get('max_length', '?')} entries",
    "model_type": lambda c: "a mapping of keys (a section)",
    "model_attributes_type": lambda c: "a mapping of keys (a section)",
    "dict_type": lambda c: "a mapping of keys",
}


def _describe(error: dict, model: type[BaseModel]) -> str:
    where = _field_name(error["loc"])
    kind = error["type"]
    message = error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        section = _section_for(model, error["loc"][:-1])
        fields = list(section.model_fields) if section else []
        close = difflib.get_close_matches(str(error["loc"][-1]), fields, n=1, cutoff=0.75)
        home = None if close else _home_of(str(error["loc"][-1]), model)
        key = error["loc"][-1]
        belongs = (f"{key} belongs in {home.split('.')[0]}" if home and "." in home
                   else f"{key} is a top-level key")
        guess = (f"did you mean '{close[0]}'? " if close
                 else f"{belongs}: did you mean '{home}'? " if home else "")
        allowed = f"allowed here: {', '.join(fields)}" if fields else ""
        return f"unknown key '{where}'" + (f" ({guess}{allowed})" if guess or allowed else "")
    if kind == "finite_number":
        return f"{where}: must be a finite number (got {error.get('input')!r})"
    if kind == "missing":
        return f"missing required key '{where}'"
    if kind == "union_tag_invalid" or kind == "union_tag_not_found":
        return f"'{where or 'cluster'}.provider' must be one of: {', '.join(CLUSTERS)}"
    if kind in _WORDING:
        got = error.get("input")
        shown = f" (got {got!r})" if not isinstance(got, dict | list) else ""
        return f"{where or 'the config'} must be {_WORDING[kind](error.get('ctx') or {})}{shown}"
    if where and not message.startswith(where.split(".")[0] + "."):
        got = error.get("input")
        shown = f" (got {got!r})" if got is not None and not isinstance(got, dict | list) else ""
        joint = " " if message.startswith("must ") else ": "  # "train.steps must be ..."
        return f"{where}{joint}{message}{shown}"
    return message


def _home_of(key: str, model: type[BaseModel]) -> str | None:
    """Where a key written in the wrong section belongs ("engine" -> "train.engine"): the one
    top-level key or section key of that name (any provider's, for cluster); None if none is."""
    homes = [key] if key in model.model_fields else []
    for name, info in model.model_fields.items():
        sections = (CLUSTERS.values() if name == "cluster"
                    else [a for a in getattr(info.annotation, "__args__", (info.annotation,))
                          if isinstance(a, type) and issubclass(a, BaseModel)])
        if any(key in section.model_fields for section in sections):
            homes.append(f"{name}.{key}")
    return homes[0] if len(homes) == 1 else None


def _section_for(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if isinstance(part, str) and part in CLUSTERS:
            current = CLUSTERS[part]
            continue
        fields = getattr(current, "model_fields", {})
        if part not in fields:
            return current if isinstance(current, type) else None
        annotation = fields[part].annotation
        current = next((a for a in getattr(annotation, "__args__", (annotation,))
                        if isinstance(a, type) and issubclass(a, BaseModel)), annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


_LOCAL_PATH_KEYS = {
    ("tokenizer", "path"), ("model", "config"), ("model", "init_from"), ("cluster", "identity_file"),
    ("cluster", "known_hosts"), ("cluster", "wheelhouse"),
}


def _is_remote(path: str) -> bool:
    # gs: without // too: left as written, so that validation refuses it as a broken URL
    # instead of it becoming a local folder named gs:.
    return "://" in path or path.startswith(("hf:", "gs:"))


def _resolve_paths(raw: dict, base: Path) -> dict:
    """Make relative local paths absolute against the config file's folder."""

    def resolve(value: Any) -> Any:
        if not isinstance(value, str) or _is_remote(value):
            return value
        expanded = os.path.expanduser(value)
        return os.path.normpath(expanded if os.path.isabs(expanded) else str(base / expanded))

    out = dict(raw)
    if isinstance(out.get("output_dir"), str):
        out["output_dir"] = resolve(out["output_dir"])
    data = out.get("data")
    if isinstance(data, dict) and "corpus" in data:
        corpus = data["corpus"]
        data = dict(data)
        data["corpus"] = ([resolve(c) for c in corpus] if isinstance(corpus, list)
                          else resolve(corpus))
        out["data"] = data
    for section, key in _LOCAL_PATH_KEYS:
        block = out.get(section)
        if isinstance(block, dict) and isinstance(block.get(key), str):
            out[section] = {**block, key: resolve(block[key])}
    return out


def _context(raw: dict) -> dict:
    """What sections are validated with beside their own keys: the run's train.engine, which
    decides what the cluster's TPU boots and installs (GcpCluster)."""
    train = raw.get("train")
    return {"engine": train.get("engine") if isinstance(train, dict) else None}


def parse_config(raw: Any, *, base_dir: Path | None = None, source: str = "config") -> RunConfig:
    """Validate a parsed YAML mapping; every problem becomes a line of one `UserErrors` (a
    single problem: a one-line `UserError`), the most fundamental first."""
    if raw is None:
        raise UserError(f"{source} is empty", hint="run `tpuctl init` for a starting point")
    if not isinstance(raw, dict):
        raise UserError(f"{source} must be a mapping of sections (name, cluster, data, ...)")
    if base_dir is not None:
        raw = _resolve_paths(raw, base_dir)
    try:
        return RunConfig.model_validate(raw, context=_context(raw))
    except ValidationError as exc:
        errors = exc.errors()
        problems = _problems(errors)
        if not any(not e["loc"] for e in errors):
            # A section failed, so the checks across sections did not run: run those the
            # valid sections allow, so that nothing is left for a second round.
            extra = _cross_problems(**_valid_sections(raw))
            problems += [p for p in extra if p not in problems]
    problems = [f"{source}: {p}" for p in problems]
    raise (UserError(problems[0]) if len(problems) == 1 else UserErrors(problems)) from None


# The order problems are shown in: what the file is made of (unknown and missing keys, the
# provider) first; then section by section in the file's order (the cluster before what runs
# on it), each key's own value before what is wrong between a section's keys; what is wrong
# between sections last.
def _rank(error: dict) -> tuple[int, int, int]:
    kind, loc = error["type"], error["loc"]
    structure = ("extra_forbidden", "missing", "union_tag_invalid", "union_tag_not_found")
    if kind in structure:
        return (0, structure.index(kind), 0)
    if not loc:
        return (2, 0, 0)
    sections = list(RunConfig.model_fields)
    where = sections.index(loc[0]) if loc[0] in sections else len(sections)
    return (1, where, 1 if _last_is_section(loc) else 0)


def _last_is_section(loc: tuple) -> bool:
    """Whether the location ends at a section (a section's own validator), not at a key."""
    current: Any = RunConfig
    for part in loc:
        if isinstance(part, str) and part in CLUSTERS:
            continue
        fields = getattr(current, "model_fields", {})
        if isinstance(part, int) or part not in fields:
            return False
        annotation = fields[part].annotation
        current = next((a for a in getattr(annotation, "__args__", (annotation,))
                        if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if current is None:
            return False
    return True


def _problems(errors: list[dict]) -> list[str]:
    """One line per problem, in _rank's order, without the gaps a mistyped key leaves."""
    mistyped = set()
    for error in errors:
        if error["type"] == "extra_forbidden":
            section = _section_for(RunConfig, error["loc"][:-1])
            fields = list(section.model_fields) if section else []
            close = difflib.get_close_matches(str(error["loc"][-1]), fields, n=1, cutoff=0.75)
            if close:
                mistyped.add(_field_name((*error["loc"][:-1], close[0])))
            elif _home_of(str(error["loc"][-1]), RunConfig):  # in the wrong section
                mistyped.add(_home_of(str(error["loc"][-1]), RunConfig))
    lines = []
    for error in sorted(errors, key=_rank):
        if error["type"] == "missing" and _field_name(error["loc"]) in mistyped:
            continue  # a mistyped key also leaves the key it meant missing: name the mistake
        raised = (error.get("ctx") or {}).get("error")
        parts = (raised.problems if isinstance(raised, _Problems)
                 else [error["msg"].removeprefix("Value error, ")])
        for part in parts:
            line = _describe({**error, "msg": part}, RunConfig)
            if line not in lines:
                lines.append(line)
    return lines


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int, first: int):
        super().__init__(key)
        self.key, self.line, self.first = key, line, first


class _StrictLoader(yaml.SafeLoader):
    """YAML without silent overrides: a key given twice in one mapping is an error (plain
    YAML keeps the last one, so a second `train:` section would quietly replace the first)."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep=False):
    seen: dict[Any, int] = {}
    for key_node, _value in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            if key in seen:
                raise _DuplicateKey(key, line, seen[key])
            seen[key] = line
        except TypeError:  # an unhashable key; SafeLoader reports it
            pass
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _mapping_without_duplicates)


def load_config(path: str | os.PathLike, *, engine: str | None = None) -> RunConfig:
    """The run config in the file at `path`; `engine` (`tpuctl train --engine NAME`) in place
    of the file's train.engine, validated as if the file said so: the cluster's route (image,
    packages) follows the engine, so a v6e config written for tensorflow loads for jax."""
    engines = get_args(EngineName)
    if engine is not None and engine not in engines:
        raise UserError(f"--engine {engine!r} is not an engine",
                        hint=f"use one of {', '.join(engines)}")
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a config file",
                        hint=f"pass -c {path / 'tpuctl.yaml'}, or run `tpuctl init {path}`")
    if not path.is_file():
        raise UserError(
            f"no config file at {path}", hint="pass -c PATH, or run `tpuctl init` to write one"
        )
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the config {path}: {exc.strerror or exc}",
                        hint="check the file's permissions") from None
    try:
        raw = yaml.load(text.decode("utf-8"), Loader=_StrictLoader)  # a SafeLoader
    except _DuplicateKey as dup:
        raise UserError(f"{path} line {dup.line}: duplicate key '{dup.key}' (first at line "
                        f"{dup.first})", hint="keep one of them") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise UserError(f"{path}{where}: {problem}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    source = str(path)
    if engine is not None and isinstance(raw, dict) and isinstance(raw.get("train"), dict):
        raw = {**raw, "train": {**raw["train"], "engine": engine}}
        source = f"{path} with --engine {engine}"
    return parse_config(raw, base_dir=path.resolve().parent, source=source)


def check_stages(config: RunConfig, stages) -> None:
    """What the config cannot do for a job of these stages (names), refused before it starts."""
    if "train" in {str(getattr(s, "value", s)) for s in stages} and (
            config.data.validation_fraction == 0):
        raise UserError("data.validation_fraction is 0: nothing is held out, so training "
                        "would have no evaluation",
                        hint="use a small share such as 0.01")


def check_model_config_file(path: str, family: str, *, seq_len: int | None = None) -> dict:
    """`model.config` is a readable transformers config.json for `family` (with positions for
    rows of `seq_len`, when given): checked without transformers, before a job starts and
    before the train stage builds the model."""
    if os.path.isdir(path):
        raise UserError(f"model.config: {path} is a folder",
                        hint="point it at the config.json file (a transformers model config)")
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"model.config: cannot read {path} (no such file)",
                        hint="check the path (relative paths are relative to the config file)"
                        ) from None
    except OSError as exc:
        raise UserError(f"model.config: cannot read {path} ({exc.strerror or exc})") from None
    try:
        config = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"model.config: {path} is not JSON",
                        hint="point it at a transformers config.json") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise UserError(f"model.config: {path} has no model_type",
                        hint="point it at a transformers config.json")
    if config["model_type"] != family:
        raise UserError(f"model.config is a {config['model_type']} config but model.family is "
                        f"{family}", hint="make them agree")
    positions = config.get("max_position_embeddings") or config.get("n_positions")
    if seq_len is not None and isinstance(positions, int) and (
            positions < positions_needed(family, seq_len)):
        raise UserError(f"model.config: {path} has {positions} positions, too few for "
                        f"data.seq_len {seq_len} (a {family} model needs "
                        f"{positions_needed(family, seq_len)})",
                        hint="lower data.seq_len or raise the position count in that file")
    return config


def with_hub_repo(config: RunConfig, repo: str) -> RunConfig:
    """The config with `hub.repo` set (what `--push-to-hub OWNER/NAME` does)."""
    try:
        hub = HubConfig(repo=repo, private=config.hub.private)
    except ValidationError as exc:
        raise UserError(f"--push-to-hub: {_describe(exc.errors()[0], HubConfig)}") from None
    return config.model_copy(update={"hub": hub})


# What only the tokenizer stage reads when it trains a tokenizer.
_TRAINING_TOKENIZER_KEYS = ("kind", "vocab_size", "sample_mb", "min_frequency")


def ignored_settings(config: RunConfig) -> list[str]:
    """One line per setting the file gives that this run will not use (the run still goes):
    the tokenizer training keys when tokenizer.path or model.init_from brings the tokenizer.
    Only what the file itself set counts (a config loaded from a file, not a resolved dump)."""
    lines = []
    reused = (f"model.init_from {config.model.init_from}" if config.model.init_from
              else f"tokenizer.path {config.tokenizer.path}" if config.tokenizer.path else None)
    given = [f"tokenizer.{key}" for key in _TRAINING_TOKENIZER_KEYS
             if key in config.tokenizer.model_fields_set]
    if reused and given:
        lines.append(f"{' and '.join(given)} {'is' if len(given) == 1 else 'are'} ignored: "
                     f"{reused} brings its own tokenizer, vocabulary and all; remove "
                     f"{'it' if len(given) == 1 else 'them'} from the config")
    return lines


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML, defaults included: what actually ran."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
