"""The `tpuctl` command line: a thin layer that validates input and hands off to plain functions.

    tpuctl init .
    tpuctl train --local --workers 2

Heavy libraries (TensorFlow, transformers, cloud clients) are imported inside commands only, so
`tpuctl --help` answers at once. Every user mistake is a `UserError` caught once, in `main`.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from payload.errors import UserError, one_line

app = typer.Typer(
    name="tpuctl",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Pretrain language models on Cloud TPUs: from raw text to a Hugging Face model."""


ConfigOpt = Annotated[
    Path, typer.Option("--config", "-c", help="Run config file.", show_default=True)
]
DEFAULT_CONFIG = Path("tpuctl.yaml")
WorkerOpt = Annotated[
    int | None, typer.Option("--worker", "-w", help="Only this worker (0-based).", min=0)
]
JobOpt = Annotated[
    str | None, typer.Option("--job", help="A job id (default: the latest job of the run).")
]


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="Folder to write tpuctl.yaml into.")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
) -> None:
    """Write a commented tpuctl.yaml to start from."""
    target = directory / "tpuctl.yaml"
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{directory} is a file, not a folder")
    if target.exists() and not force:
        raise UserError(f"{target} already exists", hint="pass --force to replace it")
    text = resources.files("launcher").joinpath("templates/tpuctl.yaml").read_text("utf-8")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {target}: {exc.strerror}") from None
    typer.echo(f"wrote {target}; edit data.corpus and output_dir, then run `tpuctl train --local`")


WORKER_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
                  "bright_magenta", "bright_green", "bright_yellow", "bright_blue", "red")
# Test hook: run stages as `PYTHON FILE STAGE ...` instead of `PYTHON -m payload STAGE ...`.
STAGE_ENTRY_ENV = "TPUCTL_STAGE_ENTRY"
# How long workers wait on a silent peer before ending the job themselves (default 120 s).
PEER_TIMEOUT_ENV = "TPUCTL_PEER_TIMEOUT_S"


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, stderr=stderr)


def _line_printer(console, num_workers: int):
    """A thread-safe sink printing each line after its worker's coloured prefix."""
    import threading

    from rich.text import Text

    lock = threading.Lock()
    width = len(f"worker-{num_workers - 1}")

    def sink(worker: int, line: str) -> None:
        prefix = f"worker-{worker}".ljust(width)
        text = Text.assemble((prefix + " | ", WORKER_COLOURS[worker % len(WORKER_COLOURS)]), line)
        with lock:
            console.print(text)

    return sink


def _load(config_path: Path):
    from payload.config import load_config

    return load_config(config_path)


def _ssh_settings(config):
    from launcher.workers import ssh_settings

    return ssh_settings(config.cluster) if config.cluster.provider == "ssh" else None


def _open_job(config_path: Path, job: str | None):
    """The stored plan of a job and an executor for its workers."""
    from launcher import run
    from launcher.executors import open_executor

    config = _load(config_path)
    record = run.current_job(run.state_dir(), config.name, job)
    plan = record.plan()
    local = plan.workers[0].base_dir is not None
    executor = open_executor(plan.workers, None if local else _ssh_settings(config))
    return record, plan, executor


def _select(workers, worker: int | None, *, of: str = "the job"):
    """All workers, or the one --worker names."""
    if worker is None:
        return workers
    if worker >= len(workers):
        raise UserError(f"--worker {worker}: {of} has workers 0..{len(workers) - 1}")
    return (workers[worker],)


def _report(outcome, record, plan, config_path: Path) -> None:
    console = _console()
    err = _console(stderr=True)
    if outcome.detached:
        err.print(f"\ndetached; job {plan.job_id} keeps running on the workers.\n"
                  f"  re-attach: tpuctl logs -c {config_path}\n"
                  f"  stop:      tpuctl stop -c {config_path}")
        return
    if outcome.ok:
        if outcome.reason:
            console.print(f"job {plan.job_id}: {outcome.reason}")
            return
        console.print(f"job {plan.job_id} finished on {len(plan.workers)} workers; outputs in "
                      f"{plan.output_dir} (logs: {plan.output_dir}/logs, local copies: "
                      f"{record.folder / 'logs'})")
        return
    if outcome.failed_worker is not None:
        err.print(f"\n{outcome.reason}; the job was stopped on every worker. "
                  f"Last lines of worker-{outcome.failed_worker}:")
        for line in outcome.tail:
            err.print(f"  {line}", markup=False)
        err.print(f"full log: {record.log_file(outcome.failed_worker)}", markup=False)
    else:
        err.print(outcome.reason)
    raise typer.Exit(1)


def _refuse_if_running(executor, base: Path, name: str, workers) -> None:
    from launcher import run

    try:
        record = run.current_job(base, name)
        plan = record.plan()
    except (UserError, OSError, ValueError, KeyError):
        return
    if [w.host for w in plan.workers] != [w.host for w in workers]:
        return
    if any(s["state"] == "running" for s in run.status(executor, plan)):
        raise UserError(f"job {plan.job_id} of run '{name}' is still running",
                        hint="watch it with `tpuctl logs` or end it with `tpuctl stop`")


