"""Every TPU accelerator type tpuctl can plan for before a TPU exists: one versioned table.

    acc = accelerator("v5litepod-16")       # 16 chips on 4 hosts, TPU v5e
    runtime_for(acc, "jax")                 # "v2-alpha-tpuv5-lite": the base image it boots
    runtime_for(accelerator("v6e-8"), "tensorflow")   # UserError: "... set train.engine: jax"
    check_tf_route(acc, "tpu-vm-tf-2.18.0-pod-pjrt")  # UserError, one line naming what works
    check_zone(acc, "europe-west4-a")       # UserError listing the zones that offer v5e

At run time the TPU API's `networkEndpoints` is the truth about hosts; `host_mismatch` words the
report when it disagrees with this table.

The TensorFlow route (evidence and open points: docs/google-cloud.md, "TensorFlow on TPUs:
the route, and its evidence"): no `tpu-vm-tf-*` runtime carries the pinned TensorFlow, so every
worker gets a base image plus `tensorflow-tpu==TENSORFLOW_VERSION` and a pinned libtpu from pip, as
Google's own TF release CI does. On a multi-host slice the launcher starts the TPU worker server
that ships in that wheel (`start_grpc_tpu_worker`) on every host, and worker 0 drives the slice.
TPU v6e has no working TensorFlow route and is refused with one line naming what works.

Which engine runs where is decided here and nowhere else (`runtime_for`): `train.engine: jax`
runs on every generation in the table, on the base image Google's runtimes page names for JAX
(cloud.google.com/tpu/docs/runtimes, "PyTorch and JAX": tpu-ubuntu2204-base for v4 and older,
v2-alpha-tpuv5-lite for v5e, v2-alpha-tpuv5 for v5p, v2-alpha-tpuv6e for v6e); the launcher
installs its own Python and a locked jax[tpu] onto it (launcher.worker_python).
"""

from __future__ import annotations

from dataclasses import dataclass

from payload.core.engines import JAX, TENSORFLOW
from payload.core.errors import UserError

TABLE_VERSION = "2026-11-22"
# The TensorFlow every TPU worker runs (tensorflow-tpu from PyPI); must equal the pyproject pin.
TENSORFLOW_VERSION = "2.20.0"
TF_RUNTIME_PREFIX = "tpu-vm-tf-"


@dataclass(frozen=True, kw_only=True)
class Generation:
    name: str  # what Google's docs call it: v4, v5e, v5p, v6e
    prefix: str  # how accelerator types start: v4-8, v5litepod-16, ...
    cores_per_chip: int  # TensorCores; v4/v5p type names count these, v5e/v6e names count chips
    hbm_gib_per_chip: int
    peak_bf16_flops_per_chip: float
    sizes: tuple[int, ...]  # the numbers after the prefix that Google offers
    zones: tuple[str, ...]
    # Base images the TensorFlow route accepts, the default first; empty: no TensorFlow route.
    tf_runtimes: tuple[str, ...]
    # Base images the JAX route accepts, the default first: Google's runtimes page, "PyTorch
    # and JAX" (cloud.google.com/tpu/docs/runtimes).
    jax_runtimes: tuple[str, ...]
    tf_refusal: str = ""  # why there is no TensorFlow route, when there is none
    # Devices JAX shows per chip: one for every generation here but TPU7x, whose two
    # TensorCores are two devices (v4 and v5p join theirs as one megacore device).
    jax_devices_per_chip: int = 1
    # Data-center network (DCN) bandwidth per chip, Gbit/s, what slices of a multislice run
    # exchange gradients over (DCN_SOURCES); None where Google publishes no figure.
    dcn_gbps_per_chip: float | None = None
    # Whether several slices of the generation train as one job over DCN (MULTISLICE_SOURCE).
    multislice: bool = True

    def chips(self, size: int) -> int:
        return size // self.cores_per_chip

    def hosts(self, size: int) -> int:
        chips = self.chips(size)
        # v4/v5p hosts carry 4 chips. v5e/v6e: slices up to 8 chips are one VM (1, 4 or 8 chips);
        # larger slices are built from 4-chip VMs (v5e/v6e docs, "VM types").
        if self.name in ("v5e", "v6e") and chips <= 8:
            return 1
        return max(1, chips // 4)


# Peak compute, HBM, topologies: Google's system-architecture pages for each generation
# (cloud.google.com/tpu/docs/v4, v5e, v5p, v6e); host counts cross-checked against the explicit
# table in marin-community/levanter src/levanter/infra/ray_tpu.py. Zones: the regions-zones page
# (cloud.google.com/tpu/docs/regions-zones); the live list is ListAcceleratorTypes in the project.
GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation(
            name="v4",
            prefix="v4",
            cores_per_chip=2,
            hbm_gib_per_chip=32,
            peak_bf16_flops_per_chip=275e12,
            sizes=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
            zones=("us-central2-b",),
            # First the image Google's TF release CI runs v4-8 and v4-32 on (ml-auto-solutions
            # dags/solutions_team/solutionsteam_tf_release_supported.py); the docs' v4 base
            # image is still accepted.
            tf_runtimes=("v2-alpha-tpuv5", "tpu-ubuntu2204-base"),
            # The docs' image for v4 first; the v5p image that Google's CI boots v4 on works too
            # (the JAX route brings its own Python and packages to either).
            jax_runtimes=("tpu-ubuntu2204-base", "v2-alpha-tpuv5"),
        ),
        Generation(
            name="v5e",
            prefix="v5litepod",
            cores_per_chip=1,
            hbm_gib_per_chip=16,
            peak_bf16_flops_per_chip=197e12,
            sizes=(1, 4, 8, 16, 32, 64, 128, 256),
            zones=("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a", "europe-west4-b"),
            tf_runtimes=("v2-alpha-tpuv5-lite",),
            jax_runtimes=("v2-alpha-tpuv5-lite",),
            dcn_gbps_per_chip=25.0,
        ),
        Generation(
            name="v5p",
            prefix="v5p",
            cores_per_chip=2,
            hbm_gib_per_chip=95,
            peak_bf16_flops_per_chip=459e12,
            sizes=(8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288),
            zones=("us-central1-a", "us-east5-a", "europe-west4-b"),
            tf_runtimes=("v2-alpha-tpuv5",),
            jax_runtimes=("v2-alpha-tpuv5",),
            dcn_gbps_per_chip=50.0,
        ),
        Generation(
            name="v6e",
            prefix="v6e",
            cores_per_chip=1,
            hbm_gib_per_chip=32,
            peak_bf16_flops_per_chip=918e12,
            sizes=(1, 4, 8, 16, 32, 64, 128, 256),
            zones=(
                "us-central1-b",
                "us-east1-d",
                "us-east5-a",
                "us-east5-b",
                "europe-west4-a",
                "us-central1-ai1",
                "us-south1-ai1b",
            ),
            tf_runtimes=(),
            jax_runtimes=("v2-alpha-tpuv6e",),
            dcn_gbps_per_chip=100.0,
            tf_refusal=(
                "TensorFlow has no working route on TPU v6e (Google documents v6e for JAX and "
                "PyTorch only, and the TPU worker server in tensorflow-tpu "
                f"{TENSORFLOW_VERSION} does not know v6e)"
            ),
        ),
    )
}

