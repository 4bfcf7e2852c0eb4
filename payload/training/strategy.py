"""The one place that decides how training is distributed; nothing else branches on hardware.

    hardware = Hardware.parse("tpu/v4-32/my-run")          # what `--hardware` says
    plan = plan_strategy(cluster_facts(hardware, worker_index=0, num_workers=4))
    plan.kind, plan.tpu, plan.env, training_workers(hardware, 4)      # pure, unit-tested
    Hardware.parse("tpu/v5litepod-16/my-run,slices=2").slices        # 2 slices over DCN

The engines make the plan real (payload.engines.tensorflow.distribute.build_strategy); this
module imports no framework, so the launcher plans with it too.

The launcher's provider says what the fleet is (`Hardware`: CPU hosts, or a TPU node and its
type); it never says which provider it is. Four kinds of run follow from that:
- a single-host TPU VM: `TPUClusterResolver(tpu="local")`, with TensorFlow's pluggable-device C
  API pointed at the environment's libtpu.so, as Google's TF release CI runs single hosts;
- a multi-host pod slice: TensorFlow drives the whole slice from worker 0 by the TPU's name, with
  `TPU_LOAD_LIBRARY=0` so the driver does not grab the local chips; the other hosts only serve
  the TPU runtime (`"local"` is wrong there, Google's own CI runs TF pod jobs this way);
- one CPU process: the default strategy;
- N CPU processes: MultiWorkerMirroredStrategy from `TF_CONFIG`, which the caller (the launcher's
  local mode, or an SSH cluster) sets with every worker's address.
With `train.engine: jax` every host trains, one process each of one program (no driver, no TPU
servers), joined through process 0's coordinator (`TPUCTL_JAX_COORDINATOR`, set by the
launcher); a CPU fleet reduces over gloo, so the multi-host path runs on a laptop too.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field

from payload.core.engines import DEFAULT, engine_spec
from payload.core.errors import UserError
from payload.core.stages import check_share
from payload.training import coordinator

# A pod slice's driver reaches every host's TPU worker server at these grpc:// addresses (set by
# the launcher's plan on worker 0, as TF_CONFIG is for CPU workers).
TPU_WORKERS_ENV = "TPUCTL_TPU_WORKERS"
# On a TPU one host call runs this many steps: the host loop is not the bottleneck. It is capped
# by the events (eval, checkpoint, log) the loop has to stop for.
TPU_STEPS_PER_EXECUTION = 100


# A multi-process JAX run's coordinator, "HOST:PORT" (worker 0's per-job coordination port),
# set by the launcher's plan on every worker as TF_CONFIG is for TensorFlow's CPU workers.
JAX_COORDINATOR_ENV = "TPUCTL_JAX_COORDINATOR"
# What worker 0 alone is told to choose where the coordinator listens (payload.training.
# coordinator): the other workers' hosts, comma-separated, and cluster.coordinator_bind, if set.
JAX_PEERS_ENV = "TPUCTL_JAX_PEERS"
JAX_BIND_ENV = "TPUCTL_JAX_BIND"
# Several slices over the data-center network: what JAX and libtpu read on every host (jax's
# cloud_tpu_cluster reads them from the environment before a TPU VM's tpu-env metadata). A
# queued resource of several nodes writes them into tpu-env; Compute Engine MIGs and CPU
# workers get them from nobody else, so the launcher sets all four on every host, the same
# everywhere. The port is the one Ray and Levanter set (xpk's pods take 8080): libtpu's
# multislice service on slice 0's worker 0.
MEGASCALE_PORT = 8081
MEGASCALE_NAMES = ("MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES",
                   "MEGASCALE_SLICE_ID", "MEGASCALE_PORT")


class StrategyKind(enum.Enum):
    TPU_HOST = "tpu-host"  # single-host TPU VM
    TPU_POD = "tpu-pod"  # multi-host pod slice (TensorFlow: driven from worker 0)
    CPU = "cpu"  # one process, default strategy
    CPU_MULTI_WORKER = "cpu-multi-worker"  # TensorFlow: MultiWorkerMirroredStrategy; JAX: gloo


class Device(str, enum.Enum):
    """What a fleet's hosts compute with."""

    CPU = "cpu"
    TPU = "tpu"


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """What the fleet is made of, as the launcher's provider reports it: the one vocabulary for
    hardware. It reaches every stage as `--hardware SPEC`; the strategy decides from it alone.

    `cpu`, or `tpu/ACCELERATOR_TYPE/NODE_NAME` (the node name drives a multi-host slice), with
    `,slices=N` when the fleet is N slices (of that type; on CPU, N equal groups of workers
    standing for slices) joined over the data-center network.
    """

    device: Device = Device.CPU
    accelerator_type: str | None = None
    tpu_name: str | None = None
    slices: int = 1

    @classmethod
    def tpu(cls, accelerator_type: str, tpu_name: str, *, slices: int = 1) -> Hardware:
        return cls(device=Device.TPU, accelerator_type=accelerator_type, tpu_name=tpu_name,
                   slices=slices)

    def spec(self) -> str:
        base = (Device.CPU.value if self.device is Device.CPU
                else f"{Device.TPU.value}/{self.accelerator_type}/{self.tpu_name}")
        return base if self.slices == 1 else f"{base},slices={self.slices}"

    @classmethod
    def parse(cls, spec: str) -> Hardware:
        base, _, extra = spec.partition(",")
        slices = 1
        if extra:
            key, _, count = extra.partition("=")
            if key != "slices" or not count.isdigit() or int(count) < 1:
                raise UserError(f"--hardware {spec!r}: {extra!r} is not slices=N",
                                hint="e.g. tpu/v5litepod-16/my-run,slices=2")
            slices = int(count)
        parts = base.split("/")
        if parts == [Device.CPU.value]:
            return cls(slices=slices)
        if len(parts) == 3 and parts[0] == Device.TPU.value and all(parts[1:]):
            return cls.tpu(parts[1], parts[2], slices=slices)
        raise UserError(f"--hardware {spec!r} is not a hardware spec",
                        hint="use cpu, or tpu/ACCELERATOR_TYPE/NODE_NAME (e.g. tpu/v4-32/my-run)")


