"""The train use-case and the jobs it leaves: work out a run, start it, reopen it later.

    from launcher.plan import render_plan
    launch = plan_train(Path("tpuctl.yaml"), TrainOptions(local=True, num_workers=2))
    print(render_plan(launch.plan))                   # `--dry-run` stops here
    job = start(launch, on_event=progress)            # check, stage, ship, record, submit
    job, outcome = follow_to_end(launch, job, sink=print_line)   # recovers preemptions
    with open_job(Path("tpuctl.yaml"), job_id=None) as job:   # logs, stop, status, ssh
        stop_job(job)

Nothing here prints: progress goes to the caller's `on_event(worker, message)` and log lines to
its `sink(worker_index, line)`. The provider (launcher.providers) says where the workers are;
a job is reopened from its record, never from the config as it reads now.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher import estimate, hub, job_control, records, ship, view
from launcher.plan import ALL_STAGES, Plan, Stage, Worker, build_plan
from launcher.providers import Fleet, Provider, provider_for, reopen
from launcher.worker_python import plan_environment
from payload.cloud import stand_ins
from payload.core import folders, layout, storage
from payload.core.errors import UserError, UserErrors, error_lines
from payload.training import wandb_sink

if TYPE_CHECKING:
    from launcher.executors import Executor
    from launcher.hub import HubAccess
    from payload.config import RunConfig


# Test hook: run stages as `PYTHON FILE STAGE ...` instead of `PYTHON -m payload STAGE ...`.
STAGE_ENTRY_ENV = "TPUCTL_STAGE_ENTRY"
# How long workers wait on a silent peer before ending the job themselves (default 120 s).
PEER_TIMEOUT_ENV = "TPUCTL_PEER_TIMEOUT_S"


def load(config_path: Path, *, engine: str | None = None) -> RunConfig:
    from payload.config import load_config

    return load_config(config_path, engine=engine)


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """What `tpuctl train` was asked for on its command line."""

    local: bool = False
    num_workers: int | None = None  # --workers (local only)
    stages: tuple[Stage, ...] = ALL_STAGES
    resume: bool = False
    overwrite: bool = False
    new_data_order: bool = False  # a resume may continue in another seed's or data's order
    dry_run: bool = False
    down: bool = False  # delete the TPU when the job ends, even with no launcher watching
    auto_resume: int = 0  # preemptions to recover from
    max_hours: float | None = None  # override train.max_hours
    max_cost: float | None = None  # override train.max_cost
    push_to_hub: str | None = None  # override hub.repo: publish model/ there after export
    engine: str | None = None  # override train.engine (--engine): the run's framework
    download: Path | None = None  # copy model/ into this local folder when the job has finished


@dataclass(frozen=True, kw_only=True)
class Launch:
    """Everything `train` will do, worked out before anything is touched."""

    config: RunConfig  # as the workers see it
    plan: Plan
    provider: Provider
    fleet: Fleet
    wheel: bytes
    wheelhouse: tuple[str, str] | None  # (folder, digest)
    options: TrainOptions = TrainOptions()
    config_path: Path = Path("tpuctl.yaml")
    started_from: str = ""  # user@host:config, as the run lock names the job to others
    hub: HubAccess | None = None  # when the run publishes (checked; holds the token)


@dataclass
class Job:
    """A started or reopened job: its record, plan, provider and an open executor."""

    record: records.JobRecord
    plan: Plan
    provider: Provider
    executor: Executor
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


def _with_limits(config: RunConfig, options: TrainOptions):
    """The config with --max-hours / --max-cost in place of train.max_hours / max_cost, checked
    as if the file said so."""
    overrides = {k: v for k, v in (("max_hours", options.max_hours),
                                   ("max_cost", options.max_cost)) if v is not None}
    if not overrides:
        return config
    from payload.config import parse_config

    # What the file set, not its defaults too: what the file itself says stays readable
    # (payload.config.ignored_settings).
    raw = config.model_dump(mode="json", exclude_unset=True)
    raw["train"].update(overrides)
    return parse_config(raw, source="--max-hours/--max-cost")


def plan_train(config_path: Path, options: TrainOptions) -> Launch:
    """Everything `train` will do, as data; reads files and picks ports, writes nothing. A dry
    run asks no one where the workers are (a cloud's are placeholders from its table)."""
    if options.download is not None:  # before anything else: a refusal here costs nothing
        check_download_target(options.download)
    if options.resume and options.overwrite:
        raise UserError("--resume and --overwrite contradict each other",
                        hint="--resume continues the checkpoints, --overwrite starts again over "
                        "them: pass one")
    if options.auto_resume < 0:
        raise UserError(f"--auto-resume {options.auto_resume}: give how many preemptions to "
                        "recover from (0 or more)")
    loaded = load(config_path, engine=options.engine)
    provider = provider_for(loaded, local_override=options.local,
                            num_workers=options.num_workers)
    config = _with_limits(provider.worker_config(loaded), options)
    if options.push_to_hub:
        from payload.config import with_hub_repo

        config = with_hub_repo(config, options.push_to_hub)
    fleet = provider.planned_fleet() if options.dry_run else provider.fleet()
    from payload.config import check_stages

    # What the plan cannot do is collected, with what the stages would refuse below, so that
    # every problem is reported in one round.
    problems = []
    for check in (lambda: estimate.refuse_unsplittable_batch(config, fleet, options.stages),
                  lambda: estimate.refuse_unholdable_state(config, fleet, options.stages),
                  lambda: estimate.refuse_unfit_memory(config, fleet, options.stages),
                  lambda: check_stages(config, options.stages)):
        try:
            check()
        except UserError as exc:
            problems.append(exc)
    cluster = config.cluster
    python = cluster.python or (fleet.python if not cluster.wheelhouse else None)
    wheelhouse = ((cluster.wheelhouse, ship.wheelhouse_digest(cluster.wheelhouse))
                  if cluster.wheelhouse else None)
    wheel = ship.wheel_bytes()
    from payload.core.engines import engine_spec
    from payload.training.strategy import uses_tpu

    engine = config.train.engine
    environment = plan_environment(
        python=python, wheelhouse_digest=wheelhouse[1] if wheelhouse else None,
        requirements=ship.worker_requirements(extras=engine_spec(engine).extras + (
            (wandb_sink.EXTRA,) if config.train.wandb else ())),
        tpu=uses_tpu(fleet.hardware), engine=engine)
    entry = os.environ.get(STAGE_ENTRY_ENV)
    the_plan = build_plan(
        config, fleet.workers, job_id=new_job_id(config.name),
        payload_digest=ship.payload_digest(wheel), environment=environment,
        hardware=fleet.hardware, stages=options.stages, resume=options.resume,
        overwrite=options.overwrite, new_data_order=options.new_data_order, stage_entry=(entry,) if entry else ("-m", "payload"),
        stale_after_s=peer_timeout_s(),
        forward_env=stand_ins.forwarded_env() + storage.forwarded_env(),
        hub_env=hub.forwarded_env())
    publishes = any(step.name == Stage.PUBLISH.value for step in the_plan.steps)
    checks_hub = publishes and not options.dry_run and not problems
    access = hub.check_access(config.hub.repo) if checks_hub else None
    the_launch = Launch(config=config, plan=the_plan, provider=provider, fleet=fleet,
                        wheel=wheel, wheelhouse=wheelhouse, options=options,
                        config_path=config_path, started_from=started_from(config_path),
                        hub=access)
    if options.dry_run or problems:
        try:
            check_before_start(the_launch)  # what the real run refuses first, the dry run does
        except UserError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise UserErrors([line for problem in problems for line in error_lines(problem)])
    return the_launch


def started_from(config_path: Path) -> str:
    """Where a run was started: `user@host:/path/to/tpuctl.yaml`."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}:{config_path.resolve()}"


def check_before_start(launch: Launch) -> None:
    """What the stages would refuse, refused before anything starts, where the launcher sees
    what the workers see (local workers share its disk and credentials)."""
    if launch.fleet.shares_launcher_machine:
        from payload.training.preflight import check_before_start as stages_would_refuse

        options = launch.options
        stages_would_refuse(launch.config, stages=options.stages, resume=options.resume,
                            overwrite=options.overwrite, num_workers=len(launch.plan.workers))


def _refuse_if_running(executor, base: Path, name: str, workers: tuple[Worker, ...]) -> str | None:
    """The run's current job must not still be running on these workers; its id when it is
    seen ended there (its run lock, if left behind, can then be taken over at once)."""
    try:
        previous = records.current_job(base, name).plan()
    except (UserError, OSError, ValueError, KeyError, TypeError):
        return None
    if [w.host for w in previous.workers] != [w.host for w in workers]:
        return None
    states = [s["state"] for s in job_control.status(executor, previous)]
    if "running" in states:
        raise UserError(f"job {previous.job_id} of run '{name}' is still running",
                        hint="watch it with `tpuctl logs` or end it with `tpuctl stop`")
    return previous.job_id if "unreachable" not in states else None


def start(launch: Launch, *, on_event: Callable[[Worker, str], None] = lambda w, m: None,
          on_note: Callable[[str], None] = lambda m: None, dead_job: str | None = None) -> Job:
    """Check, stage inputs, ship, take the run lock, record and submit: the job runs detached
    on every worker when this returns. `on_event` hears shipping per worker, `on_note` the
    rest (a dead job's run lock taken over, for one). `dead_job`: a job the caller knows has
    ended (its machines were taken away), whose run lock is taken over at once."""
    from payload.config import dump_config

    check_before_start(launch)
    launch = dataclasses.replace(launch, config=launch.provider.stage_inputs(launch.config,
                                                                             on_note))
    if launch.options.down:
        launch = dataclasses.replace(launch, plan=dataclasses.replace(
            launch.plan, delete_when_done=launch.provider.node_to_delete(on_note)))
    base = records.state_dir()
    the_plan = launch.plan
    pen = _ledger(launch, the_plan.job_id, hold=True)  # output_dir is written after the lock
    pen.note("setup_started")
    executor = launch.provider.connect(the_plan.workers)
    locked = False
    try:
        ended = _refuse_if_running(executor, base, launch.config.name, the_plan.workers) or (
            dead_job)
        wheel = ship.write_wheel(base / "wheels", launch.wheel)
        done = ship.ship(executor, the_plan.workers, the_plan.environment, the_plan.paths, wheel,
                         wheelhouse=launch.wheelhouse, on_event=on_event)
        pen.note("environment_installed",
                 set_up=sorted({k for d in done for k, v in d.items() if v}))
        # Before output_dir is touched (its shared-output marker, the run lock): a checkpoint
        # the stages would refuse is refused here, once, with nothing written.
        job_control.preflight(executor, the_plan, dump_config(launch.config))
        job_control.check_shared_output(executor, the_plan)
        holder = {"job": the_plan.job_id, "run": the_plan.name, "from": launch.started_from,
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "stale_after_s": the_plan.stale_after_s}
        note = job_control.take_run_lock(executor, the_plan, holder, dead_job=ended)
        locked = True
        if note:
            on_note(note)
        record = records.save_job(base, the_plan, dump_config(launch.config),
                                  launch.provider.reach(launch.fleet))
        launch.provider.record_billing(the_plan.output_dir)
        pen.note("job_started", workers=len(the_plan.workers))
        pen.release()
        job_control.submit(executor, the_plan, record, secrets={
            **(launch.hub.secrets() if launch.hub else {}),
            **{k: os.environ[k] for k in (wandb_sink.API_KEY_ENV,) if os.environ.get(k)}})
    except BaseException:
        if locked:
            pen.note("job_ended", state="did not start")
            job_control.release_run_lock(executor, the_plan)
        executor.close()
        raise
    set_up = sorted({k for d in done for k, v in d.items() if v})
    return Job(record=record, plan=the_plan, provider=launch.provider, executor=executor,
               set_up=set_up)


def _ledger(launch: Launch, job: str | None, *, hold: bool = False):
    """The launcher's pen for the run's ledger (launcher.goodput), where it sees output_dir."""
    from launcher import goodput

    out = launch.config.output_dir
    return goodput.launcher_ledger(out if _sees_output_dir(launch) else None, job=job,
                                   hold=hold)


def _sees_output_dir(launch: Launch) -> bool:
    from launcher import goodput

    return goodput.sees_output_dir(launch.config.output_dir,
                                   shares_machine=launch.fleet.shares_launcher_machine,
                                   bills=launch.config.cluster.hourly_price() is not None)


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


def bring_up(config_path: Path, on_event: Callable[[str], None]) -> None:
    """`tpuctl up`: the provider's, with the request and the VMs coming up noted in the run's
    ledger where the cluster bills (held until up has made the bucket)."""
    from launcher import goodput

    config = load(config_path)
    provider = provider_for(config)
    if config.cluster.hourly_price() is None:
        provider.up(on_event=on_event)
        return
    requested = time.time()
    provider.up(on_event=on_event)
    # Written once up has made the bucket, with the time of the request.
    pen = goodput.launcher_ledger(config.output_dir)
    pen.note("requested", t=requested)
    pen.note("vms_up")


def take_down(config_path: Path, on_event: Callable[[str], None], *,
              delete_bucket: bool = False) -> None:
    """`tpuctl down`: the provider's, then the teardown noted in the ledger and the billing
    record (launcher.goodput.teardown_noted)."""
    from launcher import goodput

    config = load(config_path)
    provider_for(config).down(on_event=on_event, delete_bucket=delete_bucket)
    if config.cluster.hourly_price() is not None:
        goodput.teardown_noted(config.output_dir, delete_bucket=delete_bucket)


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
           keep_following: bool = True) -> job_control.Outcome:
    """Stream the job's logs (all workers, or one) from the start until it ends; fail-fast
    over all workers."""
    chosen = job.plan.workers if worker is None else (select(job.plan.workers, worker),)
    book = job_control.LogBook(job.record, chosen)
    watching = (job.record.watching() if keep_following and worker is None
                else contextlib.nullcontext())
    try:
        with watching:  # `tpuctl jobs` shows the job as watched meanwhile
            outcome = job_control.watch(job.executor, only(job.plan, chosen), book, sink,
                                        follow=keep_following,
                                        fail_fast=keep_following and worker is None,
                                        trouble=job.provider.trouble)
    finally:
        book.close()
    ended = not outcome.detached and not (outcome.ok and outcome.reason)  # not still running
    if ended and worker is None:
        state = "finished" if outcome.ok else "stopped" if outcome.stopped else "failed"
        job.record.save_outcome(state, outcome.reason)
    return outcome


def select(workers: tuple[Worker, ...], index: int, *, of: str = "the job") -> Worker:
    """The worker --worker names, or a one-line error listing the valid range."""
    if not 0 <= index < len(workers):
        raise UserError(f"--worker {index}: {of} has workers 0..{len(workers) - 1}")
    return workers[index]


def stop_job(job: Job, on_result: Callable[[int, str], None] = lambda worker, result: None
             ) -> job_control.Stop:
    """Stop the job on every worker (job_control.stop); recorded as stopped when it was running
    somewhere, and with the last words of worker 0's log (which checkpoint `--resume` takes)."""
    stop = job_control.stop_and_say(job.executor, job.plan, on_result=on_result)
    if stop.stopped and not stop.already_ended and not job.record.outcome():
        job.record.save_outcome("stopped", stop.words or "tpuctl stop")
    return stop


def job_status(job: Job) -> list[dict]:
    return job_control.status(job.executor, job.plan)


def tpu_left_up(job: Job, rows: list[dict]) -> str | None:
    """`train --down`: once the job has ended on every worker, worker 0 has asked to delete its
    TPU. A line when the TPU is nevertheless still up and billing (the self-delete failed:
    refused, or the agent could not reach the API), else None."""
    if job.plan.delete_when_done is None or any(r["state"] == "running" for r in rows):
        return None
    still = job.provider.billing()
    if still is None:
        return None
    return (f"the job asked for --down, but its self-delete failed: {still} (it keeps billing "
            "until then; worker 0's log says why)")


def _steps_reached(job: Job, launch: Launch) -> int | None:
    """The newest training step a lost job is known to have reached: its chief's progress
    records in the launcher's copy of its log, and its step events in the run's ledger (where
    the launcher sees output_dir). Either may trail the other (the log's copy by a record when
    the machines go, the ledger by its batching): the newest of both, the one figure the
    recovery record and the goodput report give."""
    from payload.core import ledger
    from payload.training import progress

    found = []
    path = job.record.log_file(0)
    if path.is_file():
        found += [r["step"] for r in map(progress.parse,
                                         path.read_text(errors="replace").splitlines())
                  if r is not None and r["kind"] == "train"]
    if _sees_output_dir(launch):
        try:
            events = ledger.read(launch.config.output_dir)
        except Exception:  # a ledger it cannot read now (storage, credentials): the log's
            events = []     # figure alone; the recovery does not wait on a figure
        found += [e["step"] for e in events if e.get("event") == "step"
                  and e.get("job") == job.plan.job_id and e.get("step") is not None]
    return max(found, default=None)


def _keep_lock_beating(output_dir: str, job_id: str, stop_event) -> None:
    """While the TPU is gone nobody beats the run lock: the launcher does, so no other run
    takes the output_dir over during a recovery (if the launcher can reach output_dir)."""
    from payload.jobs import runlock

    while not stop_event.wait(5.0):
        try:
            runlock.beat(output_dir, job_id)
        except Exception:  # the lock may be unreachable from here; it then waits as stale
            return


def follow_to_end(launch: Launch, job: Job, *, sink: Callable[[int, str], None],
                  on_note: Callable[[str], None] = lambda m: None,
                  on_started: Callable[[Job], None] = lambda job: None
                  ) -> tuple[Job, job_control.Outcome]:
    """Follow a started job to its end; when its machines are taken away (a preempted TPU) and
    --auto-resume allows, replace them, ship again and resume from the newest checkpoint,
    recording each recovery in output_dir (launcher.recoveries). The last job and how it
    ended."""
    import threading

    from launcher import recoveries

    def shipping(worker: Worker, message: str) -> None:
        if message != "ready":
            on_note(f"{worker.label}: {message}")

    done = 0
    while True:
        outcome = follow(job, sink)
        pen = _ledger(launch, job.plan.job_id)
        lost_at = _steps_reached(job, launch) if outcome.lost_fleet else None
        if outcome.lost_fleet:
            pen.note("preempted", reason=outcome.reason, lost_at_step=lost_at)
        if not outcome.lost_fleet or done >= launch.options.auto_resume:
            if not outcome.detached:
                state = ("finished" if outcome.ok else "stopped" if outcome.stopped
                         else "failed")
                pen.note("job_ended", state=state, reason=outcome.reason)
            return job, outcome
        done += 1
        on_note(f"{outcome.reason}: recovering ({done} of {launch.options.auto_resume})")
        job.close()
        beating = threading.Event()
        threading.Thread(target=_keep_lock_beating, daemon=True,
                         args=(job.plan.output_dir, job.plan.job_id, beating)).start()
        try:
            launch.provider.recover(on_note)
            resume = recoveries.has_checkpoint(job.plan.output_dir)
            options = dataclasses.replace(launch.options, resume=resume, overwrite=False)
            launch = plan_train(launch.config_path, options)
        finally:
            beating.set()
        entry = recoveries.record(job.plan.output_dir, reason=outcome.reason,
                                  old_job=job.plan.job_id, new_job=launch.plan.job_id,
                                  lost_at_step=lost_at)
        pen.note("recreated", new_job=launch.plan.job_id,
                 lost_at_step=entry["lost_at_step"],
                 resumed_from_step=entry["resumed_from_step"])
        on_note(f"recovery {done}: {entry['summary']}")
        job = start(launch, on_event=shipping, on_note=on_note, dead_job=job.plan.job_id)
        on_started(job)


DOWNLOAD_MARKER = layout.DOWNLOAD_MARKER


def finish(launch: Launch, job: Job, outcome: job_control.Outcome, *,
           on_note: Callable[[str], None] = lambda m: None) -> None:
    """What the user asked for once a followed job has ended: the TPU deleted (--down), model/
    copied here (--download, only after a job that finished). A detached job is left alone:
    its worker 0 deletes the TPU itself when --down was given."""
    job.close()
    if outcome.detached:
        return
    if launch.options.down:
        from launcher import goodput

        job.provider.down(on_event=on_note)
        goodput.teardown_noted(job.plan.output_dir)
    if launch.options.download is not None and outcome.ok:
        on_note(download_model(job.plan.output_dir, launch.options.download))


def check_download_target(target: Path) -> None:
    """Refuse a `--download TARGET` that would put something the user owns at risk."""
    problem = None
    if target.is_symlink():  # replacing it would swap out, or copy into, what it points to
        problem = f"--download {target} is a symbolic link (to {os.readlink(target)})"
    elif target.exists() and not target.is_dir():
        problem = f"--download {target} is a file"
    elif target.is_dir() and any(target.iterdir()) and not (target / DOWNLOAD_MARKER).exists():
        problem = (f"--download {target} holds files tpuctl did not download there; they would "
                   "be replaced")
    if problem:
        raise UserError(problem, hint="choose another --download folder")


def download_model(output_dir: str, target: Path) -> str:
    """Copy output_dir/model/ (only once it is complete) into `target`, replacing an earlier
    download there whole (payload.core.folders.replacing_folder): a crash leaves the old copy or the
    new one."""
    check_download_target(target)
    source = layout.model_dir(output_dir)
    if not folders.is_complete(source):
        raise UserError(f"{source} is not complete (no export finished there)",
                        hint="run the export stage: `tpuctl train --stages export`")
    prefix = source.rstrip("/") + "/"
    with folders.replacing_folder(str(target), {"stage": "download", "source": source}) as new:
        for path in storage.walk_files(source):
            local = Path(new) / path[len(prefix):]
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(storage.read_bytes(path))
        (Path(new) / DOWNLOAD_MARKER).write_text(f"copied from {source}\n")
    return f"model/ copied to {target}"


@dataclass(frozen=True)
class JobSummary:
    """One line of `tpuctl jobs`."""

    job_id: str
    started: float  # epoch seconds
    stages: tuple[str, ...]
    state: str
    output_dir: str
    current: bool


def list_jobs(config_path: Path, *, check: bool = False) -> list[JobSummary]:
    """The run's jobs recorded on this machine, oldest first. Their state is what the launcher
    saw when it last followed one to its end; `check` asks the workers of any other job."""
    name = load(config_path).name
    base = records.state_dir()
    try:
        current = records.current_job(base, name).job_id
    except UserError:
        current = None
    found = []
    for record in records.run_jobs(base, name):
        try:
            plan = record.plan()
        except UserError:
            continue  # recorded by another version of tpuctl
        state = _recorded_state(record)
        watcher = record.watcher() if state is None else None
        if watcher is not None:
            state = f"running, watched by pid {watcher}"
        elif state is None:
            state = (_asked_state(config_path, record.job_id) if check
                     else "not followed to its end")
        found.append(JobSummary(job_id=record.job_id, started=record.started,
                                stages=tuple(s.name for s in plan.steps),
                                state=view.visible(state),  # it may quote a worker's words
                                output_dir=plan.output_dir, current=record.job_id == current))
    return found


def _recorded_state(record: records.JobRecord) -> str | None:
    outcome = record.outcome()
    if not outcome:
        return None
    detail = outcome.get("detail") or ""
    return f"{outcome['state']}: {detail}" if detail and outcome["state"] != "stopped" else (
        outcome["state"])


def _asked_state(config_path: Path, job_id: str) -> str:
    """The job's state as its workers tell it now."""
    try:
        with open_job(config_path, job_id) as job:
            rows = job_status(job)
            left_up = tpu_left_up(job, rows)
    except UserError as exc:
        return f"cannot ask its workers: {exc.message}"
    states = [row["state"] for row in rows]
    if left_up:
        return left_up
    if "running" in states:
        stage = next(row["stage"] for row in rows if row["state"] == "running")
        return f"running ({stage})" if stage else "running"
    if all(row["state"] == "exited" and row["rc"] == 0 for row in rows):
        return "finished"
    if job_control.ended_stopped(rows):
        return job_control.STOPPED
    if all(state == "none" for state in states):
        return "never started"
    odd = next(row for row in rows if row["state"] != "exited" or row["rc"] != 0)
    rc = f", exit {odd['rc']}" if odd["rc"] is not None else ""
    return f"{odd['state']} on {odd['worker']}{rc}"
