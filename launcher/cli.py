"""The `tpuctl` command line: a thin layer that validates input and hands off to plain functions.

    tpuctl init .
    tpuctl train --local --workers 2
    tpuctl logs --worker 1 --no-follow

Each command parses its options, calls the use-case (launcher.launch: plans, starts and reopens
jobs; it prints nothing) and shows what came back with rich.
Heavy libraries (TensorFlow, transformers, cloud clients) are imported inside commands only, so
`tpuctl --help` answers at once. Every user mistake is a `UserError` caught once, in `main`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from payload.core.errors import UserError, counted, error_lines, one_line

app = typer.Typer(
    name="tpuctl",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Markdown joins a docstring's lines into one paragraph, rewrapped to the terminal: the
    # default keeps the source's line breaks, which cut help lines mid-phrase.
    rich_markup_mode="markdown",
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
    # A link named tpuctl.yaml (dangling or not) would have the file written wherever it
    # points, outside the folder asked for: never followed, --force or not.
    if target.is_symlink():
        raise UserError(f"{target} is a symbolic link (to {os.readlink(target)})",
                        hint="remove the link, or init another folder")
    if target.exists() and not force:
        raise UserError(f"{target} already exists", hint="pass --force to replace it")
    text = resources.files("launcher").joinpath("templates/tpuctl.yaml").read_text("utf-8")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW (and O_EXCL without --force): a link made since the check is refused too.
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if force else os.O_EXCL)
        with os.fdopen(os.open(target, flags, 0o644), "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        raise UserError(f"cannot write {target}: {exc.strerror}") from None
    typer.echo(f"wrote {target}; edit data.corpus and output_dir, then run `tpuctl train --local`")


WORKER_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
                  "bright_magenta", "bright_green", "bright_yellow", "bright_blue", "red")


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, stderr=stderr)


def _worker_line(num_workers: int, *, keep_bytes: bool = False):
    """(worker, line) -> the line after its worker's coloured prefix, control characters
    escaped (launcher.view.visible) unless `keep_bytes`."""
    from rich.text import Text

    from launcher.view import visible
    from payload.core.layout import worker_label

    width = len(worker_label(num_workers - 1))

    def render(worker: int, line: str) -> Text:
        prefix = worker_label(worker).ljust(width)
        return Text.assemble((prefix + " | ", WORKER_COLOURS[worker % len(WORKER_COLOURS)]),
                             line if keep_bytes else visible(line))

    return render


def _line_printer(console, num_workers: int, *, keep_bytes: bool = False):
    """A thread-safe sink printing every line after its worker's coloured prefix."""
    import threading

    lock = threading.Lock()
    render = _worker_line(num_workers, keep_bytes=keep_bytes)

    def sink(worker: int, line: str) -> None:
        with lock:
            console.print(render(worker, line))

    return sink


@contextlib.contextmanager
def _watching(console, num_workers: int):
    """A sink showing a job as launcher.view sees it, and that view: on a terminal, training
    progress is one line redrawn below the others until training ends."""
    import threading

    from rich.live import Live

    from launcher.view import View

    view = View(live=console.is_terminal)
    render = _worker_line(num_workers)
    lock = threading.Lock()
    live = Live(console=console, auto_refresh=False, transient=False)
    state = {"drawn": None, "on": False}

    def sink(worker: int, line: str) -> None:
        with lock:
            for text in view.feed(worker, line):
                console.print(render(worker, text))
            if view.live and view.progress is not state["drawn"] and not view.training_over:
                state["drawn"] = view.progress
                live.update(_progress_line(view.progress, console.width), refresh=state["on"])
                if not state["on"]:
                    live.start(refresh=True)
                    state["on"] = True
            elif state["on"] and view.training_over:
                live.stop()  # its last drawing stays
                state["on"] = False

    try:
        yield sink, view
    finally:
        if state["on"]:
            live.stop()


def _progress_line(record: dict, width: int):
    """The live progress line: `train`, a bar if the terminal is wide enough, the figures."""
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    from launcher.view import live_text, visible

    text = visible(live_text(record))
    line = Table.grid(padding=(0, 1))
    cells = ["train"]
    bar_width = min(30, width - len(text) - 8)
    if bar_width >= 10:
        cells.append(ProgressBar(total=record.get("steps") or 1, completed=record.get("step", 0),
                                 width=bar_width))
    for _ in cells:
        line.add_column(no_wrap=True)
    line.add_column(no_wrap=True, overflow="ellipsis")
    line.add_row(*cells, text)
    return line


