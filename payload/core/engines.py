"""Every fact about the training engines that needs no framework: one spec per engine.

    spec = engine_spec("jax")                 # engine_spec(None): the default, tensorflow
    spec.newest_step(output_dir)              # the newest complete checkpoint's step, no JAX
    spec.checkpoint_label(30)                 # "step 30": how a message names that checkpoint
    [engine_spec(name).extras for name in ENGINE_NAMES]   # what workers install: [('worker', 'tensorflow'), ...]

An engine's code is a folder, payload.engines.NAME, behind one interface (payload.engines), and
imports its framework. What the rest of tpuctl asks about an engine before or without that
framework lives here: the names (config's `train.engine` is tested against ENGINE_NAMES), the
default, which files of checkpoints/ are the engine's and which step is the newest, how a
message names a checkpoint, what `model.init_from` must bring, how the engine's processes share
a fleet, the packages it installs and its route onto a TPU VM, and what its training process
tells TensorFlow there. The names "tensorflow" and "jax" are spelled here alone.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

from payload.core import folders, layout, reading, storage
from payload.core.errors import UserError
from payload.core.pytorch_weights import TF_WEIGHTS, WEIGHTS

TENSORFLOW, JAX = "tensorflow", "jax"
DEFAULT = TENSORFLOW
WORKER_EXTRA = "worker"  # pyproject's extra of what every worker runs: the pipeline stages

# TensorFlow's own __init__ loads the library these name as a device plug-in, whatever build of
# TensorFlow it is (tensorflow/__init__.py: load_pluggable_device_library).
TF_PLUGGABLE_DEVICE_ENV = ("NEXT_PLUGGABLE_DEVICE_USE_C_API", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")
# Where Google's TensorFlow release tests take the libtpu builds made for TensorFlow, beside the
# package index (GoogleCloudPlatform/ml-auto-solutions, dags/solutions_team/configs/tensorflow/
# common.py, install_tf). Which libtpu is installed is not left to it: the route's lock says.
TPU_WHEELS_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
# The CPython the JAX route brings onto a TPU VM (the newest 3.11 the pinned uv knows; 3.11 is
# the Python the project's tests run JAX on; the Ubuntu 22.04 TPU images have 3.10, too old).
JAX_TPU_PYTHON = "3.11.18"


@dataclass(frozen=True, kw_only=True)
class TpuRoute:
    """What an engine's environment is made of on a TPU VM (launcher.worker_python installs it)."""

    lock: str  # the name of its exact lock in launcher.tpu_pins
    python: str | None  # the CPython it brings with uv; None: the image's own python3
    # Requirements installed as another distribution: TensorFlow as the route's build, always.
    renames: tuple[tuple[str, str], ...]
    find_links: tuple[str, ...] = ()

    @property
    def python_build(self) -> str | None:
        """uv's name for the CPython build (x86_64 glibc, as every TPU VM is)."""
        return f"cpython-{self.python}-linux-x86_64-gnu" if self.python else None


