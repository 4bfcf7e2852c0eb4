"""Pure planning: which steps run on which workers, with which commands, environment and paths.

    plan = build_plan(config, workers, job_id="demo-20261121-010203", payload_digest=digest,
                      environment=env, hardware=CPU)
    print(render_plan(plan))        # what `tpuctl train --dry-run` shows
    Plan.from_json(plan.to_json()) == plan

Nothing here touches a file, a process or the network: the executors run what this module
describes, the same plan on local worker processes or on SSH hosts, and unit tests assert on it.
Every command is an argv tuple; `shell_line` quotes it with shlex, so no config value (a path
with spaces, quotes, `$(...)`, `;`) can change what runs.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import typing
from dataclasses import asdict, dataclass, field
from enum import Enum

from launcher.worker_python import WORKER_ROOT, Environment, EnvMode
from payload.cloud import stand_ins
from payload.core import layout
from payload.core.errors import UserError, counted
from payload.core.layout import worker_label
from payload.core.stages import PREFLIGHT, Stage
from payload.jobs.groups import FUNCTIONS, load_group
from payload.training import wandb_sink
from payload.training.strategy import Hardware, fleet_strategy, uses_tpu

ALL_STAGES = tuple(Stage)


STAGE_ENV = (
    ("PYTHONUNBUFFERED", "1"),  # lines reach the log (and the launcher) as they are printed
    ("TF_CPP_MIN_LOG_LEVEL", "2"),
    ("TF_USE_LEGACY_KERAS", "1"),
)
TPU_DEVICES = ("/dev/accel*", "/dev/vfio/*")
HUB_TOKEN_ENV = "HF_TOKEN"  # how huggingface_hub reads a token; the publish stage's only secret
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"  # where libtpu.so (its path is compiled in) locks the TPU
# A stand-in fleet (payload.cloud.stand_ins: tests' sshd workers) has no chips, and its workers
# share /proc with this machine, where any libtpu user (a `train --dry-run --compile`) holds
# LIBTPU_LOCKFILE: its free-tpu step looks for holders of files of its own, which only a test
# that means to hold them opens.
STAND_IN_TPU = "/tmp/tpuctl-stand-in-tpu"
STAND_IN_TPU_DEVICES = (f"{STAND_IN_TPU}/accel*",)
STAND_IN_LIBTPU_LOCKFILE = f"{STAND_IN_TPU}/libtpu_lockfile"


@dataclass(frozen=True, kw_only=True)
class Worker:
    index: int
    host: str  # where SSH connects ("localhost" for a local process)
    address: str  # where the other workers reach it (TF_CONFIG, the JAX coordinator)
    coordination_port: int
    ssh_port: int = 22
    # A local worker's own working directory; None for SSH workers (they start in $HOME).
    base_dir: str | None = None
    # What the TPU runtime on this worker is told about the slice it is part of, for the train
    # stage: set where the machine has no metadata saying it (a Compute Engine VM of a gce
    # slice: payload.cloud.accelerators.slice_env); empty where it has (a Cloud TPU VM).
    slice_env: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return worker_label(self.index)


@dataclass(frozen=True, kw_only=True)
class Command:
    worker: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    # Names of secrets (HF_TOKEN) the worker's agent adds to this command's environment from
    # what it was handed in memory at start (launcher.job_shell); never their values.
    secrets: tuple[str, ...] = ()

    def shell_line(self) -> str:
        """One shell line: `env K=V ... argv`, every word quoted."""
        words = [*(f"{k}={v}" for k, v in self.env), *self.argv]
        prefix = ["env"] if self.env else []
        return shlex.join([*prefix, *words])


@dataclass(frozen=True, kw_only=True)
class Step:
    name: str
    commands: tuple[Command, ...]
    # Run in the background on their workers while the step lasts (a pod slice's TPU servers).
    services: tuple[Command, ...] = ()

    @property
    def workers(self) -> tuple[int, ...]:
        return tuple(c.worker for c in self.commands)

    def command_for(self, worker: int) -> Command | None:
        return next((c for c in self.commands if c.worker == worker), None)

    def service_for(self, worker: int) -> Command | None:
        return next((c for c in self.services if c.worker == worker), None)


@dataclass(frozen=True, kw_only=True)
class JobPaths:
    """A job's files on one worker, relative to the worker's starting folder. Each worker has
    its own job folder, so workers that share a home (NFS) never share a pid, log or plan."""

    job_dir: str
    config: str
    agent_plan: str
    log: str
    pid: str
    rc: str
    payload_dir: str
    wheel: str


@dataclass(frozen=True, kw_only=True)
class NodeToDelete:
    """What worker 0 deletes when the job ends (`train --down`), checked by its unique id
    (payload.cloud.self_delete does it): a TPU node (api "tpu") or a slice's regional managed
    instance group (api "compute", in `region`)."""

    project: str
    zone: str
    name: str
    uid: str
    api_endpoint: str | None = None  # the API stand-in the launcher used (tests), or Google
    api: str = "tpu"
    region: str | None = None


@dataclass(frozen=True, kw_only=True)
class Limits:
    """train.max_hours / max_cost, which every worker's agent holds the whole job to
    (payload.cloud.budget), not only the training loop."""

    max_hours: float | None
    max_cost: float | None
    usd_per_hour: float | None  # None: no price (local and ssh runs)
    slices: int = 1  # usd_per_hour prices that many slices (payload.cloud.budget)


@dataclass(frozen=True, kw_only=True)
class Plan:
    job_id: str
    name: str
    output_dir: str
    hardware: Hardware
    workers: tuple[Worker, ...]
    steps: tuple[Step, ...]
    paths: tuple[JobPaths, ...]  # per worker, by index
    environment: Environment
    payload_digest: str
    # Where workers meet between steps: every worker writes its exit code here and waits for
    # the others. It lives under output_dir, which every worker can see.
    barrier_dir: str
    log_copies: tuple[str, ...] = field(default=())  # output_dir/logs/worker-N.log per worker
    # Workers beat a counter in barrier_dir this often; one silent for stale_after_s is dead.
    heartbeat_s: float = 5.0
    stale_after_s: float = 120.0
    delete_when_done: NodeToDelete | None = None
    limits: Limits | None = None
    # Run by the launcher on worker 0 before the job starts (payload.stages.preflight): the
    # newest checkpoint restored once, as --resume or the export would, and dropped.
    preflight: Command | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return _from_data(cls, json.loads(text))

    def coordination_port(self, worker: int) -> int | None:
        """The port this worker's training listens on for the others (None: none; TensorFlow's
        CPU workers each listen, a JAX run's coordinator is worker 0's)."""
        from payload.training.strategy import JAX_COORDINATOR_ENV

        train = next((s for s in self.steps if s.name == Stage.TRAIN.value), None)
        command = train.command_for(worker) if train else None
        env = dict(command.env) if command else {}
        if "TF_CONFIG" in env or (JAX_COORDINATOR_ENV in env and worker == 0):
            return self.workers[worker].coordination_port
        return None

    def coordination_label(self) -> str:
        """What listens on a worker's coordination port, as the dry run labels it: TensorFlow's
        collectives (`tf`) or the JAX coordinator (`jax-coordinator`)."""
        from payload.training.strategy import JAX_COORDINATOR_ENV

        train = next((s for s in self.steps if s.name == Stage.TRAIN.value), None)
        command = train.command_for(0) if train else None
        return ("jax-coordinator" if command and JAX_COORDINATOR_ENV in dict(command.env)
                else "tf")

    def secret_names(self, worker: int) -> tuple[str, ...]:
        """The secrets this worker's commands need, by name."""
        return tuple(sorted({name for step in self.steps for c in step.commands
                             if c.worker == worker for name in c.secrets}))

    def agent_plan(self, worker: int) -> dict:
        """What the agent on one worker needs: its commands per step, who to wait for."""
        return {
            "job_id": self.job_id,
            "worker": worker,
            "barrier_dir": self.barrier_dir,
            "output_dir": self.output_dir,
            # Worker 0 keeps the run lock (payload.jobs.runlock) beating and lets it go at the end.
            "holds_run_lock": worker == 0,
            "delete_when_done": (dataclasses.asdict(self.delete_when_done)
                                 if worker == 0 and self.delete_when_done else None),
            "coordination_port": self.coordination_port(worker),
            "log": self.paths[worker].log,
            "log_copy": self.log_copies[worker],
            "all_workers": [w.index for w in self.workers],
            # The agent reads its secrets from its standard input at start (launcher.job_shell).
            "secrets_on_stdin": bool(self.secret_names(worker)),
            "heartbeat_s": self.heartbeat_s,
            "stale_after_s": self.stale_after_s,
            "limits": dataclasses.asdict(self.limits) if self.limits else None,
            "steps": [
                {
                    "name": step.name,
                    "workers": list(step.workers),
                    "command": _spec(step.command_for(worker)),
                    "service": _spec(step.service_for(worker)),
                }
                for step in self.steps
            ],
        }