CPU = Hardware()


def uses_tpu(hardware: Hardware) -> bool:
    """Whether the fleet computes on TPU chips: the launcher then frees the chips before training
    and installs the TPU runtime; everything else follows from the strategy kind."""
    return hardware.device is Device.TPU


def tpu_topology(hardware: Hardware):
    """A TPU fleet's slices as the accelerator table sees them (payload.cloud.accelerators.
    Topology: chips, peak, generation, slices); None on CPU hosts, whose speed is measured
    rather than looked up."""
    if not uses_tpu(hardware):
        return None
    from payload.cloud import accelerators

    return accelerators.topology_of(accelerators.accelerator(hardware.accelerator_type),
                                    hardware.slices)


def fleet_strategy(hardware: Hardware, num_workers: int) -> StrategyKind:
    """How a fleet of `num_workers` hosts of this hardware trains, as a whole."""
    if hardware.device is Device.TPU:
        return StrategyKind.TPU_HOST if num_workers == 1 else StrategyKind.TPU_POD
    return StrategyKind.CPU if num_workers == 1 else StrategyKind.CPU_MULTI_WORKER


@dataclass(frozen=True, kw_only=True)
class ClusterFacts:
    """What the plan depends on, gathered once from the command line and the environment."""

    hardware: Hardware = CPU
    num_workers: int
    worker_index: int = 0
    tf_config: str | None = None  # the TF_CONFIG environment variable, if set
    tpu_workers: str | None = None  # TPUCTL_TPU_WORKERS: the slice's grpc:// endpoints
    stand_in: bool = False  # the cloud API is a stand-in (stand_ins.active): train on the CPU
    libtpu: str | None = None  # this environment's libtpu.so, when the libtpu package is there
    engine: str = DEFAULT  # train.engine
    jax_coordinator: str | None = None  # TPUCTL_JAX_COORDINATOR: process 0's HOST:PORT
    jax_peers: tuple[str, ...] = ()  # TPUCTL_JAX_PEERS (process 0): the other workers' hosts
    jax_bind: str | None = None  # TPUCTL_JAX_BIND (process 0): cluster.coordinator_bind
    tpu_present: bool = False  # this host has TPU device files


@dataclass(frozen=True, kw_only=True)
class StrategyPlan:
    kind: StrategyKind
    runs_training: bool  # False: this host only serves the TPU runtime for worker 0
    tpu: str | None = None  # TPUClusterResolver's `tpu` argument
    env: dict[str, str] = field(default_factory=dict)  # set before TensorFlow is imported
    steps_per_execution: int = 1
    is_chief: bool = True  # writes checkpoints, logs, metrics and the export
    stand_in: bool = False  # no TPU to be found is expected: fall back to the CPU
    # JAX: every training host is one process of one program; process 0 serves `coordinator`.
    coordinator: str | None = None
    coordinator_peers: tuple[str, ...] = ()  # process 0: the other workers' hosts
    coordinator_bind: str | None = None  # process 0: cluster.coordinator_bind
    num_processes: int = 1
    process_id: int = 0
    # Slices joined over the data-center network (Hardware.slices): the JAX mesh's outer axis.
    num_slices: int = 1