class EngineSpec:
    """What tpuctl knows of one engine without importing it. Each engine's facts below."""

    name: str
    implementation: str  # the module of its trainer and trained weights (payload.engines)
    framework: tuple[str, ...]  # the packages that module imports beside the base set
    extra: str  # the pyproject extra that installs them
    init_from_files: tuple[str, ...]  # what model.init_from may bring for it to read
    # Every training host is one process of one program, joined through process 0's
    # coordinator (JAX); else tf.distribute's way: a TPU slice driven from worker 0 while the
    # other hosts serve the TPU runtime, CPU workers joined by TF_CONFIG.
    one_program: bool
    tpu_route: TpuRoute
    bf16_on_cpu: str  # what train.bf16 does on CPU workers, in the run plan's words
    # What a CPU training process holds beyond the run plan's counts, as factors on the training
    # state and on the activations' floor, measured (payload.training.runplan.cpu_memory).
    cpu_memory_factors: tuple[float, float]

    def checkpoint_files(self, names: list[str]) -> list[str]:
        """Which of these paths under checkpoints/ are this engine's checkpoint files (what a
        fresh start may remove there, beside tpuctl's own), in the order to remove them: the
        files that make a checkpoint count (an index, a commit marker) first."""
        raise NotImplementedError

    def newest_step(self, output_dir: str) -> int | None:
        """The step of the newest complete checkpoint in output_dir/checkpoints/ (None without
        one), read without the framework: the launcher's pre-flight and the job agent ask."""
        raise NotImplementedError

    def checkpoint_path(self, output_dir: str, step: int) -> str:
        """The path of the checkpoint of `step` (its folder, or its files' prefix)."""
        raise NotImplementedError

    def checkpoint_label(self, step: int) -> str:
        """How a message names the checkpoint of `step`, as the engine's files do."""
        raise NotImplementedError

    def checkpoint_words(self, step: int) -> str:
        """How a stopped job's last line names the checkpoint it resumes from."""
        raise NotImplementedError

    def tensorflow_env_on_tpu(self, libtpu: str | None) -> dict[str, str]:
        """What a TPU host's training process tells TensorFlow before importing it."""
        raise NotImplementedError

    def plan_sharding(self, num_params: int, *, num_devices: int, hbm_bytes_per_chip: int,
                      optimizer: str, where: str = "", workload=None,
                      larger: tuple[tuple[str, int], ...] = (), num_slices: int = 1):
        """How the engine lays a model's training state over `num_devices` chips (a
        payload.core.fit.sharding.ShardingPlan: data parallel or FSDP over N, and with a
        `workload`, its activations and rematerialisation), None for an engine that only
        replicates it; a state or step no arrangement fits is a UserError saying what it needs
        and has, and what would fit. The run plan and the config check ask before anything
        runs. `num_slices`: the devices are that many slices joined over DCN."""
        return None

    def plan_lines(self, workload) -> list[str]:
        """What the run plan says of how the engine runs the step (which attention kernel each
        call takes, and why)."""
        return []

    def check_installed(self) -> None:
        """The engine's packages are in this Python: else one line saying how to get them (a
        run whose checkpoints say jax, exported where only the TensorFlow set is installed)."""
        missing = [name for name in self.framework if importlib.util.find_spec(name) is None]
        if missing:
            raise UserError(
                f"train.engine {self.name} needs {', '.join(missing)}, which this Python does "
                "not have",
                hint=f"pip install 'tpuctl[{self.extra}]' (tpuctl train installs it on workers "
                     "itself)")

    @property
    def extras(self) -> tuple[str, ...]:
        """The pyproject extras a worker installs for it: the stages' set and the engine's."""
        return tuple(dict.fromkeys((WORKER_EXTRA, self.extra)))