def _spec(command: Command | None) -> dict | None:
    if command is None:
        return None
    spec = {"argv": list(command.argv), "env": dict(command.env)}
    if command.secrets:
        spec["secrets"] = list(command.secrets)
    return spec


def parse_stages(text: str | None) -> tuple[Stage, ...]:
    """`--stages prepare,train` as stages in pipeline order."""
    if text is None:
        return ALL_STAGES
    names = [s.strip() for s in text.split(",") if s.strip()]
    valid = [s.value for s in ALL_STAGES]
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise UserError(f"--stages: unknown stage '{unknown[0]}'",
                        hint=f"choose from {', '.join(valid)}")
    if not names:
        raise UserError(f"--stages {text!r} names no stage", hint=f"choose from "
                        f"{', '.join(valid)}, or leave --stages out to run them all")
    return tuple(s for s in ALL_STAGES if s.value in names)


def job_paths(job_id: str, payload_digest: str, worker: int) -> JobPaths:
    job_dir = f"{WORKER_ROOT}/jobs/{job_id}/{worker_label(worker)}"
    payload_dir = f"{WORKER_ROOT}/payload/{payload_digest}"
    return JobPaths(
        job_dir=job_dir, config=f"{job_dir}/config.yaml", agent_plan=f"{job_dir}/agent.json",
        log=f"{job_dir}/worker.log", pid=f"{job_dir}/pid", rc=f"{job_dir}/rc",
        payload_dir=payload_dir, wheel=f"{job_dir}/payload.whl",
    )