# DCN bandwidth per chip (Generation.dcn_gbps_per_chip), from Google's system-architecture
# pages: v5p "Data center network (DCN) bandwidth per chip (Gbps): 50" (cloud.google.com/tpu/
# docs/v5p); v6e and TPU7x 100 Gbps per chip (.../v6e, .../tpu7x); v5e gives the pod's, "Data
# center network bandwidth per Pod: 6.4 Tbps" over 256 chips (and 2 x 100 Gbps NICs per 8-chip
# host): 25 per chip (.../v5e). The v4 page gives no DCN figure: the plan says so.
DCN_SOURCES = "Google's TPU system-architecture pages (v5e, v5p, v6e, tpu7x)"
# Multislice: "v4 and later" (cloud.google.com/tpu/docs/multislice-introduction); every
# generation in this table is, so none refuses it today, but the flag is where one would.
MULTISLICE_SOURCE = "cloud.google.com/tpu/docs/multislice-introduction"

# Base images by the generation they are built for (cloud.google.com/tpu/docs/runtimes).
_BASE_IMAGE_GENERATION = {
    "tpu-ubuntu2204-base": "v4",
    "v2-alpha-tpuv5": "v5p",
    "v2-alpha-tpuv5-lite": "v5e",
    "v2-alpha-tpuv6e": "v6e",
}


@dataclass(frozen=True, kw_only=True)
class Accelerator:
    name: str  # the accelerator type as the TPU API spells it
    generation: str
    chips: int
    hosts: int  # TPU VMs (workers) in the slice
    cores_per_chip: int
    hbm_gib_per_chip: int
    peak_bf16_flops_per_chip: float
    zones: tuple[str, ...]
    tf_supported: bool
    tf_runtime_single_host: str | None  # base image for a one-host slice on the TF route
    tf_runtime_pod: str | None  # base image for a multi-host slice (servers started by tpuctl)
    jax_devices_per_chip: int = 1
    dcn_gbps_per_chip: float | None = None  # the generation's (Generation.dcn_gbps_per_chip)
    multislice: bool = True

    @property
    def jax_devices(self) -> int:
        """What `jax.device_count()` is on the whole slice once it has formed."""
        return self.chips * self.jax_devices_per_chip

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def hbm_bytes_per_device(self) -> int:
        """The HBM one device holds: a chip's, shared by the devices it shows."""
        return (self.hbm_gib_per_chip << 30) // self.jax_devices_per_chip

    def in_words(self) -> str:
        """The slice's chips, their TensorCores and the devices those make, in the one
        vocabulary every plan, price and fit line uses ("device": what JAX counts, each holding
        a replica or a shard; "chip": what is priced), e.g. "8 chips of TPU tpu7x, 2 TensorCores
        each, one device per TensorCore: 16 devices"."""
        chips = f"{self.chips} chip{'s' if self.chips != 1 else ''} of TPU {self.generation}"
        cores = (f"{self.cores_per_chip} TensorCore{'s' if self.cores_per_chip != 1 else ''} "
                 "each")
        if self.cores_per_chip == 1:
            how = "one device per chip"
        elif self.jax_devices_per_chip == 1:
            how = "joined as one device per chip (megacore)"
        else:
            how = "one device per TensorCore"
        devices = f"{self.jax_devices} device{'s' if self.jax_devices != 1 else ''}"
        return f"{chips}, {cores}, {how}: {devices}"

    @property
    def is_multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def label(self) -> str:
        """What prices and plans call it (Topology.label for several slices)."""
        return self.name

    @property
    def peak_bf16_flops(self) -> float:
        return self.chips * self.peak_bf16_flops_per_chip


