"""The job's commands: `tpuctl logs`, `stop`, `jobs` and `ssh`.

    tpuctl logs --worker 1 --no-follow
    tpuctl jobs
"""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from launcher.cli import render
from launcher.cli.options import DEFAULT_CONFIG, ConfigOpt, JobOpt, WorkerOpt
from payload.core.errors import UserError


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

    console = render.console()
    with launch.open_job(config_path, job) as opened:
        n = len(opened.plan.workers)
        # --raw into a file (not a terminal) may keep the bytes as the workers wrote them.
        printer = render.line_printer(console, n, keep_bytes=not console.is_terminal)
        with (contextlib.nullcontext((printer, None)) if raw
              else render.watching(console, n)) as (sink, view):
            outcome = launch.follow(opened, sink, worker=worker, keep_following=follow)
    render.report(outcome, opened, config_path, view)


def stop(config_path: ConfigOpt = DEFAULT_CONFIG, job: JobOpt = None) -> None:
    """Stop the job on every worker; nothing is left running."""
    import threading

    from launcher import launch
    from launcher.job_shell import STOP_GRACE_S
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
            stopped = launch.stop_job(opened, on_result=answered)
        finally:
            done.set()
    if not stopped.stopped:
        raise typer.Exit(1)
    if stopped.already_ended:
        typer.echo(f"job {opened.plan.job_id} had already ended on every worker: nothing to stop")
        return
    typer.echo(render.stopped_line(opened.plan.job_id, stopped.words, config_path,
                                   everywhere=True))


WAITING_EVERY_S = 3.0


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
    console = render.console()
    console.print(render.jobs_table(found))
    outputs = {job.output_dir for job in found}
    if len(outputs) == 1:
        path = outputs.pop()
        if len(f"outputs: {path}") <= console.width:
            typer.echo(f"outputs: {path}")
        else:  # on a line of its own, cut at the edge (a terminal would wrap it anyway)
            typer.echo("outputs:")
            for start in range(0, len(path), console.width):
                typer.echo(path[start:start + console.width])
    typer.echo("* the current job (what logs, status and stop take without --job)")
    typer.echo("logs of one: tpuctl logs --job ID; its state now: tpuctl status --job ID")


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
    sink = render.line_printer(render.console(), len(workers))
    for w, res in zip(chosen, results, strict=True):
        for line in (res.stdout + res.stderr).splitlines():
            sink(w.index, line)
    if any(not r.ok for r in results):
        raise typer.Exit(1)