def free_tpu_script(devices: tuple[str, ...] = TPU_DEVICES, lockfile: str = LIBTPU_LOCKFILE,
                    jobs_dir: str = f"{WORKER_ROOT}/jobs") -> str:
    """Shell that frees the TPU before training: it stops what earlier tpuctl jobs left holding
    it, refuses (one line, exit 1) when anything else holds it, then drops a stale libtpu lock.

    A crashed or detached earlier run keeps the chips open and the next one fails to start. A
    holder is an earlier job's when its process group is one recorded in a pid file under
    `jobs_dir`, identity checked (payload.jobs.groups); it is stopped if that job has ended (or its
    leader is gone), and refused while the job still runs. Anything else (another program, a
    notebook) is named with its pid and command, never signalled.
    """
    patterns = "|".join((*devices, lockfile))
    jobs = shlex.quote(jobs_dir)
    lock = shlex.quote(lockfile)
    return (
        FUNCTIONS
        + 'state() { sed "s/.*) //" "/proc/$1/stat" 2>/dev/null | cut -d" " -f1; }; '
        'mine=$(sed "s/.*) //" /proc/$$/stat | cut -d" " -f3); killed=""; busy=""; '
        'for p in /proc/[0-9]*; do hp=${p#/proc/}; [ "$hp" = "$$" ] && continue; held=""; '
        'for fd in "$p"/fd/*; do link=$(readlink "$fd" 2>/dev/null); '
        f'case "$link" in {patterns}) held=$link; break;; esac; done; '
        '[ -n "$held" ] || continue; '
        'hpg=$(sed "s/.*) //" "$p/stat" 2>/dev/null | cut -d" " -f3); '
        '[ -n "$hpg" ] && [ "$hpg" != "$mine" ] || continue; rec=""; '
        f'for f in {jobs}/*/worker-*/pid {jobs}/*/pid; do [ -f "$f" ] || continue; '
        + load_group("", word='"$f"')
        + '[ "$pg" = "$hpg" ] && ours && { rec=$f; break; }; done; '
        'if [ -n "$rec" ] && { [ -s "${rec%pid}rc" ] || [ ! -e "/proc/$pg" ]; }; then '
        'echo "tpuctl: stopping pid $hp, left holding $held by tpuctl job $tag"; '
        'kill -KILL -"$pg" 2>/dev/null; killed="$killed $hp"; '
        'elif [ -n "$rec" ]; then '
        'busy="$busy, pid $hp of tpuctl job $tag (still running: tpuctl stop ends it)"; '
        'else cmd=$(tr "\\000" " " < "$p/cmdline" 2>/dev/null | cut -c1-60); cmd=${cmd% }; '
        'busy="$busy, pid $hp ($cmd) holding $held"; fi; done; '
        'if [ -n "$busy" ]; then echo "tpuctl: the TPU is in use by${busy#,}: end that '
        '(kill PID) or wait for it, then run again" >&2; exit 1; fi; '
        'for k in $killed; do i=0; while [ -n "$(state "$k")" ] && [ "$(state "$k")" != Z ] '
        '&& [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; done; '
        f'if [ -e {lock} ]; then echo "tpuctl: removing stale {lockfile}"; rm -f {lock}; fi; '
        'true'
    )


