"""The rich output of the commands: worker lines, the live view, how a job ended, the jobs table.

    sink = line_printer(console(), num_workers=2)     # sink(worker, line) prints "worker-0 | ..."
    with watching(console(), 2) as (sink, view): ...  # the live progress line on a terminal

Only this module of the CLI draws with rich; the commands hand it what the use-case returned.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

from payload.core.errors import counted

WORKER_COLOURS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan",
                  "bright_magenta", "bright_green", "bright_yellow", "bright_blue", "red")


TAIL_SHOWN = 20


LAST_LINE_CHARS = 100


def console(stderr: bool = False):
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, stderr=stderr)


def worker_line(num_workers: int, *, keep_bytes: bool = False):
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


def line_printer(console, num_workers: int, *, keep_bytes: bool = False):
    """A thread-safe sink printing every line after its worker's coloured prefix."""
    import threading

    lock = threading.Lock()
    render = worker_line(num_workers, keep_bytes=keep_bytes)

    def sink(worker: int, line: str) -> None:
        with lock:
            console.print(render(worker, line))

    return sink


@contextlib.contextmanager
def watching(console, num_workers: int):
    """A sink showing a job as launcher.view sees it, and that view: on a terminal, training
    progress is one line redrawn below the others until training ends."""
    import threading

    from rich.live import Live

    from launcher.view import View

    view = View(live=console.is_terminal)
    render = worker_line(num_workers)
    lock = threading.Lock()
    live = Live(console=console, auto_refresh=False, transient=False)
    state = {"drawn": None, "on": False}

    def sink(worker: int, line: str) -> None:
        with lock:
            for text in view.feed(worker, line):
                console.print(render(worker, text))
            if view.live and view.progress is not state["drawn"] and not view.training_over:
                state["drawn"] = view.progress
                live.update(progress_line(view.progress, console.width), refresh=state["on"])
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


def progress_line(record: dict, width: int):
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


def stopped_line(job_id: str, words: str | None, config_path: Path, *,
                 everywhere: bool = False) -> str:
    """How a stopped job ended, in its last words (payload.jobs.agent.stop_words), and the
    command that continues it when they name a checkpoint."""
    from launcher import view as views
    from payload.jobs.agent import names_checkpoint

    if not words:
        return f"job {job_id} stopped" + (" on every worker" if everywhere else "")
    line = f"job {job_id}{' stopped on every worker' if everywhere else ''}: {views.visible(words)}"
    if names_checkpoint(words):
        line += f"; `tpuctl train -c {config_path} --resume` continues from it"
    return line


def report(outcome, job, config_path: Path, view=None) -> None:
    """How the job ended, then what is still billing; exit status 1 when it failed (a stopped
    job has not: 0)."""
    failed = report_outcome(outcome, job, config_path, view)
    note = job.provider.billing()
    if note:
        console(stderr=True).print(note, markup=False)
    if failed:
        raise typer.Exit(1)


def report_outcome(outcome, job, config_path: Path, view) -> bool:
    from launcher import view as views
    from payload.core.layout import worker_label

    out = console()
    err = console(stderr=True)
    plan = job.plan
    if outcome.detached:
        err.print(f"\ndetached; job {plan.job_id} keeps running on the workers.\n"
                  f"  re-attach: tpuctl logs -c {config_path}\n"
                  f"  stop:      tpuctl stop -c {config_path}", markup=False)
        return False
    if outcome.stopped:
        out.print("\n" + stopped_line(plan.job_id, outcome.reason, config_path), markup=False)
        return False
    if outcome.ok:
        if outcome.reason:
            out.print(f"job {plan.job_id}: {views.visible(outcome.reason)}", markup=False)
            return False
        final = view.final if view else None
        out.print(f"\njob {plan.job_id} finished on {counted(len(plan.workers), 'worker')}", markup=False)
        for line in views.summary(final=final, family=(final or {}).get("family")
                                  or job.record.model_family(), output_dir=plan.output_dir,
                                  exported=any(s.name == "export" for s in plan.steps)):
            out.print(views.visible(line), markup=False)
        out.print(f"outputs: {plan.output_dir}  (logs: {plan.output_dir}/logs, local copies: "
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


@contextlib.contextmanager
def shipping_progress(console, num_workers: int):
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


def clip(text: str, limit: int) -> str:
    """The start of a long line (where its time and what it is about stand), marked as cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def jobs_table(found):
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


def goodput_lines(config_path: Path) -> list[str]:
    """The run's goodput in a few lines (launcher.goodput), for `status` and the end of a run;
    nothing when there is no ledger to read or it cannot be read from here."""
    from launcher import goodput, launch

    try:
        return goodput.report_lines(goodput.run_report(launch.load(config_path)))
    except Exception:  # a report is worth no failed command
        return []