def plan_strategy(facts: ClusterFacts) -> StrategyPlan:
    from payload.cloud.accelerators import check_slices

    check_share(facts.worker_index, facts.num_workers)
    check_slices(facts.hardware.slices, engine=facts.engine, hosts=facts.num_workers)
    kind = fleet_strategy(facts.hardware, facts.num_workers)
    spec = engine_spec(facts.engine)
    if spec.one_program:
        return _one_program_plan(facts, kind)
    if kind is StrategyKind.TPU_HOST:
        # TensorFlow's pluggable-device C API pointed at the environment's libtpu
        # (payload.core.engines: tensorflow_env_on_tpu says why and where that comes from).
        env = {} if facts.stand_in else spec.tensorflow_env_on_tpu(facts.libtpu)
        return StrategyPlan(kind=kind, runs_training=True, tpu="local", env=env,
                            steps_per_execution=TPU_STEPS_PER_EXECUTION,
                            stand_in=facts.stand_in)
    if kind is StrategyKind.TPU_POD:
        chief = facts.worker_index == 0
        return StrategyPlan(
            kind=kind,
            runs_training=chief,
            # The hosts' own servers, when the launcher listed them: no TPU API call needed.
            tpu=facts.tpu_workers or facts.hardware.tpu_name,
            env={"TPU_LOAD_LIBRARY": "0"} if chief else {},
            steps_per_execution=TPU_STEPS_PER_EXECUTION,
            is_chief=chief,
            stand_in=facts.stand_in,
        )
    if kind is StrategyKind.CPU:
        return StrategyPlan(kind=kind, runs_training=True)
    task = _tf_config_task(facts.tf_config, facts.num_workers)
    return StrategyPlan(kind=kind, runs_training=True, is_chief=task == 0)


def _one_program_plan(facts: ClusterFacts, kind: StrategyKind) -> StrategyPlan:
    """JAX: every host trains, as one process of one program (no driver host, no TPU servers);
    several hosts join through process 0's coordinator, which the launcher names."""
    n, index = facts.num_workers, facts.worker_index
    if n > 1 and not facts.jax_coordinator:
        raise UserError(
            f"{n} JAX workers need {JAX_COORDINATOR_ENV} (worker 0's HOST:PORT)",
            hint="run through `tpuctl train`, which sets it on every worker",
        )
    on_tpu = kind in (StrategyKind.TPU_HOST, StrategyKind.TPU_POD)
    env = {}
    if on_tpu:
        # The route installs no TensorFlow; where the worker's Python holds it anyway, it must
        # not load libtpu and hold the chips JAX computes on.
        env["TPU_LOAD_LIBRARY"] = "0"
        env.update(engine_spec(facts.engine).tensorflow_env_on_tpu(facts.libtpu))
        if facts.stand_in and not facts.tpu_present:
            # The cloud API is a stand-in (tests): no TPU by design, JAX computes on the CPU.
            env["JAX_PLATFORMS"] = "cpu"
    return StrategyPlan(
        kind=kind, runs_training=True, env=env,
        steps_per_execution=TPU_STEPS_PER_EXECUTION if on_tpu else 1,
        is_chief=index == 0, stand_in=facts.stand_in,
        coordinator=facts.jax_coordinator if n > 1 else None, num_processes=n,
        process_id=index, coordinator_peers=facts.jax_peers, coordinator_bind=facts.jax_bind,
        num_slices=facts.hardware.slices,
    )


def jax_coordinator(addresses: list[str]) -> str:
    """The TPUCTL_JAX_COORDINATOR value: worker 0's HOST:PORT (`addresses` in worker order)."""
    return addresses[0]


def _tf_config_task(tf_config: str | None, num_workers: int) -> int:
    if not tf_config:
        raise UserError(
            f"{num_workers} CPU workers need TF_CONFIG with every worker's address",
            hint="run through `tpuctl train --local`, or set TF_CONFIG as TensorFlow documents",
        )
    try:
        raw = json.loads(tf_config)
        workers = raw["cluster"]["worker"]
        index = int(raw["task"]["index"])
    except (ValueError, KeyError, TypeError):
        raise UserError(
            "TF_CONFIG is not valid JSON with cluster.worker and task.index",
            hint='e.g. {"cluster": {"worker": ["h0:p", "h1:p"]}, '
            '"task": {"type": "worker", "index": 0}}',
        ) from None
    if len(workers) != num_workers:
        raise UserError(
            f"TF_CONFIG lists {len(workers)} workers but --num-workers is {num_workers}",
            hint="make them agree",
        )
    return index


def tf_config(addresses: list[str], index: int) -> str:
    """The `TF_CONFIG` value for worker `index` of a CPU multi-worker run (the launcher sets it;
    `addresses` are every worker's host:port for TensorFlow's collectives, in worker order)."""
    return json.dumps(
        {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}}
    )