def build_plan(
    config,
    workers: tuple[Worker, ...],
    *,
    job_id: str,
    payload_digest: str,
    environment: Environment,
    hardware: Hardware,
    stages: tuple[Stage, ...] = ALL_STAGES,
    resume: bool = False,
    new_data_order: bool = False,
    overwrite: bool = False,
    stage_entry: tuple[str, ...] = ("-m", "payload"),
    stale_after_s: float = 120.0,
    forward_env: tuple[tuple[str, str], ...] = (),
    hub_env: tuple[tuple[str, str], ...] = (),
    delete_when_done: NodeToDelete | None = None,
) -> Plan:
    """The whole job as data. `stage_entry` is how the interpreter starts a stage;
    `forward_env` is what every stage gets from the launcher's environment (with a stand-in
    cloud's endpoint in it the fleet has no TPU, as its stages read it: stand_ins.active),
    `hub_env` what the publish stage gets (HF_ENDPOINT; the token goes as a secret, by name)."""
    if not workers:
        raise UserError("no workers to run on", hint="use --workers 1 or more")
    if [w.index for w in workers] != list(range(len(workers))):
        raise ValueError("workers must be numbered 0..n-1 in order")
    paths = tuple(job_paths(job_id, payload_digest, w.index) for w in workers)
    n = len(workers)
    base_env = (*STAGE_ENV, ("PYTHONPATH", paths[0].payload_dir), *forward_env)
    flags = (*(("--resume",) if resume else ()), *(("--overwrite",) if overwrite else ()),
             *(("--new-data-order",) if new_data_order else ()))

    def stage(name: Stage, index: int, share: tuple[int, int] | None,
              extra_env: tuple[tuple[str, str], ...] = ()) -> Command:
        argv = [environment.python, *stage_entry, name.value, "--config", paths[index].config]
        if name is Stage.TRAIN:
            argv += ["--hardware", hardware.spec()]
        if share is not None:
            argv += ["--worker-index", str(share[0]), "--num-workers", str(share[1])]
        # The chief's training logs to Weights & Biases (train.wandb), with the key when set.
        wandb = name is Stage.TRAIN and index == 0 and config.train.wandb is not None
        return Command(worker=index, argv=(*argv, *flags), env=(*base_env, *extra_env),
                       secrets=(wandb_sink.API_KEY_ENV,) if wandb else ())

    steps: list[Step] = []
    wanted = set(stages)
    if Stage.TOKENIZER in wanted and config.trains_tokenizer:
        steps.append(Step(name=Stage.TOKENIZER.value,
                          commands=(stage(Stage.TOKENIZER, 0, None),)))
    if Stage.PREPARE in wanted:
        steps.append(Step(name=Stage.PREPARE.value,
                          commands=tuple(stage(Stage.PREPARE, w.index, (w.index, n))
                                         for w in workers)))
    if Stage.TRAIN in wanted:
        if uses_tpu(hardware):
            script = (free_tpu_script(STAND_IN_TPU_DEVICES, STAND_IN_LIBTPU_LOCKFILE)
                      if stand_ins.active(dict(forward_env)) else free_tpu_script())
            steps.append(Step(name="free-tpu", commands=tuple(
                Command(worker=w.index, argv=("sh", "-c", script)) for w in workers)))
        # The training stage's own rule decides who trains and how the trainers find each other.
        from payload.training import strategy

        engine = config.train.engine
        trainers = strategy.training_workers(hardware, n, engine)
        addresses = [f"{w.address}:{w.coordination_port}" for w in workers]
        servers = strategy.serves_tpu_runtime(hardware, n, engine)
        commands = []
        for index in trainers:
            extra = strategy.trainer_env(
                hardware, n, engine, addresses=addresses, index=index,
                coordinator_bind=getattr(config.cluster, "coordinator_bind", None))
            # Always the full count: on a pod slice worker 0 drives all n hosts.
            commands.append(stage(Stage.TRAIN, index, (index, n),
                                  (*extra, *workers[index].slice_env)))
        services = tuple(
            Command(worker=w.index, argv=(environment.python, "-m", "payload.cloud.tpu_server"),
                    env=base_env)
            for w in workers) if servers else ()
        steps.append(Step(name=Stage.TRAIN.value, commands=tuple(commands), services=services))
    if Stage.EXPORT in wanted:
        steps.append(Step(name=Stage.EXPORT.value, commands=(stage(Stage.EXPORT, 0, None),)))
    if Stage.PUBLISH in wanted and config.hub.repo:
        publish = stage(Stage.PUBLISH, 0, None, hub_env)
        steps.append(Step(name=Stage.PUBLISH.value, commands=(
            dataclasses.replace(publish, secrets=(HUB_TOKEN_ENV,)),)))
    elif Stage.PUBLISH in wanted and stages == (Stage.PUBLISH,):
        raise UserError("--stages publish: there is no Hub repository to publish to",
                        hint="pass --push-to-hub OWNER/NAME or set hub.repo")
    if not steps:
        raise UserError("nothing to run: the tokenizer stage is skipped when tokenizer.path or "
                        "model.init_from brings the tokenizer", hint="choose other --stages")
    preflight = None
    if (Stage.TRAIN in wanted and resume) or (Stage.EXPORT in wanted
                                              and Stage.TRAIN not in wanted):
        preflight = Command(worker=0, env=base_env, argv=(
            environment.python, *stage_entry, PREFLIGHT, "--config", paths[0].config,
            "--stages", ",".join(s.value for s in ALL_STAGES if s in wanted), *flags))


    return Plan(
        job_id=job_id, name=config.name, output_dir=config.output_dir, hardware=hardware,
        workers=workers, steps=tuple(steps), paths=paths, environment=environment,
        payload_digest=payload_digest,
        barrier_dir=layout.own_path(config.output_dir, layout.JOBS_DIR, job_id),
        log_copies=tuple(layout.log_path(config.output_dir, w.index) for w in workers),
        heartbeat_s=min(5.0, stale_after_s / 4), stale_after_s=stale_after_s,
        delete_when_done=delete_when_done, preflight=preflight,
        limits=(Limits(max_hours=config.train.max_hours, max_cost=config.train.max_cost,
                       usd_per_hour=config.cluster.hourly_usd(),
                       slices=config.cluster.slices)
                if config.train.max_hours is not None or config.train.max_cost is not None
                else None),
    )