def _report(outcome, job, config_path: Path, view=None) -> None:
    """How the job ended, then what is still billing; exit status 1 when it failed."""
    failed = _report_outcome(outcome, job, config_path, view)
    note = job.provider.billing()
    if note:
        _console(stderr=True).print(note, markup=False)
    if failed:
        raise typer.Exit(1)


def _report_outcome(outcome, job, config_path: Path, view) -> bool:
    from launcher import view as views
    from payload.core.layout import worker_label

    console = _console()
    err = _console(stderr=True)
    plan = job.plan
    if outcome.detached:
        err.print(f"\ndetached; job {plan.job_id} keeps running on the workers.\n"
                  f"  re-attach: tpuctl logs -c {config_path}\n"
                  f"  stop:      tpuctl stop -c {config_path}", markup=False)
        return False
    if outcome.ok:
        if outcome.reason:
            console.print(f"job {plan.job_id}: {views.visible(outcome.reason)}", markup=False)
            return False
        final = view.final if view else None
        console.print(f"\njob {plan.job_id} finished on {counted(len(plan.workers), 'worker')}", markup=False)
        for line in views.summary(final=final, family=(final or {}).get("family")
                                  or job.record.model_family(), output_dir=plan.output_dir,
                                  exported=any(s.name == "export" for s in plan.steps)):
            console.print(views.visible(line), markup=False)
        console.print(f"outputs: {plan.output_dir}  (logs: {plan.output_dir}/logs, local copies: "
                      f"{job.record.folder / 'logs'})", markup=False)
        return False
    if outcome.failed_worker is not None:
        err.print(f"\n{views.visible(outcome.reason)}; the job was stopped on every worker. "
                  f"Last lines of {worker_label(outcome.failed_worker)}:", markup=False)
        for line in views.shown_lines(outcome.tail)[-TAIL_SHOWN:]:
            err.print(f"  {views.visible(line)}", markup=False)
        err.print(f"full log: {job.record.log_file(outcome.failed_worker)}", markup=False)
    else:
        err.print(views.visible(outcome.reason), markup=False)
    return True


TAIL_SHOWN = 20
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan; touch nothing.")]


@app.command()
def up(config_path: ConfigOpt = DEFAULT_CONFIG, dry_run: DryRunOpt = False) -> None:
    """Create what `cluster` describes (Terraform for gcp), wait until READY, trust its host
    keys from the TPU API; --dry-run shows what and the price per hour, without credentials."""
    from launcher import launch

    provider = launch.cluster_provider(config_path)
    if dry_run:
        for line in provider.up_plan():
            typer.echo(line)
        return
    console = _console()
    provider.up(on_event=lambda message: console.print(message, markup=False))


@app.command()
def down(
    config_path: ConfigOpt = DEFAULT_CONFIG,
    delete_bucket: Annotated[bool, typer.Option(
        "--delete-bucket", help="Also delete this run's objects in the bucket `up` created, and "
        "the bucket once nothing else is in it (refused while a run's lock there is live).")
    ] = False,
) -> None:
    """Delete the TPU (and any queued request), then check through the API that nothing of the
    run is left billing; the bucket stays unless --delete-bucket."""
    from launcher import launch

    console = _console()
    launch.cluster_provider(config_path).down(
        on_event=lambda message: console.print(message, markup=False),
        delete_bucket=delete_bucket)


@app.command()
def doctor(config_path: ConfigOpt = DEFAULT_CONFIG) -> None:
    """Check a set-up before anything is created: credentials, API, type and runtime in the
    zone, org policies, SSH, bucket; one line per check. Exit status 1 if one needs fixing."""
    from launcher import launch

    results = launch.cluster_provider(config_path).doctor()
    for check in results:
        typer.echo(check.line())
    if any(check.verdict == "fix" for check in results):
        raise typer.Exit(1)


