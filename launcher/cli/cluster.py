"""The cluster's commands: `tpuctl up`, `down`, `doctor` and `status`.

    tpuctl up --dry-run
    tpuctl status
"""

from __future__ import annotations

from typing import Annotated

import typer

from launcher.cli import render
from launcher.cli.options import DEFAULT_CONFIG, ConfigOpt, DryRunOpt, JobOpt


def up(config_path: ConfigOpt = DEFAULT_CONFIG, dry_run: DryRunOpt = False) -> None:
    """Create what `cluster` describes (Terraform for gcp), wait until READY, trust its host
    keys from the TPU API; --dry-run shows what and the price per hour, without credentials."""
    from launcher import launch

    if dry_run:
        for line in launch.cluster_provider(config_path).up_plan():
            typer.echo(line)
        return
    console = render.console()
    launch.bring_up(config_path, on_event=lambda message: console.print(message, markup=False))


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

    console = render.console()
    launch.take_down(config_path, on_event=lambda message: console.print(message, markup=False),
                     delete_bucket=delete_bucket)


def doctor(config_path: ConfigOpt = DEFAULT_CONFIG) -> None:
    """Check a set-up before anything is created: credentials, API, type and runtime in the
    zone, org policies, SSH, bucket; one line per check. Exit status 1 if one needs fixing."""
    from launcher import launch

    results = launch.cluster_provider(config_path).doctor()
    for check in results:
        typer.echo(check.line())
    if any(check.verdict == "fix" for check in results):
        raise typer.Exit(1)


def status(config_path: ConfigOpt = DEFAULT_CONFIG, job: JobOpt = None) -> None:
    """Show the cluster (a TPU's state, workers and cost so far), the job's stage and step, and
    where outputs are."""
    from rich.table import Table
    from rich.text import Text

    from launcher import launch
    from launcher.records import NoJob
    from launcher.view import visible
    from payload.cloud import budget

    console = render.console()
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
            "-" if row["rc"] is None else str(row["rc"]), render.clip(row["last"], render.LAST_LINE_CHARS))))
    console.print(table)
    console.print(f"outputs: {opened.plan.output_dir}  logs: {opened.plan.output_dir}/logs  "
                  f"local log copies: {opened.record.folder / 'logs'}", markup=False)
    for line in render.goodput_lines(config_path):
        console.print(line, markup=False)
    if left_up:
        console.print(f"WARNING: {left_up}", markup=False, style="bold red")