class TensorFlowSpec(EngineSpec):
    """transformers' TF classes under tf.distribute (TPU VMs up to v5p, CPU). Checkpoints are
    tf.train.CheckpointManager's files directly in checkpoints/: it writes a checkpoint's index
    and data files first and only then replaces the small `checkpoint` index file (atomically),
    so a crash mid-save leaves the index naming the previous checkpoint."""

    name = TENSORFLOW
    implementation = "payload.engines.tensorflow.engine"
    framework = ("tensorflow", "tf_keras")
    extra = "tensorflow"
    # transformers' own TF loader reads tf_model.h5; model.safetensors goes through the
    # PyTorch-name rule.
    init_from_files = (WEIGHTS, TF_WEIGHTS)
    one_program = False
    tpu_route = TpuRoute(lock="TPU_LOCK", python=None,
                         renames=(("tensorflow", "tensorflow-tpu"),), find_links=(TPU_WHEELS_INDEX,))
    # Its mixed_bfloat16 policy: bfloat16 products on CPU too.
    bf16_on_cpu = ("train.bf16 on CPU: TensorFlow runs bfloat16 products there, no faster than "
                   "float32; it pays on a TPU")
    cpu_memory_factors = (2.2, 2.5)

    INDEX = "checkpoint"
    # What the CheckpointManager ("ckpt" prefix) writes in the folder: the index and its
    # atomic-write temporaries, each checkpoint's index and data files and their temporaries,
    # the sharded save's `_temp` folder.
    _WRITTEN = re.compile(
        r"^(?:checkpoint(?:\.tmp[0-9a-f]{32})?"
        r"|ckpt-\d+(?:_temp/part-\d+-of-\d+)?\.(?:index|data-\d+-of-\d+)(?:\.tempstate\d+)?)\Z"
    )
    _NAMED = re.compile(r'^model_checkpoint_path: "(?:.*/)?ckpt-(\d+)"', re.MULTILINE)
    _LISTED = re.compile(r'^all_model_checkpoint_paths: "(?:.*/)?ckpt-(\d+)"', re.MULTILINE)

    def checkpoint_files(self, names: list[str]) -> list[str]:
        found = [n for n in names if self._WRITTEN.match(n.replace("\\", "/"))]
        # The index before the files it points to, so no reader follows it to a missing file.
        return sorted(found, key=lambda n: (n != self.INDEX, n))

    def index_path(self, output_dir: str) -> str:
        return storage.join(layout.checkpoints_dir(output_dir), self.INDEX)

    def listed_steps(self, output_dir: str) -> list[int]:
        """The steps of the checkpoints the index names, newest first: the one it calls the
        newest, then the older ones it still lists (whether their files are there or not)."""
        index = self.index_path(output_dir)
        if not storage.exists(index):
            return []
        text = reading.read_file(index, hint="restore checkpoints/ from a copy, or train again "
                                             "with --overwrite").decode("utf-8", "replace")
        named = self._NAMED.search(text)
        if not named:
            return []
        newest = int(named.group(1))
        older = {int(m.group(1)) for m in self._LISTED.finditer(text)} - {newest}
        return [newest, *sorted((s for s in older if s < newest), reverse=True)]

    def has_files(self, output_dir: str, step: int) -> bool:
        return storage.exists(self.checkpoint_path(output_dir, step) + ".index")

    def newest_step(self, output_dir: str) -> int | None:
        # The one the index names, unless that one's files were moved away and an older one it
        # lists still has its own (how a user sets aside a checkpoint that cannot be restored).
        steps = self.listed_steps(output_dir)
        if not steps:
            return None
        if len(steps) == 1 or self.has_files(output_dir, steps[0]):
            return steps[0]
        return next((s for s in steps[1:] if self.has_files(output_dir, s)), steps[0])

    def latest_checkpoint(self, output_dir: str) -> str | None:
        """The newest checkpoint's path (its prefix: DIR/ckpt-N) in a complete folder (None
        without one)."""
        if not (storage.exists(self.index_path(output_dir))
                and folders.is_complete(layout.checkpoints_dir(output_dir))):
            return None
        step = self.newest_step(output_dir)
        return None if step is None else self.checkpoint_path(output_dir, step)

    def checkpoint_path(self, output_dir: str, step: int) -> str:
        return storage.join(layout.checkpoints_dir(output_dir), self.checkpoint_label(step))

    def checkpoint_label(self, step: int) -> str:
        return f"ckpt-{step}"

    def checkpoint_words(self, step: int) -> str:
        return f"checkpoint {self.checkpoint_label(step)}"  # by the name its index gives it

    def tensorflow_env_on_tpu(self, libtpu: str | None) -> dict[str, str]:
        # One host: TensorFlow's pluggable-device C API pointed at the environment's libtpu.so,
        # as Google's TF release CI runs single hosts (ml-auto-solutions,
        # dags/solutions_team/configs/tensorflow/common.py).
        if libtpu is None:
            return {}
        return dict(zip(TF_PLUGGABLE_DEVICE_ENV, ("true", libtpu), strict=True))


