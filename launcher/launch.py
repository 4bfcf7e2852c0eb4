"""The train use-case and the jobs it leaves: work out a run, start it, reopen it later.

    from launcher.plan import render_plan
    launch = plan_train(Path("tpuctl.yaml"), local=True, num_workers=2, stages=ALL_STAGES,
                        resume=False, overwrite=False)
    print(render_plan(launch.plan))                   # `--dry-run` stops here
    with start(launch, on_event=progress) as job:     # check, ship, record, submit
        outcome = follow(job, sink=print_line)
    with open_job(Path("tpuctl.yaml"), job_id=None) as job:   # logs, stop, status, ssh
        stop_job(job)

Nothing here prints: progress goes to the caller's `on_event(worker, message)` and log lines to
its `sink(worker_index, line)`. The provider (launcher.providers) says where the workers are;
a job is reopened from its record, never from the config as it reads now.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher import records, run, ship
from launcher.environment import plan_environment
from launcher.plan import ALL_STAGES, Plan, Stage, Worker, build_plan
from launcher.providers import Fleet, Provider, provider_for, reopen
from payload import tpu_api
from payload.errors import UserError

# Test hook: run stages as `PYTHON FILE STAGE ...` instead of `PYTHON -m payload STAGE ...`.
STAGE_ENTRY_ENV = "TPUCTL_STAGE_ENTRY"
# How long workers wait on a silent peer before ending the job themselves (default 120 s).
PEER_TIMEOUT_ENV = "TPUCTL_PEER_TIMEOUT_S"


def load(config_path: Path):
    from payload.config import load_config

    return load_config(config_path)


@dataclass(frozen=True, kw_only=True)
class Launch:
    """Everything `train` will do, worked out before anything is touched."""

    config: object  # the RunConfig as the workers see it
    plan: Plan
    provider: Provider
    fleet: Fleet
    wheel: bytes
    wheelhouse: tuple[str, str] | None  # (folder, digest)
    stages: tuple[Stage, ...] = ALL_STAGES
    resume: bool = False
    overwrite: bool = False


@dataclass
class Job:
    """A started or reopened job: its record, plan, provider and an open executor."""

    record: records.JobRecord
    plan: Plan
    provider: Provider
    executor: object
    set_up: list[str] = field(default_factory=list)  # what shipping had to do (payload, env)

    def close(self) -> None:
        self.executor.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def peer_timeout_s() -> float:
    raw = os.environ.get(PEER_TIMEOUT_ENV, "120")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise UserError(f"{PEER_TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return value


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def plan_train(config_path: Path, *, local: bool, num_workers: int | None,
               stages: tuple[Stage, ...], resume: bool, overwrite: bool,
               dry_run: bool = False) -> Launch:
    """Everything `train` will do, as data; reads files and picks ports, writes nothing. A dry
    run asks no one where the workers are (a cloud's are placeholders from its table)."""
    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other",
                        hint="--resume continues the checkpoints, --overwrite starts again over "
                        "them: pass one")
    provider = provider_for(load(config_path), local_override=local, num_workers=num_workers)
    config = provider.worker_config(load(config_path))
    fleet = provider.planned_fleet() if dry_run else provider.fleet()
    cluster = config.cluster
    python = cluster.python or (fleet.python if not cluster.wheelhouse else None)
    wheelhouse = ((cluster.wheelhouse, ship.wheelhouse_digest(cluster.wheelhouse))
                  if cluster.wheelhouse else None)
    wheel = ship.wheel_bytes()
    from payload.strategy import Device

    environment = plan_environment(
        python=python, wheelhouse_digest=wheelhouse[1] if wheelhouse else None,
        requirements=ship.worker_requirements(), tpu=fleet.hardware.device is Device.TPU)
    entry = os.environ.get(STAGE_ENTRY_ENV)
    the_plan = build_plan(
        config, fleet.workers, job_id=new_job_id(config.name),
        payload_digest=ship.payload_digest(wheel), environment=environment,
        hardware=fleet.hardware, stages=stages, resume=resume, overwrite=overwrite,
        stage_entry=(entry,) if entry else ("-m", "payload"), stale_after_s=peer_timeout_s(),
        forward_env=tpu_api.forwarded_env())
    return Launch(config=config, plan=the_plan, provider=provider, fleet=fleet, wheel=wheel,
                  wheelhouse=wheelhouse, stages=stages, resume=resume, overwrite=overwrite)