def render_plan(plan: Plan) -> str:
    """The plan as `--dry-run` prints it: workers, environment, then each step's commands."""
    kind = fleet_strategy(plan.hardware, len(plan.workers)).value
    lines = [f"job {plan.job_id}  ({kind}, {counted(len(plan.workers), 'worker')}, hardware "
             f"{plan.hardware.spec()})", f"output_dir: {plan.output_dir}", "workers:"]
    for w in plan.workers:
        where = w.base_dir or f"{w.host}:{w.ssh_port} (home)"
        port = plan.coordination_port(w.index)
        listens = (f"  {plan.coordination_label()}={w.address}:{port}" if port is not None
                   else "")
        lines.append(f"  {w.label}: {where}{listens}")
    env = plan.environment
    lines += [f"environment: {env.mode.value} {env.python}  (key {env.key})",
              f"payload: {plan.paths[0].payload_dir}",
              f"job files: {plan.paths[0].job_dir.rsplit('/', 1)[0]}/worker-N/ (config.yaml, "
              "worker.log, pid, rc)"]
    if env.mode is EnvMode.EXISTING:
        lines.append(f"  set-up: check {env.python} has {' '.join(env.requirements)}")
    elif env.setup:
        lines.append(f"  set-up: {shlex.join(env.setup)}")
    if plan.preflight is not None:
        lines.append("before the job: the newest checkpoint restored once on worker 0 "
                     "(nothing written)")
        lines.append(f"  {worker_label(0)}$ {plan.preflight.shell_line()}")
    for number, step in enumerate(plan.steps, 1):
        lines.append(f"step {number}: {step.name} on workers "
                     f"{', '.join(str(w) for w in step.workers)}; then wait for all")
        for c in step.commands:
            handed = (f"   [+ {', '.join(c.secrets)}: in memory, from the launcher]"
                      if c.secrets else "")
            lines.append(f"  {worker_label(c.worker)}$ {c.shell_line()}{handed}")
        for c in step.services:
            lines.append(f"  {worker_label(c.worker)} (while it runs)$ {c.shell_line()}")
    return "\n".join(lines)


def _from_data(kind, data):
    """Rebuild a value of type `kind` from what `asdict` and JSON made of it: dataclasses field
    by field (by their type hints), tuples, enums and optional values."""
    if dataclasses.is_dataclass(kind):
        hints = typing.get_type_hints(kind)
        return kind(**{f.name: _from_data(hints[f.name], data[f.name])
                       for f in dataclasses.fields(kind) if f.name in data})
    args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_data(args[0], item) for item in data)
        return tuple(_from_data(a, item) for a, item in zip(args, data, strict=True))
    if args and type(None) in args:  # X | None
        inner = next(a for a in args if a is not type(None))
        return None if data is None else _from_data(inner, data)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(data)
    return data
