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

from launcher.agent import worker_label
from launcher.environment import WORKER_ROOT, Environment, EnvMode
from payload.errors import UserError
from payload.stages import Stage
from payload.strategy import Device, Hardware, fleet_strategy

ALL_STAGES = tuple(Stage)


STAGE_ENV = (
    ("PYTHONUNBUFFERED", "1"),  # lines reach the log (and the launcher) as they are printed
    ("TF_CPP_MIN_LOG_LEVEL", "2"),
    ("TF_USE_LEGACY_KERAS", "1"),
)
TPU_DEVICES = ("/dev/accel*", "/dev/vfio/*")
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"


@dataclass(frozen=True, kw_only=True)
class Worker:
    index: int
    host: str  # where SSH connects ("localhost" for a local process)
    address: str  # where the other workers reach it (TF_CONFIG)
    coordination_port: int
    ssh_port: int = 22
    # A local worker's own working directory; None for SSH workers (they start in $HOME).
    base_dir: str | None = None

    @property
    def label(self) -> str:
        return worker_label(self.index)


@dataclass(frozen=True, kw_only=True)
class Command:
    worker: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

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
    """A job's files on each worker, relative to the worker's starting folder."""

    job_dir: str
    config: str
    agent_plan: str
    log: str
    pid: str
    rc: str
    payload_dir: str
    wheel: str