class JaxSpec(EngineSpec):
    """The project's Flax models, jitted steps over a device mesh, Orbax checkpoints. Orbax
    writes each checkpoint as a folder named by its step directly in checkpoints/ (beside
    tpuctl's run.json and marker), built under a temporary name and finished by
    `commit_success.txt`: a step folder with its commit file is a checkpoint, anything else of
    Orbax's is a save cut short."""

    name = JAX
    implementation = "payload.engines.jax.engine"
    framework = ("jax", "flax", "optax", "orbax")
    extra = "jax"
    # PyTorch names only: see payload/engines/jax/pretrained.py for why not tf_model.h5.
    init_from_files = (WEIGHTS,)
    one_program = True
    # No TensorFlow: the stages' set needs none, so nothing but JAX's libtpu can open the chips.
    tpu_route = TpuRoute(lock="JAX_TPU_LOCK", python=JAX_TPU_PYTHON,
                         renames=(("jax", "jax[tpu]"),))
    # Its compute_dtype: float32 on CPU, where bfloat16 products are only slower.
    bf16_on_cpu = ("train.bf16 is ignored on CPU: the JAX engine computes in float32 there "
                   "(bfloat16 products are only slower on CPU); it applies on a TPU")
    # The new state is made beside the old one.
    cpu_memory_factors = (1.2, 1.9)

    COMMIT = "commit_success.txt"
    _STEP = re.compile(r"^\d+\Z")
    # A step folder or the temporary one a save builds it in, and anything inside.
    _WRITTEN = re.compile(r"^\d+(?:\.orbax-checkpoint-tmp[^/]*)?/.+\Z")

    def plan_sharding(self, num_params: int, *, num_devices: int, hbm_bytes_per_chip: int,
                      optimizer: str, where: str = "", workload=None,
                      larger: tuple[tuple[str, int], ...] = (), num_slices: int = 1):
        from payload.core.fit.sharding import plan_sharding

        return plan_sharding(num_params, num_devices=num_devices,
                             hbm_bytes_per_chip=hbm_bytes_per_chip, optimizer=optimizer,
                             where=where, workload=workload, larger=larger,
                             num_slices=num_slices)

    def plan_lines(self, workload) -> list[str]:
        # Which attention kernel each kind of attention call takes on the workload's platform.
        from payload.core.fit.sites import attention_plan

        return attention_plan(workload.architecture, platform=workload.platform,
                              generation=workload.generation, seq_len=workload.seq_len,
                              target_len=workload.target_len, bf16=workload.bf16)

    def checkpoint_files(self, names: list[str]) -> list[str]:
        found = [n for n in names if self._WRITTEN.match(n.replace("\\", "/"))]
        # The commit files first: a step stops counting before its data go.
        return sorted(found,
                      key=lambda n: (n.replace("\\", "/").split("/", 1)[1] != self.COMMIT, n))

    def newest_step(self, output_dir: str) -> int | None:
        commits = storage.glob(storage.join(layout.checkpoints_dir(output_dir), "*", self.COMMIT))
        steps = [int(step) for step in (path.replace("\\", "/").split("/")[-2]
                                        for path in commits) if self._STEP.match(step)]
        return max(steps) if steps else None

    def checkpoint_path(self, output_dir: str, step: int) -> str:
        return storage.join(layout.checkpoints_dir(output_dir), str(step))

    def checkpoint_label(self, step: int) -> str:
        return f"step {step}"

    def checkpoint_words(self, step: int) -> str:
        return f"checkpoint of step {step}"

    def tensorflow_env_on_tpu(self, libtpu: str | None) -> dict[str, str]:
        # The route's lock holds no TensorFlow and nothing on it imports TensorFlow; where a
        # Python of the user's own (cluster.python) holds it all the same, something that
        # imports it must never open the chips JAX's libtpu holds (with /tmp/libtpu_lockfile):
        # both variables are set empty, so that one left in the environment cannot make
        # TensorFlow load libtpu.so as a device plug-in.
        del libtpu
        return dict.fromkeys(TF_PLUGGABLE_DEVICE_ENV, "")


ENGINES: dict[str, EngineSpec] = {spec.name: spec for spec in (TensorFlowSpec(), JaxSpec())}
ENGINE_NAMES = tuple(ENGINES)


def engine_spec(name: str | None) -> EngineSpec:
    """The engine called `name` (None: the default); one line for a name that is none."""
    name = name or DEFAULT
    if name not in ENGINES:
        raise UserError(f"train.engine '{name}' is not an engine",
                        hint=f"use one of {', '.join(ENGINES)}")
    return ENGINES[name]


def newest_checkpoint(output_dir: str) -> tuple[EngineSpec, int] | None:
    """The engine and step of the newest checkpoint in output_dir/checkpoints/, whichever
    engine wrote it (None without one); no framework."""
    found = [(step, spec) for spec in ENGINES.values()
             if (step := spec.newest_step(output_dir)) is not None]
    if not found:
        return None
    step, spec = max(found, key=lambda pair: pair[0])
    return spec, step