@app.command()
def train(
    config_path: ConfigOpt = DEFAULT_CONFIG,
    local: Annotated[bool, typer.Option("--local", help="Run on this machine's CPU as local "
                                        "worker processes.")] = False,
    num_workers: Annotated[int | None, typer.Option(
        "--workers", help="Local worker processes (with --local; default: cluster.workers or 2)."
    )] = None,
    stages: Annotated[str | None, typer.Option(
        "--stages",
        help="Comma-separated subset of: tokenizer, prepare, train, export, publish.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest "
                                         "checkpoint.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Redo stages whose outputs "
                                            "exist.")] = False,
    dry_run: DryRunOpt = False,
    detach: Annotated[bool, typer.Option("--detach", help="Start the job and return "
                                         "without streaming its logs.")] = False,
    down: Annotated[bool, typer.Option("--down", help="Delete the TPU when the job ends, fails "
                                       "or hits a limit, even with the launcher gone.")] = False,
    auto_resume: Annotated[int, typer.Option(
        "--auto-resume", help="Recover from up to this many preemptions (recreate, ship, "
        "resume).", min=0)] = 0,
    download: Annotated[Path | None, typer.Option(
        "--download", help="Copy model/ into this local folder when the job has finished.")
    ] = None,
    max_hours: Annotated[float | None, typer.Option(
        "--max-hours", help="Stop (checkpoint, export) after this many billed hours.")] = None,
    max_cost: Annotated[float | None, typer.Option(
        "--max-cost", help="Stop (checkpoint, export) at this cost in USD (gcp).")] = None,
    push_to_hub: Annotated[str | None, typer.Option(
        "--push-to-hub", metavar="OWNER/NAME", help="After export, publish model/ with a model "
        "card to this Hugging Face repository (sets hub.repo; token: HF_TOKEN or hf auth "
        "login).")] = None,
) -> None:
    """Ship the payload to every worker, set up its environment, run the pipeline stages."""
    from launcher import launch
    from launcher import plan as planning

    if num_workers is not None and num_workers < 1:
        raise UserError(f"--workers {num_workers}: need at least 1 worker")
    if download is not None:
        launch.check_download_target(download)
    options = launch.TrainOptions(
        local=local, num_workers=num_workers, stages=planning.parse_stages(stages),
        resume=resume, overwrite=overwrite, dry_run=dry_run, down=down,
        auto_resume=auto_resume, max_hours=max_hours, max_cost=max_cost,
        push_to_hub=push_to_hub)
    the_launch = launch.plan_train(config_path, options)
    if dry_run:
        typer.echo(planning.render_plan(the_launch.plan))
        typer.echo(f"model: {_model_line(the_launch.config)}")
        price = the_launch.provider.price()
        if price:
            typer.echo(f"cost: {price}")
        if down:
            typer.echo("when the job ends: worker 0 deletes the TPU (--down)")
        _print_run_plan(the_launch, read_remote=False)
        _print_publishing(the_launch)
        return
    console = _console()

    def note(message: str) -> None:
        console.print(message, markup=False)

    def started(job) -> None:
        work = job.set_up
        console.print(f"workers ready ({'set up: ' + ', '.join(work) if work else 'all cached'})")
        console.print(f"job {job.plan.job_id} started on {counted(len(job.plan.workers), 'worker')} "
                      f"(stages: {', '.join(s.name for s in job.plan.steps)})", markup=False)

    with _shipping_progress(console, len(the_launch.plan.workers)) as on_event:
        job = launch.start(the_launch, on_event=on_event, on_note=note)
    started(job)
    # Once, when the job has started (a refusal at start stays the only line printed).
    _print_run_plan(the_launch, read_remote=True)
    _print_publishing(the_launch)
    if detach:
        job.close()
        console.print(f"follow it with `tpuctl logs -c {config_path}`", markup=False)
        return
    with _watching(console, len(job.plan.workers)) as (sink, view):
        job, outcome = launch.follow_to_end(the_launch, job, sink=sink, on_note=note,
                                            on_started=started)
    job.close()
    if down and not outcome.detached:
        job.provider.down(on_event=note)
    if download is not None and outcome.ok and not outcome.detached:
        note(launch.download_model(job.plan.output_dir, download))
    _report(outcome, job, config_path, view)


def _print_run_plan(the_launch, *, read_remote: bool) -> None:
    """The run's figures (parameters, tokens, FLOPs, time, cost) and any mis-sizing warning."""
    from launcher.estimate import describe

    lines, warnings = describe(the_launch, read_remote=read_remote)
    for line in lines:
        typer.echo(line)
    for line in warnings:
        typer.echo(f"warning: {line}", err=True)


def _print_publishing(the_launch) -> None:
    repo = the_launch.config.hub.repo
    if not repo or not any(s.name == "publish" for s in the_launch.plan.steps):
        return
    private = "private" if the_launch.config.hub.private else "public"
    if the_launch.hub is None:
        typer.echo(f"publish: model/ to {repo} ({private} if created) after export; the token "
                   "is checked when the run starts")
    else:
        typer.echo(f"publish: model/ to {repo} ({private} if created) after export, as "
                   f"{the_launch.hub.user} at {the_launch.hub.endpoint} (token checked)")


def _model_line(config) -> str:
    from payload.training.runplan import describe_model

    try:
        return describe_model(config)
    except UserError as exc:  # e.g. an init_from folder on gs:// this machine cannot read
        return f"{config.model.family} (size unknown here: {exc})"