def _build(gen: Generation, size: int) -> Accelerator:
    runtime = gen.tf_runtimes[0] if gen.tf_runtimes else None
    return Accelerator(
        name=f"{gen.prefix}-{size}",
        generation=gen.name,
        chips=gen.chips(size),
        hosts=gen.hosts(size),
        cores_per_chip=gen.cores_per_chip,
        hbm_gib_per_chip=gen.hbm_gib_per_chip,
        peak_bf16_flops_per_chip=gen.peak_bf16_flops_per_chip,
        zones=gen.zones,
        tf_supported=bool(gen.tf_runtimes),
        # One base image serves both shapes: the pod difference is what tpuctl starts on it.
        tf_runtime_single_host=runtime,
        tf_runtime_pod=runtime,
        jax_devices_per_chip=gen.jax_devices_per_chip,
        dcn_gbps_per_chip=gen.dcn_gbps_per_chip,
        multislice=gen.multislice,
    )


ACCELERATORS: dict[str, Accelerator] = {
    acc.name: acc for gen in GENERATIONS.values() for acc in (_build(gen, s) for s in gen.sizes)
}


@dataclass(frozen=True, kw_only=True)
class Topology:
    """What a run trains on: `num_slices` identical slices of one type (`slice`), joined over
    the data-center network (DCN). The one answer to "how many chips" that prices, fit checks,
    plans, the strategy and the stages all take; one slice is the common case.

        top = Topology(slice=accelerator("v5litepod-16"), num_slices=2)
        top.chips, top.hosts, top.hosts_per_slice, top.jax_devices    # 32, 8, 4, 32
        top.label                                  # "2 slices of v5litepod-16"
        top.dcn_allreduce_s(4e9)                   # seconds to all-reduce 4 GB of gradients

    Inside a slice the chips talk over ICI; between slices only over DCN, so the JAX engine
    shards the state (FSDP) inside a slice and keeps the slices as data-parallel replicas.
    """

    slice: Accelerator
    num_slices: int = 1

    def __post_init__(self) -> None:
        if self.num_slices < 1:
            raise ValueError(f"num_slices {self.num_slices}: at least one slice")

    # -- the slice's own facts, the same on every slice
    @property
    def name(self) -> str:
        return self.slice.name

    @property
    def generation(self) -> str:
        return self.slice.generation

    @property
    def cores_per_chip(self) -> int:
        return self.slice.cores_per_chip

    @property
    def hbm_gib_per_chip(self) -> int:
        return self.slice.hbm_gib_per_chip

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.slice.hbm_bytes_per_device

    @property
    def peak_bf16_flops_per_chip(self) -> float:
        return self.slice.peak_bf16_flops_per_chip

    @property
    def hosts_per_slice(self) -> int:
        return self.slice.hosts

    @property
    def devices_per_slice(self) -> int:
        return self.slice.jax_devices

    # -- the whole run
    @property
    def chips(self) -> int:
        return self.slice.chips * self.num_slices

    @property
    def hosts(self) -> int:
        return self.slice.hosts * self.num_slices

    @property
    def jax_devices(self) -> int:
        return self.slice.jax_devices * self.num_slices

    @property
    def peak_bf16_flops(self) -> float:
        return self.slice.peak_bf16_flops * self.num_slices

    @property
    def label(self) -> str:
        """The slices by name: "v5litepod-16", or "2 slices of v5litepod-16"."""
        if self.num_slices == 1:
            return self.slice.name
        return f"{self.num_slices} slices of {self.slice.name}"

    def in_words(self) -> str:
        """Accelerator.in_words for every slice, e.g. "2 slices of 16 chips of TPU v5e, ...:
        16 devices each, 32 in all"."""
        if self.num_slices == 1:
            return self.slice.in_words()
        return (f"{self.num_slices} slices of {self.slice.in_words()} each, "
                f"{self.jax_devices} in all")

    def slice_of_host(self, host: int) -> int:
        """Which slice host `host` (0 .. hosts-1, slice by slice) belongs to."""
        return host // self.hosts_per_slice

    @property
    def dcn_bytes_per_s(self) -> float | None:
        """What one slice sends and receives over DCN per second: its chips' DCN bandwidth
        together; None where the table has no figure."""
        if self.slice.dcn_gbps_per_chip is None:
            return None
        return self.slice.chips * self.slice.dcn_gbps_per_chip * 1e9 / 8

    def dcn_words(self) -> str:
        """The slices' DCN bandwidth in words, with where the figure comes from."""
        per_chip = self.slice.dcn_gbps_per_chip
        if per_chip is None:
            return f"no DCN bandwidth for TPU {self.generation} in the accelerator table"
        return (f"{self.slice.chips} chips x {per_chip:g} Gbps = "
                f"{self.slice.chips * per_chip:,.0f} Gbps of DCN per slice ({DCN_SOURCES})")

    def dcn_allreduce_s(self, gradient_bytes: float) -> float | None:
        """Seconds one step's gradient all-reduce over DCN takes at the table's bandwidth: a
        ring over the slices moves gradient_bytes x 2(S-1)/S through each slice's links; 0 for
        one slice, None where the table has no DCN figure."""
        if self.num_slices == 1:
            return 0.0
        per_s = self.dcn_bytes_per_s
        if per_s is None:
            return None
        return gradient_bytes * 2 * (self.num_slices - 1) / self.num_slices / per_s


