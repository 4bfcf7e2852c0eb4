"""Every TPU accelerator type tpuctl can plan for before a TPU exists: one versioned table.

    acc = accelerator("v5litepod-16")       # 16 chips on 4 hosts, TPU v5e
    runtime_for(acc, "jax")                 # "v2-alpha-tpuv5-lite": the base image it boots
    runtime_for(accelerator("v6e-8"), "tensorflow")   # UserError: "... set train.engine: jax"
    check_tf_route(acc, "tpu-vm-tf-2.18.0-pod-pjrt")  # UserError, one line naming what works
    check_zone(acc, "europe-west4-a")       # UserError listing the zones that offer v5e

At run time the TPU API's `networkEndpoints` is the truth about hosts; `host_mismatch` words the
report when it disagrees with this table.

The TensorFlow route (evidence and open points: the tf-on-tpu research note, which belongs in
the README's Google Cloud section): no `tpu-vm-tf-*` runtime carries the pinned TensorFlow, so every
worker gets a base image plus `tensorflow-tpu==TENSORFLOW_VERSION` and a pinned libtpu from pip, as
Google's own TF release CI does. On a multi-host slice the launcher starts the TPU worker server
that ships in that wheel (`start_grpc_tpu_worker`) on every host, and worker 0 drives the slice.
TPU v6e has no working TensorFlow route and is refused with one line naming what works.

Which engine runs where is decided here and nowhere else (`runtime_for`): `train.engine: jax`
runs on every generation in the table, on the base image Google's runtimes page names for JAX
(cloud.google.com/tpu/docs/runtimes, "PyTorch and JAX": tpu-ubuntu2204-base for v4 and older,
v2-alpha-tpuv5-lite for v5e, v2-alpha-tpuv5 for v5p, v2-alpha-tpuv6e for v6e); the launcher
installs its own Python and a locked jax[tpu] onto it (launcher.environment).
"""

from __future__ import annotations

from dataclasses import dataclass

from payload.core.errors import UserError

TABLE_VERSION = "2026-11-22"
# The TensorFlow every TPU worker runs (tensorflow-tpu from PyPI); must equal the pyproject pin.
TENSORFLOW_VERSION = "2.20.0"
TF_RUNTIME_PREFIX = "tpu-vm-tf-"
# train.engine's values (payload.engines.ENGINES names the same two).
TENSORFLOW, JAX = "tensorflow", "jax"


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
    # and JAX" (cloud.google.com/tpu/docs/runtimes; /work/shared/CLOUD-FACTS.md §1).
    jax_runtimes: tuple[str, ...]
    tf_refusal: str = ""  # why there is no TensorFlow route, when there is none

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
# (see /work/shared/CLOUD-FACTS.md §5); the live list is ListAcceleratorTypes in the project.
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
            tf_refusal=(
                "TensorFlow has no working route on TPU v6e (Google documents v6e for JAX and "
                "PyTorch only, and the TPU worker server in tensorflow-tpu "
                f"{TENSORFLOW_VERSION} does not know v6e)"
            ),
        ),
    )
}

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

    @property
    def chips_per_host(self) -> int:
        return self.chips // self.hosts

    @property
    def is_multi_host(self) -> bool:
        return self.hosts > 1

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
    )


ACCELERATORS: dict[str, Accelerator] = {
    acc.name: acc for gen in GENERATIONS.values() for acc in (_build(gen, s) for s in gen.sizes)
}


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


# TensorFlow's own __init__ loads the library these name as a device plug-in, whatever build of
# TensorFlow it is (tensorflow/__init__.py: load_pluggable_device_library).
TF_PLUGGABLE_DEVICE_ENV = ("NEXT_PLUGGABLE_DEVICE_USE_C_API", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")


def tensorflow_env_on_tpu(engine: str, libtpu: str | None) -> dict[str, str]:
    """What a TPU host's training process tells TensorFlow before importing it, by engine.

    TensorFlow route (one host): its pluggable-device C API pointed at the environment's
    libtpu.so, as Google's TF release CI runs single hosts (ml-auto-solutions,
    dags/solutions_team/configs/tensorflow/common.py). JAX route: TensorFlow is only the input
    library and must never open the chips JAX's libtpu holds (with /tmp/libtpu_lockfile): the
    route installs tensorflow-cpu, which has no TPU support of its own, and both variables are
    set empty, so that one left in the environment cannot make TensorFlow load the jax[tpu]
    environment's libtpu.so as a device plug-in. (TPU_LOAD_LIBRARY is read only by
    tensorflow-tpu's own loader, which that route does not install.)"""
    if engine == JAX:
        return dict.fromkeys(TF_PLUGGABLE_DEVICE_ENV, "")
    if libtpu is None:
        return {}
    return dict(zip(TF_PLUGGABLE_DEVICE_ENV, ("true", libtpu), strict=True))


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