def check_before_start(launch: Launch) -> None:
    """What the stages would refuse, refused before anything starts, where the launcher sees
    what the workers see (local workers share its disk and credentials)."""
    if launch.fleet.shares_launcher_machine:
        from payload.preflight import check_before_start as stages_would_refuse

        stages_would_refuse(launch.config, stages=launch.stages, resume=launch.resume,
                            overwrite=launch.overwrite)


def _refuse_if_running(executor, base: Path, name: str, workers: tuple[Worker, ...]) -> None:
    """The run's current job must not still be running on these workers."""
    try:
        previous = records.current_job(base, name).plan()
    except (UserError, OSError, ValueError, KeyError, TypeError):
        return
    if [w.host for w in previous.workers] != [w.host for w in workers]:
        return
    if any(s["state"] == "running" for s in run.status(executor, previous)):
        raise UserError(f"job {previous.job_id} of run '{name}' is still running",
                        hint="watch it with `tpuctl logs` or end it with `tpuctl stop`")


def start(launch: Launch, *, on_event: Callable[[Worker, str], None] = lambda w, m: None,
          on_note: Callable[[str], None] = lambda m: None) -> Job:
    """Check, stage inputs, ship, record and submit: the job runs detached on every worker when
    this returns. `on_event` hears shipping per worker, `on_note` the rest."""
    from payload.config import dump_config

    check_before_start(launch)
    launch = dataclasses.replace(launch, config=launch.provider.stage_inputs(launch.config,
                                                                             on_note))
    base = records.state_dir()
    the_plan = launch.plan
    executor = launch.provider.connect(the_plan.workers)
    try:
        _refuse_if_running(executor, base, launch.config.name, the_plan.workers)
        wheel = ship.write_wheel(base / "wheels", launch.wheel)
        done = ship.ship(executor, the_plan.workers, the_plan.environment, the_plan.paths, wheel,
                         wheelhouse=launch.wheelhouse, on_event=on_event)
        run.check_shared_output(executor, the_plan)
        record = records.save_job(base, the_plan, dump_config(launch.config),
                                  launch.provider.reach(launch.fleet))
        run.submit(executor, the_plan, record)
    except BaseException:
        executor.close()
        raise
    set_up = sorted({k for d in done for k, v in d.items() if v})
    return Job(record=record, plan=the_plan, provider=launch.provider, executor=executor,
               set_up=set_up)


def open_job(config_path: Path, job_id: str | None) -> Job:
    """A job of the config's run (the newest unless `job_id`), reopened from its record."""
    record = records.current_job(records.state_dir(), load(config_path).name, job_id)
    the_plan = record.plan()
    provider = reopen(record.reach(), the_plan.workers)
    workers = provider.fleet().workers  # a cloud provider re-resolves addresses here
    the_plan = dataclasses.replace(the_plan, workers=workers)
    return Job(record=record, plan=the_plan, provider=provider,
               executor=provider.connect(workers))


def cluster_provider(config_path: Path) -> Provider:
    """The provider of the config's cluster (for up, down and status)."""
    return provider_for(load(config_path))


def open_cluster(config_path: Path) -> tuple[tuple[Worker, ...], object]:
    """The workers `tpuctl ssh` talks to and an executor for them: the current job's (from its
    record), or the config's cluster's before any job exists."""
    try:
        job = open_job(config_path, None)
        return job.plan.workers, job.executor
    except records.NoJob:
        provider = provider_for(load(config_path))
        workers = provider.fleet().workers
        return workers, provider.connect(workers)


def only(the_plan: Plan, workers: tuple[Worker, ...]) -> Plan:
    return dataclasses.replace(the_plan, workers=tuple(workers))


def follow(job: Job, sink: Callable[[int, str], None], *, worker: int | None = None,
           keep_following: bool = True, from_start: bool = True) -> run.Outcome:
    """Stream the job's logs (all workers, or one) until it ends; fail-fast over all workers."""
    chosen = job.plan.workers if worker is None else (select(job.plan.workers, worker),)
    book = run.LogBook(job.record, chosen, from_start=from_start)
    try:
        return run.watch(job.executor, only(job.plan, chosen), book, sink,
                         follow=keep_following, fail_fast=keep_following and worker is None,
                         trouble=job.provider.trouble)
    finally:
        book.close()


def select(workers: tuple[Worker, ...], index: int, *, of: str = "the job") -> Worker:
    """The worker --worker names, or a one-line error listing the valid range."""
    if not 0 <= index < len(workers):
        raise UserError(f"--worker {index}: {of} has workers 0..{len(workers) - 1}")
    return workers[index]


def stop_job(job: Job) -> dict[int, str]:
    return run.stop(job.executor, job.plan)


def job_status(job: Job) -> list[dict]:
    return run.status(job.executor, job.plan)