def topology_of(acc: Accelerator, num_slices: int = 1) -> Topology:
    """`num_slices` slices of `acc`, refused in one line where the generation has no multislice."""
    if num_slices > 1 and not acc.multislice:
        raise UserError(f"{num_slices} slices of TPU {acc.generation}: the generation does not "
                        "train over several slices (multislice needs TPU v4 or later)",
                        hint="set cluster.slices: 1, or use a v4, v5e, v5p or v6e type")
    return Topology(slice=acc, num_slices=num_slices)


def check_slices(num_slices: int, *, engine: str, hosts: int) -> None:
    """Refuse, in one line, slices that cannot train together: an engine that trains one slice
    only (TensorFlow drives one slice from its worker 0), or `hosts` (every slice's, or CPU
    workers standing for slices) that do not split into equal slices."""
    if num_slices == 1:
        return
    if engine != JAX:
        raise UserError(f"{num_slices} slices need train.engine: jax (the {engine} engine "
                        "trains on one slice, driven from its worker 0)",
                        hint="set train.engine: jax, or cluster.slices: 1")
    if hosts % num_slices:
        raise UserError(f"{num_slices} slices do not split {hosts} workers into equal "
                        "slices",
                        hint=f"use a number of workers divisible by {num_slices}")


def _family_summary() -> str:
    return ", ".join(f"{g.prefix}-{g.sizes[0]}..{g.prefix}-{g.sizes[-1]}" for g in GENERATIONS.values())


def accelerator(name: str) -> Accelerator:
    if name in ACCELERATORS:
        return ACCELERATORS[name]
    prefix, _, size = name.rpartition("-")
    gen = next((g for g in GENERATIONS.values() if g.prefix == prefix), None)
    if gen is None and prefix in GENERATIONS:  # "v5e-16": the docs' name, not the API's
        spelled = f"{GENERATIONS[prefix].prefix}-{size}"
        raise UserError(
            f"unknown accelerator type '{name}': the TPU API spells TPU {prefix} types "
            f"{GENERATIONS[prefix].prefix}-N",
            hint=f"did you mean {spelled}?",
        )
    if gen is not None:
        raise UserError(
            f"unknown accelerator type '{name}': TPU {gen.name} comes as "
            + ", ".join(f"{gen.prefix}-{s}" for s in gen.sizes),
            hint=f"pick one of those (table of {TABLE_VERSION})",
        )
    found = compute_slice_named(name)  # a Compute Engine slice's name (tpu7x-8): provider gce
    if found is not None:
        return found
    raise UserError(
        f"unknown accelerator type '{name}' (known: {_family_summary()})",
        hint="for example v4-8, v4-32, v5litepod-8 or v5litepod-16",
    )


def _alternatives(acc: Accelerator) -> list[str]:
    """Types with the same chip count on generations that have a TensorFlow route."""
    return [
        other.name
        for other in ACCELERATORS.values()
        if other.tf_supported and other.chips == acc.chips
    ]


def runtimes(acc: Accelerator, engine: str) -> tuple[str, ...]:
    """The base images `engine` accepts on this type, its default first; () where it has no
    route there."""
    gen = GENERATIONS[acc.generation]
    return {TENSORFLOW: gen.tf_runtimes, JAX: gen.jax_runtimes}[engine]


def engines_on(acc: Accelerator) -> tuple[str, ...]:
    """The engines that train on this type."""
    return tuple(engine for engine in (TENSORFLOW, JAX) if runtimes(acc, engine))


def _route_refusal(acc: Accelerator) -> UserError:
    gen = GENERATIONS[acc.generation]
    same_chips = _alternatives(acc)
    works = " or ".join(same_chips) if same_chips else "a v4 or v5litepod type"
    return UserError(
        f"{acc.name}: {gen.tf_refusal}; set train.engine: "
        + " or ".join(e for e in engines_on(acc) if e != TENSORFLOW),
        hint=f"or, to keep TensorFlow, use {works} ({acc.chips} chips)",
    )


def check_engine(acc: Accelerator, engine: str) -> None:
    """Refuse, in one line saying which engine to set, an engine without a route on the type."""
    if not runtimes(acc, engine):
        raise _route_refusal(acc)


def default_runtime(acc: Accelerator, engine: str = TENSORFLOW) -> str:
    """The runtime_version `engine` uses when the config leaves it out."""
    check_engine(acc, engine)
    return runtimes(acc, engine)[0]


def runtime_for(acc: Accelerator, engine: str, runtime_version: str | None = None) -> str:
    """The base image a TPU of this type boots for `engine`: `runtime_version` when the route
    accepts it, the route's default when it is None. The one place that decides which engine
    runs where; anything else is a one-line UserError naming what works."""
    if runtime_version is None:
        return default_runtime(acc, engine)
    {TENSORFLOW: check_tf_route, JAX: check_jax_route}[engine](acc, runtime_version)
    return runtime_version


def check_tf_route(acc: Accelerator, runtime_version: str) -> None:
    """Refuse, in one line naming what would work, a type/runtime pair the TF route cannot run."""
    default = default_runtime(acc)  # refuses a generation without a route
    accepted = GENERATIONS[acc.generation].tf_runtimes
    if runtime_version in accepted:
        return
    fix = f"set cluster.runtime_version: {default} (or leave it out)"
    if runtime_version.startswith(TF_RUNTIME_PREFIX):
        tf_version = runtime_version[len(TF_RUNTIME_PREFIX) :].split("-")[0]
        if acc.is_multi_host and "-pod" not in runtime_version:
            why = "and, not being a -pod image, serves nothing on the other hosts"
        elif acc.is_multi_host:
            why = f"and its hosts would serve TensorFlow {tf_version} to a {TENSORFLOW_VERSION} driver"
        else:
            why = "which the TPU build from pip would have to replace"
        raise UserError(
            f"runtime_version {runtime_version} preinstalls TensorFlow {tf_version}, not the "
            f"pinned {TENSORFLOW_VERSION}, {why}",
            hint=fix,
        )
    _refuse_base_image(acc, runtime_version, accepted, fix)