@app.command()
def train(
    config_path: ConfigOpt = DEFAULT_CONFIG,
    local: Annotated[bool, typer.Option("--local", help="Run on this machine's CPU as local "
                                        "worker processes.")] = False,
    num_workers: Annotated[int | None, typer.Option(
        "--workers", help="Local worker processes (with --local; default: cluster.workers or 2)."
    )] = None,
    stages: Annotated[str | None, typer.Option(
        "--stages", help="Comma-separated subset of tokenizer,prepare,train,export.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest "
                                         "checkpoint.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Redo stages whose outputs "
                                            "exist.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan; touch "
                                          "nothing.")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="Start the job and return "
                                         "without streaming its logs.")] = False,
) -> None:
    """Ship the payload to every worker, set up its environment, run the pipeline stages."""
    from launcher import plan as planning

    if num_workers is not None and num_workers < 1:
        raise UserError(f"--workers {num_workers}: need at least 1 worker")
    selected = planning.parse_stages(stages)
    config, the_plan, ssh, wheel_data, wheelhouse = _plan_train(
        config_path, local=local, num_workers=num_workers, stages=selected, resume=resume,
        overwrite=overwrite)
    if dry_run:
        typer.echo(planning.render_plan(the_plan))
        return
    if ssh is None:
        # Local workers see this machine's disk and credentials: what the stages would refuse
        # (missing corpus, a checkpoint clash, ...) is refused here, before anything starts.
        from payload.preflight import check_before_start

        check_before_start(config, stages={s.value for s in selected}, resume=resume,
                           overwrite=overwrite)
    _run_train(config, config_path, the_plan, ssh, wheel_data, wheelhouse, detach=detach)


def _plan_train(config_path: Path, *, local: bool, num_workers: int | None, stages, resume: bool,
                overwrite: bool):
    """Everything `train` will do, as a plan; reads files and picks ports, writes nothing."""
    import secrets
    import time

    from launcher import plan as planning
    from launcher import run, ship
    from launcher.workers import local_config, resolve_workers

    config = _load(config_path)
    workers, ssh, topology = resolve_workers(config, local=local, num_workers=num_workers,
                                             state_dir=run.state_dir())
    if ssh is None:
        # What the stages read must say what runs: local CPU workers, not the config's cluster.
        config = local_config(config, len(workers))
    cluster = config.cluster
    python = cluster.python or (ship.launcher_python() if ssh is None and not cluster.wheelhouse
                                else None)
    wheelhouse = ((cluster.wheelhouse, ship.wheelhouse_digest(cluster.wheelhouse))
                  if cluster.wheelhouse else None)
    wheel_data = ship.wheel_bytes()
    environment = planning.plan_environment(
        python=python, wheelhouse_digest=wheelhouse[1] if wheelhouse else None,
        requirements=ship.worker_requirements(), tpu=any(w.tpu for w in workers))
    entry = os.environ.get(STAGE_ENTRY_ENV)
    job_id = (f"{config.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-"
              f"{secrets.token_hex(2)}")
    the_plan = planning.build_plan(
        config, workers, job_id=job_id, payload_digest=ship.payload_digest(wheel_data),
        environment=environment, topology=topology, stages=stages, resume=resume,
        overwrite=overwrite, stage_entry=(entry,) if entry else ("-m", "payload"),
        stale_after_s=_peer_timeout())
    return config, the_plan, ssh, wheel_data, wheelhouse


def _run_train(config, config_path: Path, the_plan, ssh, wheel_data: bytes, wheelhouse, *,
               detach: bool) -> None:
    """Ship, check, start, then stream until the job ends (or Ctrl-C detaches)."""
    from launcher import run, ship
    from launcher.executors import open_executor
    from payload.config import dump_config

    base = run.state_dir()
    console = _console()
    with open_executor(the_plan.workers, ssh) as executor:
        _refuse_if_running(executor, base, config.name, the_plan.workers)
        wheel = ship.write_wheel(base / "wheels", wheel_data)
        _ship_with_progress(console, executor, the_plan, wheel, wheelhouse)
        run.check_shared_output(executor, the_plan)
        record = run.save_job(base, the_plan, dump_config(config))
        run.submit(executor, the_plan, record)
        console.print(f"job {the_plan.job_id} started on {len(the_plan.workers)} workers "
                      f"(stages: {', '.join(s.name for s in the_plan.steps)})")
        if detach:
            console.print(f"follow it with `tpuctl logs -c {config_path}`")
            return
        book = run.LogBook(record, the_plan.workers, from_start=True)
        try:
            outcome = run.watch(executor, the_plan, book,
                                _line_printer(console, len(the_plan.workers)))
        finally:
            book.close()
        _report(outcome, record, the_plan, config_path)