@contextlib.contextmanager
def _shipping_progress(console, num_workers: int):
    """A transient progress bar fed by shipping events: on_event(worker, message)."""
    import threading

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not console.is_terminal:  # a transient bar shows nothing in a pipe or a file
        yield lambda worker, message: None
        return
    lock = threading.Lock()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/"
                  "{task.total} workers"), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        task = progress.add_task("shipping the payload", total=num_workers)

        def on_event(worker, message: str) -> None:
            with lock:
                if message == "ready":
                    progress.advance(task)
                else:
                    progress.update(task, description=f"{worker.label}: {message}")

        yield on_event


@app.command()
def logs(
    config_path: ConfigOpt = DEFAULT_CONFIG,
    worker: WorkerOpt = None,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", "-f",
                                         help="Keep streaming until the job ends.")] = True,
    job: JobOpt = None,
    raw: Annotated[bool, typer.Option("--raw", help="Every line as the workers wrote it (the "
                                      "live view leaves out TensorFlow's chatter and reads "
                                      "progress records).")] = False,
) -> None:
    """Re-attach to a running or finished job's logs, from the start."""
    from launcher import launch

    console = _console()
    with launch.open_job(config_path, job) as opened:
        n = len(opened.plan.workers)
        # --raw into a file (not a terminal) may keep the bytes as the workers wrote them.
        printer = _line_printer(console, n, keep_bytes=not console.is_terminal)
        with (contextlib.nullcontext((printer, None)) if raw
              else _watching(console, n)) as (sink, view):
            outcome = launch.follow(opened, sink, worker=worker, keep_following=follow)
    _report(outcome, opened, config_path, view)


@app.command()
def stop(config_path: ConfigOpt = DEFAULT_CONFIG, job: JobOpt = None) -> None:
    """Stop the job on every worker; nothing is left running."""
    import threading

    from launcher import launch
    from launcher.jobs import STOP_GRACE_S
    from launcher.run import stopped_everywhere
    from launcher.view import visible
    from payload.core.layout import worker_label

    with launch.open_job(config_path, job) as opened:
        workers = opened.plan.workers
        typer.echo(f"stopping job {opened.plan.job_id} on {len(workers)} workers: SIGTERM to "
                   f"each worker's job, SIGKILL to what is left after {STOP_GRACE_S:.0f} s")
        pending, done, guard = {w.index for w in workers}, threading.Event(), threading.Lock()

        def answered(index: int, result: str) -> None:
            with guard:
                pending.discard(index)
                typer.echo(f"{worker_label(index)}: {visible(result)}")

        def waiting() -> None:  # a stop can take a while: say whom it waits for
            while not done.wait(WAITING_EVERY_S):
                with guard:
                    if pending:
                        typer.echo("waiting for " + ", ".join(worker_label(i) for i in
                                                               sorted(pending))
                                   + " (their processes are ending)")
                    else:  # every worker answered: what is left is the lock's release
                        typer.echo("letting the run lock of output_dir go")
                        return

        threading.Thread(target=waiting, daemon=True).start()
        try:
            results = launch.stop_job(opened, on_result=answered)
        finally:
            done.set()
    if not stopped_everywhere(results):
        raise typer.Exit(1)
    typer.echo(f"job {opened.plan.job_id} stopped on every worker")


WAITING_EVERY_S = 3.0


@app.command()
def status(config_path: ConfigOpt = DEFAULT_CONFIG, job: JobOpt = None) -> None:
    """Show the cluster (a TPU's state, workers and cost so far), the job's stage and step, and
    where outputs are."""
    from rich.table import Table
    from rich.text import Text

    from launcher import launch
    from launcher.records import NoJob
    from launcher.view import visible
    from payload.cloud import budget

    console = _console()
    for line in launch.cluster_provider(config_path).describe():
        console.print(line, markup=False)
    limits = budget.describe(launch.load(config_path))
    if limits:
        console.print(limits, markup=False)
    try:
        opened = launch.open_job(config_path, job)
    except NoJob as exc:
        console.print(f"no job yet: {exc.message}", markup=False)
        return
    with opened:
        rows = launch.job_status(opened)
        left_up = launch.tpu_left_up(opened, rows)
    table = Table(title=Text(f"job {opened.plan.job_id}"))
    for column in ("worker", "host", "state", "stage", "step", "exit", "last line"):
        table.add_column(column, overflow="fold")
    for row in rows:
        # Text, not markup: a log line such as "[/job:worker/replica:0/...]" is shown as it is.
        table.add_row(*(Text(visible(cell)) for cell in (
            row["worker"], row["host"], row["state"], row["stage"] or "-", row["step"] or "-",
            "-" if row["rc"] is None else str(row["rc"]), _clip(row["last"], LAST_LINE_CHARS))))
    console.print(table)
    console.print(f"outputs: {opened.plan.output_dir}  logs: {opened.plan.output_dir}/logs  "
                  f"local log copies: {opened.record.folder / 'logs'}", markup=False)
    if left_up:
        console.print(f"WARNING: {left_up}", markup=False, style="bold red")