@dataclass(frozen=True, kw_only=True)
class Plan:
    job_id: str
    name: str
    output_dir: str
    hardware: Hardware
    workers: tuple[Worker, ...]
    steps: tuple[Step, ...]
    paths: JobPaths
    environment: Environment
    payload_digest: str
    # Where workers meet between steps: every worker writes its exit code here and waits for
    # the others. It lives under output_dir, which every worker can see.
    barrier_dir: str
    log_copies: tuple[str, ...] = field(default=())  # output_dir/logs/worker-N.log per worker
    # Workers beat a counter in barrier_dir this often; one silent for stale_after_s is dead.
    heartbeat_s: float = 5.0
    stale_after_s: float = 120.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return _from_data(cls, json.loads(text))

    def agent_plan(self, worker: int) -> dict:
        """What the agent on one worker needs: its commands per step, who to wait for."""
        return {
            "job_id": self.job_id,
            "worker": worker,
            "barrier_dir": self.barrier_dir,
            "log": self.paths.log,
            "log_copy": self.log_copies[worker],
            "all_workers": [w.index for w in self.workers],
            "heartbeat_s": self.heartbeat_s,
            "stale_after_s": self.stale_after_s,
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
    return None if command is None else {"argv": list(command.argv), "env": dict(command.env)}


def parse_stages(text: str | None) -> tuple[Stage, ...]:
    """`--stages prepare,train` as stages in pipeline order."""
    if not text:
        return ALL_STAGES
    names = [s.strip() for s in text.split(",") if s.strip()]
    valid = [s.value for s in ALL_STAGES]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise UserError(f"--stages: unknown stage '{unknown[0] if unknown else text}'",
                        hint=f"choose from {', '.join(valid)}")
    return tuple(s for s in ALL_STAGES if s.value in names)


def job_paths(job_id: str, payload_digest: str) -> JobPaths:
    job_dir = f"{WORKER_ROOT}/jobs/{job_id}"
    payload_dir = f"{WORKER_ROOT}/payload/{payload_digest}"
    return JobPaths(
        job_dir=job_dir, config=f"{job_dir}/config.yaml", agent_plan=f"{job_dir}/agent.json",
        log=f"{job_dir}/worker.log", pid=f"{job_dir}/pid", rc=f"{job_dir}/rc",
        payload_dir=payload_dir, wheel=f"{payload_dir}.whl",
    )


def free_tpu_script(devices: tuple[str, ...] = TPU_DEVICES, lockfile: str = LIBTPU_LOCKFILE) -> str:
    """Shell that stops this user's processes holding the TPU, then drops a stale libtpu lock.

    A crashed or detached earlier run keeps the chips open and the next one fails to start.
    """
    patterns = "|".join(devices)
    return (
        'me=$(id -u); '
        'for p in /proc/[0-9]*; do pid=${p#/proc/}; '
        '[ "$pid" = "$$" ] && continue; '
        '[ "$(stat -c %u "$p" 2>/dev/null)" = "$me" ] || continue; '
        'for fd in "$p"/fd/*; do case "$(readlink "$fd" 2>/dev/null)" in '
        f'{patterns}) echo "tpuctl: stopping stale TPU holder $pid"; '
        'kill -9 "$pid" 2>/dev/null; break;; esac; done; done; '
        f'if [ -e {shlex.quote(lockfile)} ]; then echo "tpuctl: removing stale {lockfile}"; '
        f'rm -f {shlex.quote(lockfile)}; fi; true'
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
    overwrite: bool = False,
    stage_entry: tuple[str, ...] = ("-m", "payload"),
    stale_after_s: float = 120.0,
    forward_env: tuple[tuple[str, str], ...] = (),
) -> Plan:
    """The whole job as data. `stage_entry` is how the interpreter starts a stage;
    `forward_env` is what every stage gets from the launcher's environment."""
    if not workers:
        raise UserError("no workers to run on", hint="use --workers 1 or more")
    paths = job_paths(job_id, payload_digest)
    n = len(workers)
    base_env = (*STAGE_ENV, ("PYTHONPATH", paths.payload_dir), *forward_env)
    flags = (*(("--resume",) if resume else ()), *(("--overwrite",) if overwrite else ()))

    def stage(name: Stage, index: int, share: tuple[int, int] | None,
              extra_env: tuple[tuple[str, str], ...] = ()) -> Command:
        argv = [environment.python, *stage_entry, name.value, "--config", paths.config]
        if name is Stage.TRAIN:
            argv += ["--hardware", hardware.spec()]
        if share is not None:
            argv += ["--worker-index", str(share[0]), "--num-workers", str(share[1])]
        return Command(worker=index, argv=(*argv, *flags), env=(*base_env, *extra_env))

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
        if hardware.device is Device.TPU:
            steps.append(Step(name="free-tpu", commands=tuple(
                Command(worker=w.index, argv=("sh", "-c", free_tpu_script()))
                for w in workers)))
        # The training stage's own rule decides who trains and how CPU workers find each other.
        from payload import strategy

        trainers = strategy.training_workers(hardware, n)
        addresses = [f"{w.address}:{w.coordination_port}" for w in workers]
        pod = strategy.fleet_strategy(hardware, n) is strategy.StrategyKind.TPU_POD
        commands = []
        for index in trainers:
            extra: tuple[tuple[str, str], ...] = ()
            if pod:  # the driver reaches every host's TPU server, no TPU API needed
                extra = ((strategy.TPU_WORKERS_ENV, strategy.tpu_workers(addresses)),)
            elif len(trainers) > 1:  # several trainers: MultiWorkerMirroredStrategy
                extra = (("TF_CONFIG", strategy.tf_config(addresses, index)),)
            # Always the full count: on a pod slice worker 0 drives all n hosts.
            commands.append(stage(Stage.TRAIN, index, (index, n), extra))
        services = tuple(
            Command(worker=w.index, argv=(environment.python, "-m", "payload.tpu_server"),
                    env=base_env)
            for w in workers) if pod else ()
        steps.append(Step(name=Stage.TRAIN.value, commands=tuple(commands), services=services))
    if Stage.EXPORT in wanted:
        steps.append(Step(name=Stage.EXPORT.value, commands=(stage(Stage.EXPORT, 0, None),)))
    if not steps:
        raise UserError("nothing to run: the tokenizer stage is skipped when tokenizer.path or "
                        "model.init_from brings the tokenizer", hint="choose other --stages")

    from payload import storage  # pure path joining; no I/O

    return Plan(
        job_id=job_id, name=config.name, output_dir=config.output_dir, hardware=hardware,
        workers=workers, steps=tuple(steps), paths=paths, environment=environment,
        payload_digest=payload_digest,
        barrier_dir=storage.join(config.output_dir, ".tpuctl", "jobs", job_id),
        log_copies=tuple(storage.join(config.output_dir, "logs", f"{w.label}.log")
                         for w in workers),
        heartbeat_s=min(5.0, stale_after_s / 4), stale_after_s=stale_after_s,
    )


def render_plan(plan: Plan) -> str:
    """The plan as `--dry-run` prints it: workers, environment, then each step's commands."""
    kind = fleet_strategy(plan.hardware, len(plan.workers)).value
    lines = [f"job {plan.job_id}  ({kind}, {len(plan.workers)} workers, hardware "
             f"{plan.hardware.spec()})", f"output_dir: {plan.output_dir}", "workers:"]
    for w in plan.workers:
        where = w.base_dir or f"{w.host}:{w.ssh_port} (home)"
        lines.append(f"  {w.label}: {where}  tf={w.address}:{w.coordination_port}")
    env = plan.environment
    lines += [f"environment: {env.mode.value} {env.python}  (key {env.key})",
              f"payload: {plan.paths.payload_dir}",
              f"job files: {plan.paths.job_dir}/ (config.yaml, worker.log, pid, rc)"]
    if env.mode is EnvMode.EXISTING:
        lines.append(f"  set-up: check {env.python} has {' '.join(env.requirements)}")
    elif env.setup:
        lines.append(f"  set-up: {shlex.join(env.setup)}")
    for number, step in enumerate(plan.steps, 1):
        lines.append(f"step {number}: {step.name} on workers "
                     f"{', '.join(str(w) for w in step.workers)}; then wait for all")
        for c in step.commands:
            lines.append(f"  {worker_label(c.worker)}$ {c.shell_line()}")
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