def _peer_timeout() -> float:
    raw = os.environ.get(PEER_TIMEOUT_ENV, "120")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise UserError(f"{PEER_TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return value


def _ship_with_progress(console, executor, the_plan, wheel, wheelhouse) -> None:
    import threading

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from launcher import ship

    lock = threading.Lock()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total} workers"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("shipping the payload", total=len(the_plan.workers))

        def on_event(worker, message: str) -> None:
            with lock:
                if message == "ready":
                    progress.advance(task)
                else:
                    progress.update(task, description=f"{worker.label}: {message}")

        done = ship.ship(executor, the_plan.workers, the_plan.environment, the_plan.paths, wheel,
                         wheelhouse=wheelhouse, on_event=on_event)
    work = sorted({k for d in done for k, v in d.items() if v})
    console.print(f"workers ready ({'set up: ' + ', '.join(work) if work else 'all cached'})")


@app.command()
def logs(
    config_path: ConfigOpt = DEFAULT_CONFIG,
    worker: WorkerOpt = None,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", "-f",
                                         help="Keep streaming until the job ends.")] = True,
    job: JobOpt = None,
) -> None:
    """Re-attach to a running or finished job's logs, from the start."""
    from launcher import run

    record, the_plan, executor = _open_job(config_path, job)
    chosen = _select(the_plan.workers, worker)
    view = the_plan if worker is None else _only(the_plan, chosen)
    console = _console()
    with executor:
        book = run.LogBook(record, chosen, from_start=True)
        try:
            outcome = run.watch(executor, view, book, _line_printer(console, len(the_plan.workers)),
                                follow=follow, fail_fast=follow and worker is None)
        finally:
            book.close()
    _report(outcome, record, the_plan, config_path)


def _only(the_plan, chosen):
    import dataclasses

    return dataclasses.replace(the_plan, workers=tuple(chosen))


@app.command()
def stop(config_path: ConfigOpt = DEFAULT_CONFIG, job: JobOpt = None) -> None:
    """Stop the job on every worker; nothing is left running."""
    from launcher import run

    _, the_plan, executor = _open_job(config_path, job)
    with executor:
        results = run.stop(executor, the_plan)
    for index, result in results.items():
        typer.echo(f"worker-{index}: {result}")
    if any(r != "stopped" for r in results.values()):
        raise typer.Exit(1)
    typer.echo(f"job {the_plan.job_id} stopped on every worker")


@app.command()
def status(config_path: ConfigOpt = DEFAULT_CONFIG, job: JobOpt = None) -> None:
    """Show the workers, the job's stage and step, and where outputs are."""
    from rich.table import Table

    from launcher import run

    record, the_plan, executor = _open_job(config_path, job)
    with executor:
        rows = run.status(executor, the_plan)
    table = Table(title=f"job {the_plan.job_id}")
    for column in ("worker", "host", "state", "stage", "step", "exit", "last line"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(row["worker"], row["host"], row["state"], row["stage"] or "-",
                      row["step"] or "-", "-" if row["rc"] is None else str(row["rc"]),
                      row["last"][-80:])
    console = _console()
    console.print(table)
    console.print(f"outputs: {the_plan.output_dir}  logs: {the_plan.output_dir}/logs  "
                  f"local log copies: {record.folder / 'logs'}", markup=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(
    ctx: typer.Context,
    config_path: ConfigOpt = DEFAULT_CONFIG,
    worker: WorkerOpt = None,
) -> None:
    """Open a shell on a worker, or run `-- CMD` on all workers (or --worker N)."""
    import shlex

    from launcher import run
    from launcher.executors import open_executor
    from launcher.workers import resolve_workers

    config = _load(config_path)
    workers, settings, _ = resolve_workers(config, local=False, num_workers=None,
                                           state_dir=run.state_dir())
    chosen = _select(workers, worker, of="the cluster")
    command = shlex.join(ctx.args) if ctx.args else ""
    with open_executor(workers, settings) as executor:
        if not command:
            if len(chosen) != 1:
                raise UserError("a shell needs one worker", hint="pass --worker N, or a "
                                "command after --")
            raise typer.Exit(executor.interactive(chosen[0]))
        results = run.on_workers(chosen, lambda w: executor.run(w, command, timeout_s=None))
    sink = _line_printer(_console(), len(workers))
    for w, res in zip(chosen, results, strict=True):
        for line in (res.stdout + res.stderr).splitlines():
            sink(w.index, line)
    if any(not r.ok for r in results):
        raise typer.Exit(1)


def _error_messages():
    """One table: exception type -> the one line the user sees."""
    from launcher.executors import WorkerUnreachable

    return {
        UserError: lambda e: one_line(str(e)),
        WorkerUnreachable: lambda e: one_line(
            f"{e}; check cluster.hosts and that sshd runs there, then retry"),
    }

def main() -> None:
    """Console entry point: one line and exit status 2 for user mistakes, unless TPUCTL_DEBUG."""
    try:
        app()  # standalone: usage errors print themselves and exit 2
    except Exception as exc:
        table = _error_messages()
        message = next((m for t, m in table.items() if isinstance(exc, t)), None)
        if message is None or os.environ.get("TPUCTL_DEBUG"):
            raise
        typer.echo(f"error: {message(exc)}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))


if __name__ == "__main__":
    main()