LAST_LINE_CHARS = 100


def _clip(text: str, limit: int) -> str:
    """The start of a long line (where its time and what it is about stand), marked as cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


@app.command()
def jobs(
    config_path: ConfigOpt = DEFAULT_CONFIG,
    check: Annotated[bool, typer.Option("--check", help="Ask the workers about jobs the "
                                        "launcher did not follow to their end.")] = False,
) -> None:
    """List the run's jobs started from this machine: id, start, stages, state, outputs."""
    from launcher import launch

    found = launch.list_jobs(config_path, check=check)
    if not found:
        typer.echo("no job of this run started from this machine yet")
        return
    _console().print(_jobs_table(found))
    outputs = {job.output_dir for job in found}
    if len(outputs) == 1:
        typer.echo(f"outputs: {outputs.pop()}")
    typer.echo("* the current job (what logs, status and stop take without --job)")
    typer.echo("logs of one: tpuctl logs --job ID; its state now: tpuctl status --job ID")


def _jobs_table(found):
    """The jobs in 80 columns: ids whole on one line, short dates, the full pipeline as `all`,
    and the outputs column only when the jobs wrote to different places."""
    import time

    from rich import box
    from rich.table import Table
    from rich.text import Text

    from payload.core.stages import Stage

    # The pipeline a whole run goes through (publish is added when hub.repo is set).
    pipeline = [s.value for s in Stage if s is not Stage.PUBLISH]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1))
    table.add_column("", no_wrap=True, width=1)
    table.add_column("job", no_wrap=True, min_width=max(len(job.job_id) for job in found))
    table.add_column("started", no_wrap=True)
    table.add_column("stages", overflow="fold")
    table.add_column("state", overflow="fold")
    several = len({job.output_dir for job in found}) > 1
    if several:
        table.add_column("outputs", overflow="fold")
    for job in found:
        core = [s for s in job.stages if s in pipeline]
        stages = "all" if core == pipeline else ", ".join(core)
        if Stage.PUBLISH.value in job.stages:
            stages += " + publish"
        cells = ["*" if job.current else "", job.job_id,
                 time.strftime("%m-%d %H:%M", time.localtime(job.started)), stages, job.state]
        if several:
            cells.append(job.output_dir)
        table.add_row(*(Text(cell) for cell in cells))
    return table


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(
    ctx: typer.Context,
    config_path: ConfigOpt = DEFAULT_CONFIG,
    worker: WorkerOpt = None,
) -> None:
    """Open a shell on a worker, or run `-- CMD` on all workers (or --worker N)."""
    import shlex

    from launcher import launch
    from launcher.executors import on_workers

    workers, executor = launch.open_cluster(config_path)
    chosen = workers if worker is None else (launch.select(workers, worker, of="the cluster"),)
    command = shlex.join(ctx.args) if ctx.args else ""
    with executor:
        if not command:
            if len(chosen) != 1:
                raise UserError("a shell needs one worker", hint="pass --worker N, or a "
                                "command after --")
            raise typer.Exit(executor.interactive(chosen[0]))
        results = on_workers(chosen, lambda w: executor.run(w, command, timeout_s=None))
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
        UserError: lambda e: "\n".join(error_lines(e)),
        WorkerUnreachable: lambda e: one_line(f"{e}; {e.hint}" if e.hint else str(e)),
    }


def _usage_line(exc) -> str:
    """A usage error (a bad option, value or command, as click words it) on one line."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return one_line(exc.format_message()).rstrip(".") + where


def main() -> None:
    """Console entry point: one line and exit status 2 for user mistakes (usage errors
    included), unless TPUCTL_DEBUG."""
    try:
        # Not standalone: click's own multi-line usage report would go around the table below.
        code = app(prog_name="tpuctl", standalone_mode=False)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except typer.TyperException as exc:  # click's usage errors and other ClickExceptions
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(2)  # bare `tpuctl`: the help was printed
        typer.echo(f"error: {_usage_line(exc)}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        table = _error_messages()
        message = next((m for t, m in table.items() if isinstance(exc, t)), None)
        if message is None or os.environ.get("TPUCTL_DEBUG"):
            raise
        from launcher.view import visible

        for line in message(exc).splitlines():  # several problems: one line each
            typer.echo(f"error: {visible(line)}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