def check_jax_route(acc: Accelerator, runtime_version: str) -> None:
    """Refuse, in one line naming what would work, an image the JAX route does not take on
    this type: a TensorFlow image, or another generation's base image."""
    accepted = runtimes(acc, JAX)
    if runtime_version in accepted:
        return
    fix = f"set cluster.runtime_version: {accepted[0]} (or leave it out)"
    if runtime_version.startswith(TF_RUNTIME_PREFIX):
        raise UserError(
            f"runtime_version {runtime_version} is a TensorFlow image; train.engine: jax takes "
            f"the base image of TPU {acc.generation} (" + " or ".join(accepted) + ") and installs "
            "its own Python and jax[tpu] onto it",
            hint=fix,
        )
    _refuse_base_image(acc, runtime_version, accepted, fix)


def _refuse_base_image(acc: Accelerator, runtime_version: str, accepted: tuple[str, ...],
                       fix: str) -> None:
    built_for = _BASE_IMAGE_GENERATION.get(runtime_version)
    if built_for is not None:
        raise UserError(
            f"runtime_version {runtime_version} is the TPU {built_for} image; "
            f"{acc.name} (TPU {acc.generation}) needs " + " or ".join(accepted),
            hint=fix,
        )
    raise UserError(f"unknown runtime_version '{runtime_version}' for {acc.name}", hint=fix)


def larger_slices(name: str) -> tuple[tuple[str, int], ...]:
    """The TPU API's slices of type `name`'s generation with more chips, smallest first, as
    (type, devices): what a refusal that the model does not fit can name instead; () for a name
    outside the table."""
    try:
        here = accelerator(name)
    except UserError:  # a name outside the table: nothing to compare it with
        return ()
    generation = GENERATIONS.get(here.generation)
    if generation is None:
        return ()
    return tuple((f"{generation.prefix}-{size}",
                  generation.chips(size) * generation.jax_devices_per_chip)
                 for size in generation.sizes if generation.chips(size) > here.chips)


def zones_offering(acc: Accelerator) -> tuple[str, ...]:
    return acc.zones


def check_zone(acc: Accelerator, zone: str) -> None:
    """Refuse a zone outside every region the table lists for the type. Within such a region
    the table is not exhaustive (Google's docs list fewer zones than it sells in): the TPU API's
    own list decides there, when `tpuctl up` or `doctor` asks it."""
    if region_of(zone) not in {region_of(z) for z in acc.zones}:
        raise UserError(
            f"zone {zone} does not offer {acc.name} (TPU {acc.generation} zones: "
            + ", ".join(acc.zones)
            + ")",
            hint=f"table of {TABLE_VERSION}; `tpuctl doctor` asks the API for the live list",
        )


def region_of(zone: str) -> str:
    """us-central2-b -> us-central2; AI zones too (us-south1-ai1b -> us-south1)."""
    return zone.rsplit("-", 1)[0]


def host_mismatch(acc: Accelerator, num_endpoints: int) -> str | None:
    """The report line when the TPU API shows a different number of workers than the table."""
    if num_endpoints == acc.hosts:
        return None
    return (
        f"{acc.name}: the TPU API lists {num_endpoints} worker(s), the accelerator table "
        f"({TABLE_VERSION}) expects {acc.hosts}; using the API's {num_endpoints}"
    )


# -- Compute Engine TPU VMs (provider gce) ----------------------------------------------------
# On Compute Engine a TPU VM is an instance whose machine type carries the chips, and a slice is
# a machine type plus a topology: hosts = chips(topology) / chips per VM. Kept apart from the TPU
# API's accelerator types above: TPU7x exists only here ("the Cloud TPU API ... not supported on
# TPU7x and later", Google's TPU runtime docs), and v5e is offered only there.
#
# Machine types, chips per VM and topologies: AI-Hypercomputer/xpk
# src/xpk/core/system_characteristics.py @367c838 (get_tpu_system_characteristics_map and
# generate_tpu_topologies); ct6e-standard-8t (one 2x4 host) from Google's v6e page
# (cloud.google.com/tpu/docs/v6e, "VM types"). TPU7x peak, HBM and zones: Google's TPU7x page
# (docs.cloud.google.com/tpu/docs/tpu7x: 2 TensorCores, 2307 TFLOP/s bf16, 192 GiB HBM per chip;
# "TensorFlow is not supported") and regions-zones page (us-central1-c, us-central1-ai1a).
MACHINE_TABLE_VERSION = "2026-11-25"

TPU7X = Generation(
    name="tpu7x",
    prefix="tpu7x",
    cores_per_chip=2,
    hbm_gib_per_chip=192,
    peak_bf16_flops_per_chip=2307e12,
    sizes=(),  # not a TPU API type: its slices are machine type + topology (MACHINE_TYPES)
    zones=("us-central1-c", "us-central1-ai1a"),
    tf_runtimes=(),
    # No Cloud TPU API runtime: a Compute Engine VM boots Google's TPU OS image (COMPUTE_BOOT).
    jax_runtimes=(),
    tf_refusal="TensorFlow is not supported on TPU7x (Google documents JAX and PyTorch only)",
    jax_devices_per_chip=2,
    dcn_gbps_per_chip=100.0,
)