def tpu_workers(addresses: list[str]) -> str:
    """The TPUCTL_TPU_WORKERS value: every host's TPU worker server, worker 0 first, in the form
    TPUClusterResolver takes instead of a TPU name."""
    return ",".join(f"grpc://{address}" for address in addresses)


def training_workers(hardware: Hardware, num_workers: int, engine: str = DEFAULT) -> list[int]:
    """Which workers run the train stage (the launcher waits on these, not on TPU servers):
    every one, but worker 0 alone on a TensorFlow pod slice."""
    if serves_tpu_runtime(hardware, num_workers, engine):
        return [0]
    return list(range(num_workers))


def serves_tpu_runtime(hardware: Hardware, num_workers: int, engine: str = DEFAULT) -> bool:
    """Whether the hosts run TPU worker servers for a driver (TensorFlow on a pod slice)."""
    return (not engine_spec(engine).one_program
            and fleet_strategy(hardware, num_workers) is StrategyKind.TPU_POD)


def trainer_env(hardware: Hardware, num_workers: int, engine: str, *, addresses: list[str],
                index: int, coordinator_bind: str | None = None
                ) -> tuple[tuple[str, str], ...]:
    """What the launcher tells training worker `index` so the trainers find each other
    (`addresses`: every worker's HOST:PORT, in worker order): a pod slice's driver the hosts'
    TPU servers, one program's processes worker 0's coordinator (and worker 0 the others' hosts
    and `coordinator_bind`, to choose where it listens), TensorFlow's CPU workers TF_CONFIG;
    nothing to a lone trainer."""
    if serves_tpu_runtime(hardware, num_workers, engine):  # no TPU API needed
        return ((TPU_WORKERS_ENV, tpu_workers(addresses)),)
    if len(training_workers(hardware, num_workers, engine)) < 2:
        return ()
    if engine_spec(engine).one_program:
        env = [(JAX_COORDINATOR_ENV, jax_coordinator(addresses))]
        if index == 0:
            env.append((JAX_PEERS_ENV, ",".join(
                coordinator.split_address(a)[0] for a in addresses[1:])))
            if coordinator_bind:
                env.append((JAX_BIND_ENV, coordinator_bind))
        return (*env, *megascale_env(hardware.slices, addresses=addresses, index=index))
    return (("TF_CONFIG", tf_config(addresses, index)),)


def megascale_env(slices: int, *, addresses: list[str], index: int
                  ) -> tuple[tuple[str, str], ...]:
    """The four MEGASCALE variables for worker `index` of `slices` slices (none for one):
    workers are numbered slice by slice, so worker i is on slice i // (workers per slice), and
    slice 0's worker 0 (addresses[0]'s host) coordinates."""
    if slices == 1:
        return ()
    per_slice = len(addresses) // slices
    host = coordinator.split_address(addresses[0])[0]
    return (("MEGASCALE_COORDINATOR_ADDRESS", host), ("MEGASCALE_NUM_SLICES", str(slices)),
            ("MEGASCALE_SLICE_ID", str(index // per_slice)),
            ("MEGASCALE_PORT", str(MEGASCALE_PORT)))


def cluster_facts(
    hardware: Hardware, *, worker_index: int, num_workers: int,
    environ: dict[str, str] | None = None, libtpu: str | None = None,
    engine: str = DEFAULT,
) -> ClusterFacts:
    from payload.cloud import stand_ins

    environ = os.environ if environ is None else environ
    return ClusterFacts(hardware=hardware, num_workers=num_workers, worker_index=worker_index,
                        tf_config=environ.get("TF_CONFIG"),
                        tpu_workers=environ.get(TPU_WORKERS_ENV) or None,
                        stand_in=stand_ins.active(environ),
                        libtpu=libtpu or _libtpu_library(), engine=engine,
                        jax_coordinator=environ.get(JAX_COORDINATOR_ENV) or None,
                        jax_peers=tuple(p for p in environ.get(JAX_PEERS_ENV, "").split(",") if p),
                        jax_bind=environ.get(JAX_BIND_ENV) or None,
                        tpu_present=uses_tpu(hardware) and tpu_devices_present())


def _libtpu_library() -> str | None:
    """The libtpu.so of the libtpu package in this Python, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("libtpu")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(folder, "libtpu.so")
        if os.path.isfile(path):
            return path
    return None


TPU_DEVICE_GLOBS = ("/dev/accel*", "/dev/vfio/[0-9]*")


def tpu_devices_present() -> bool:
    """Whether this host has TPU chips (the device files a TPU VM has)."""
    import glob

    return any(glob.glob(pattern) for pattern in TPU_DEVICE_GLOBS)