def _cube_topologies(max_cubes: int) -> tuple[str, ...]:
    """The 3-D topologies xpk lists for v5p and TPU7x: 2x2x1, 2x2x2, 2x2x4, 2x4x4, then AxBxC
    with A <= B <= C multiples of 4 up to 256 whose 4x4x4 cubes number at most `max_cubes`."""
    found = ["2x2x1", "2x2x2", "2x2x4", "2x4x4"]
    for x in range(4, 257, 4):
        for y in range(x, 257, 4):
            for z in range(y, 257, 4):
                if (x // 4) * (y // 4) * (z // 4) <= max_cubes:
                    found.append(f"{x}x{y}x{z}")
    return tuple(found)


@dataclass(frozen=True, kw_only=True)
class MachineType:
    """A Compute Engine machine type that carries TPU chips."""

    name: str  # tpu7x-standard-4t, ct6e-standard-4t, ct5p-hightpu-4t
    generation: Generation
    chips_per_vm: int
    topologies: tuple[str, ...]




@dataclass(frozen=True, kw_only=True)
class ComputeBoot:
    """A generation's boot disk on Compute Engine: Google's TPU OS image and the disk type."""

    image_family: str  # in TPU_IMAGE_PROJECT; `sourceImage` takes it as .../images/family/NAME
    disk_type: str  # what the generation's machine types take as a boot disk

    @property
    def image(self) -> str:
        return f"projects/{TPU_IMAGE_PROJECT}/global/images/family/{self.image_family}"


# A TPU VM on Compute Engine must boot an image that binds its TPU devices to vfio-pci and runs
# the TPU's boot-time tasks: Google builds and validates only its TPU-optimised Ubuntu images
# ("Use a custom OS image", cloud.google.com/tpu/docs/custom-os-image: every other image is the
# user's to make and test). Their families, in project ubuntu-os-accelerator-images, as Google's
# Compute Engine TPU pages create VMs from them: one Ubuntu 22.04 family for v5e, v5p and v6e, a
# 24.04 family for TPU7x. A family, not a dated image: each new build deprecates the older ones.
# Disk types: "TPU generation and supported disk types" (cloud.google.com/tpu/docs/storage-
# options): TPU7x and v6e take Hyperdisk Balanced (and Hyperdisk ML) only, v5p Balanced
# Persistent Disk. The default boot disk is 10 GB, too small for the JAX environment tpuctl
# installs (Python, jax[tpu], libtpu, TensorFlow for the input pipeline): BOOT_DISK_GB, as the
# Cloud TPU API gives its VMs.
TPU_IMAGE_PROJECT = "ubuntu-os-accelerator-images"
BOOT_DISK_GB = 100
_V5_V6_IMAGES = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
COMPUTE_BOOT: dict[str, ComputeBoot] = {
    "tpu7x": ComputeBoot(image_family="ubuntu-accel-2404-amd64-tpu-tpu7x",
                         disk_type="hyperdisk-balanced"),
    "v6e": ComputeBoot(image_family=_V5_V6_IMAGES, disk_type="hyperdisk-balanced"),
    "v5p": ComputeBoot(image_family=_V5_V6_IMAGES, disk_type="pd-balanced"),
}


def default_image(generation: str) -> str:
    """The boot image a Compute Engine TPU VM of this generation gets when cluster.image is
    left out: Google's TPU OS image family for it."""
    return COMPUTE_BOOT[generation].image


def image_note(image: str, generation: str) -> str | None:
    """Why `image` may boot a VM of this generation without its chips visible, in words; None
    for Google's TPU image of the generation (its family, or a dated image of that family)."""
    boot = COMPUTE_BOOT[generation]
    project, _, rest = image.removeprefix("projects/").partition("/global/images/")
    name = rest.removeprefix("family/")
    ours = image.startswith("projects/") and project == TPU_IMAGE_PROJECT
    if ours and (name == boot.image_family or name.startswith(f"{boot.image_family}-v")):
        return None
    others = sorted({b.image_family for g, b in COMPUTE_BOOT.items() if g != generation}
                    - {boot.image_family})
    if ours and any(name == f or name.startswith(f"{f}-v") for f in others):
        why = "is Google's TPU image for another generation"
    else:
        why = "is not one of Google's TPU images"
    return (f"cluster.image {image} {why}: a TPU {generation} VM sees its chips only where the "
            "image binds them to vfio-pci and runs the TPU's boot-time tasks (Google's custom "
            f"TPU image page); the default is {boot.image}")
_V6E_2D = ("4x4", "4x8", "8x8", "8x16", "16x16")
MACHINE_TYPES: dict[str, MachineType] = {
    m.name: m
    for m in (
        MachineType(name="tpu7x-standard-1t", generation=TPU7X, chips_per_vm=1,
                    topologies=("1x1x1",)),
        MachineType(name="tpu7x-standard-4t", generation=TPU7X, chips_per_vm=4,
                    topologies=_cube_topologies(144)),
        MachineType(name="ct6e-standard-1t", generation=GENERATIONS["v6e"], chips_per_vm=1,
                    topologies=("1x1",)),
        MachineType(name="ct6e-standard-4t", generation=GENERATIONS["v6e"], chips_per_vm=4,
                    topologies=("2x2", "2x4", *_V6E_2D)),
        MachineType(name="ct6e-standard-8t", generation=GENERATIONS["v6e"], chips_per_vm=8,
                    topologies=("2x4",)),
        MachineType(name="ct5p-hightpu-4t", generation=GENERATIONS["v5p"], chips_per_vm=4,
                    topologies=_cube_topologies(140)),
    )
}
# Machine types Google has for generations tpuctl runs through the TPU API instead.
_TPU_API_ONLY = {"ct5lp-hightpu-1t": "v5e", "ct5lp-hightpu-4t": "v5e", "ct5lp-hightpu-8t": "v5e",
                 "ct4p-hightpu-4t": "v4"}


def machine_type(name: str) -> MachineType:
    """The Compute Engine TPU machine type of that name; one line naming what exists if none."""
    if name in MACHINE_TYPES:
        return MACHINE_TYPES[name]
    if name in _TPU_API_ONLY:
        generation = GENERATIONS[_TPU_API_ONLY[name]]
        raise UserError(
            f"machine type {name} is TPU {generation.name}, which tpuctl runs through the Cloud "
            "TPU API, not as Compute Engine VMs",
            hint=f"use provider: gcp with accelerator_type {generation.prefix}-N",
        )
    raise UserError(
        f"unknown TPU machine type '{name}' (known: {', '.join(MACHINE_TYPES)})",
        hint=f"table of {MACHINE_TABLE_VERSION}; e.g. tpu7x-standard-4t or ct6e-standard-4t",
    )


def topology_chips(topology: str) -> int:
    product = 1
    for part in topology.split("x"):
        product *= int(part)
    return product


def _topology_summary(machine: MachineType) -> str:
    shown = machine.topologies[:8]
    more = len(machine.topologies) - len(shown)
    return ", ".join(shown) + (f" and {more} larger" if more > 0 else "")


def compute_slice(machine_type_name: str, topology: str) -> Accelerator:
    """The slice that `topology` on VMs of `machine_type_name` makes, as an Accelerator named
    as xpk and GKE name it (v6e-16, v5p-8, tpu7x-8: chips for v6e, TensorCores for the others)."""
    machine = machine_type(machine_type_name)
    gen = machine.generation
    if topology not in machine.topologies:
        raise UserError(
            f"topology {topology!r} does not exist for {machine.name} (TPU {gen.name}: "
            f"{_topology_summary(machine)})",
            hint=f"table of {MACHINE_TABLE_VERSION}, from xpk's system characteristics",
        )
    chips = topology_chips(topology)
    hosts = max(1, chips // machine.chips_per_vm)
    return Accelerator(
        name=f"{gen.prefix}-{chips * gen.cores_per_chip}",
        generation=gen.name,
        chips=chips,
        hosts=hosts,
        cores_per_chip=gen.cores_per_chip,
        hbm_gib_per_chip=gen.hbm_gib_per_chip,
        peak_bf16_flops_per_chip=gen.peak_bf16_flops_per_chip,
        zones=gen.zones,
        tf_supported=False,  # the gce route is JAX only
        tf_runtime_single_host=None,
        tf_runtime_pod=None,
        jax_devices_per_chip=gen.jax_devices_per_chip,
        dcn_gbps_per_chip=gen.dcn_gbps_per_chip,
        multislice=gen.multislice,
    )


def compute_slice_named(name: str) -> Accelerator | None:
    """A Compute Engine slice by its name (tpu7x-8), for a fleet's hardware spec: the smallest
    topology of the first machine type that gives that many cores; None if none does."""
    for machine in MACHINE_TYPES.values():
        for topology in machine.topologies:
            chips = topology_chips(topology)
            if f"{machine.generation.prefix}-{chips * machine.generation.cores_per_chip}" == name:
                return compute_slice(machine.name, topology)
    return None


def check_tpu_api(acc: Accelerator) -> None:
    """Refuse, for the TPU API (provider gcp), a slice that only Compute Engine offers."""
    if acc.generation not in GENERATIONS:
        raise UserError(
            f"{acc.name}: TPU {acc.generation} is offered only as Compute Engine VMs, not through "
            "the Cloud TPU API",
            hint="use provider: gce with machine_type and topology (e.g. tpu7x-standard-4t, 2x2x1)",
        )


# -- a slice's bring-up on Compute Engine VMs --------------------------------------------------
# libtpu forms a multi-host slice from facts a TPU-API VM reads in its `tpu-env` metadata
# (ACCELERATOR_TYPE, TOPOLOGY, HOST_BOUNDS, CHIPS_PER_HOST_BOUNDS, WRAP, WORKER_ID, and the
# workers in `worker-network-endpoints`); nothing shows Compute Engine publishing those for the
# VMs of a MIG. Where no metadata server carries them, libtpu takes them from its environment
# with TPU_SKIP_MDS_QUERY set: GKE's TPU device plugin sets exactly these variables on every TPU
# node (its InitEnvs table: TPU_ACCELERATOR_TYPE, TPU_TOPOLOGY, TPU_HOST_BOUNDS,
# TPU_CHIPS_PER_HOST_BOUNDS, TPU_TOPOLOGY_WRAP, TPU_TOPOLOGY_ALT, TPU_SKIP_MDS_QUERY), and GKE
# adds TPU_WORKER_ID and TPU_WORKER_HOSTNAMES per pod; torch_xla reads the same names when
# TPU_SKIP_MDS_QUERY is set (torch_xla/_internal/tpu.py, build_tpu_env_from_vars); JAX's own
# cluster detection takes TPU_WORKER_ID and TPU_WORKER_HOSTNAMES (jax/_src/clusters/
# cloud_tpu_cluster.py, GkeTpuCluster), though tpuctl names the coordinator, process count and
# index to jax.distributed itself. Worker ids are the launcher's worker order (the VMs by name):
# Compute Engine publishes no VM's place in the slice, GKE numbers its pods by index, and torch_xla
# notes that TPU device ids are independent of worker ids, so the order only has to be the same
# on every VM and equal JAX's process ids.
SLICE_ENV_NAMES = ("TPU_SKIP_MDS_QUERY", "TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY",
                   "TPU_HOST_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS", "TPU_TOPOLOGY_WRAP",
                   "TPU_TOPOLOGY_ALT", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES")
# Chips per VM as libtpu's per-host bounds (GKE's table: 1 chip 1,1,1; 4 chips 2,2,1; 8 chips
# 2,4,1).
_CHIPS_PER_HOST_BOUNDS = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}


def _wraps(dims: tuple[int, ...]) -> tuple[bool, bool, bool]:
    """Which axes of the slice close into a torus, as GKE's table has it: a 2-D slice (v5e,
    v6e) along each axis of 16 chips; a 3-D slice (v4, v5p, TPU7x) along every axis once each is
    a multiple of 4 (whole 4x4x4 cubes), along none before."""
    if len(dims) == 2:
        return (dims[0] == 16, dims[1] == 16, False)
    whole_cubes = all(d % 4 == 0 for d in dims)
    return (whole_cubes, whole_cubes, whole_cubes)


def slice_env(machine_type_name: str, topology: str, *, worker: int,
              hostnames: tuple[str, ...]) -> dict[str, str]:
    """What libtpu on one VM of a Compute Engine slice is told about the slice (see above):
    its type and topology, host and per-host bounds, wraparound, this VM's worker id and every
    VM's address in worker order."""
    machine = machine_type(machine_type_name)
    acc = compute_slice(machine_type_name, topology)
    if len(hostnames) != acc.hosts or not 0 <= worker < acc.hosts:
        raise ValueError(f"{acc.name} has {acc.hosts} hosts: worker {worker} of {hostnames}")
    dims = tuple(int(d) for d in topology.split("x"))
    padded = (*dims, 1) if len(dims) == 2 else dims
    per_host = _CHIPS_PER_HOST_BOUNDS[machine.chips_per_vm]
    hosts = tuple(d // p for d, p in zip(padded, per_host, strict=True))

    def words(values) -> str:
        return ",".join(str(v).lower() for v in values)

    return {"TPU_SKIP_MDS_QUERY": "true", "TPU_ACCELERATOR_TYPE": acc.name,
            "TPU_TOPOLOGY": topology, "TPU_HOST_BOUNDS": words(hosts),
            "TPU_CHIPS_PER_HOST_BOUNDS": words(per_host),
            "TPU_TOPOLOGY_WRAP": words(_wraps(dims)), "TPU_TOPOLOGY_ALT": "false",
            "TPU_WORKER_ID": str(worker), "TPU_WORKER_HOSTNAMES": ",".join(hostnames)}


# --- the slice as the TPU compiler sees it -------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CompileTopology:
    """A slice as `jax.experimental.topologies.get_topology_desc` takes it, to compile for it on
    a machine without a TPU (payload.engines.jax.tpu_compile)."""

    name: str  # "v5e:2x2", "v4:2x2x2", "tpu7x:2x2x1": libtpu's own names
    chip_config: str  # "default"; "megacore" where one device drives a chip's two cores (v4)
    chips_per_host_bounds: tuple[int, int, int]
    devices: int  # what jax.device_count() is on the slice
    num_slices: int = 1


# The default slice shape for a number of chips, as Google's pages give v5e/v6e (2-D) and v4/
# v5p (3-D) slices: cloud.google.com/tpu/docs/v5e ("v5litepod-16: 4x4"), .../v6e, .../v4
# ("v4-32: 2x2x4"), .../v5p. libtpu accepts these names (FINDINGS: v4:2x2x1, v5e:2x2, v5p:2x2x1,
# v6e:2x2, v6e:4x4, tpu7x:2x2x1 load).
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
              256: "16x16"}
_SHAPES_3D = {1: "1x1x1", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
              128: "4x4x8", 256: "4x8x8", 512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16",
              4096: "16x16x16", 6144: "16x16x24"}


def compile_topology(acc: Accelerator, topology: str | None = None, *,
                     num_slices: int = 1) -> CompileTopology:
    """The compiler's view of `num_slices` slices: `topology` where the config names one (a
    Compute Engine slice's cluster.topology), else the default shape of the accelerator type's
    chips."""
    two_d = acc.generation in ("v5e", "v6e")
    shape = topology or (_SHAPES_2D if two_d else _SHAPES_3D).get(acc.chips)
    if shape is None:
        raise UserError(f"{acc.name}: tpuctl knows no slice shape of {acc.chips} chips of TPU "
                        f"{acc.generation} to compile for",
                        hint="compile for one of the sizes in the accelerator table")
    per_host = acc.chips_per_host
    bounds = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}.get(per_host, (2, 2, 1))
    return CompileTopology(
        name=f"{acc.generation}:{shape}",
        chip_config="megacore" if acc.generation == "v4" else "default",
        chips_per_host_bounds=bounds,
        devices=acc.jax_devices * num_slices,
        num_slices=num_slices,
    )
