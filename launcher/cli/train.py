"""`tpuctl init` and `tpuctl train`: write a config to start from; run the pipeline.

    tpuctl init .
    tpuctl train --local --workers 2
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Annotated

import typer

from launcher.cli import render
from launcher.cli.options import DEFAULT_CONFIG, ConfigOpt, DryRunOpt
from payload.core.errors import UserError, counted


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
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Do every stage that runs "
                                            "again over its earlier outputs (removing only "
                                            "what tpuctl wrote).")] = False,
    new_data_order: Annotated[bool, typer.Option(
        "--new-data-order", help="With --resume: continue although train.seed or the prepared "
        "data changed, in their new order from the same example offset.")] = False,
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
    engine: Annotated[str | None, typer.Option(
        "--engine", metavar="NAME", help="Train with this engine for this run: tensorflow or "
        "jax (sets train.engine).")] = None,
    compile_steps: Annotated[bool, typer.Option(
        "--compile", help="With --dry-run: compile the JAX engine's steps for the config's TPU "
        "(or --accelerator's) with the real TPU compiler on this machine; memory per chip, "
        "attention kernel, FLOPs.")] = False,
    accelerator: Annotated[str | None, typer.Option(
        "--accelerator", metavar="TYPE", help="With --compile: the TPU slice to compile for "
        "(e.g. v5litepod-4), whatever the provider.")] = None,
) -> None:
    """Ship the payload to every worker, set up its environment, run the pipeline stages."""
    from launcher import launch
    from launcher import plan as planning

    if num_workers is not None and num_workers < 1:
        raise UserError(f"--workers {num_workers}: need at least 1 worker")
    if compile_steps and not dry_run:
        raise UserError("--compile goes with --dry-run", hint="tpuctl train --dry-run --compile")
    if accelerator and not compile_steps:
        raise UserError("--accelerator goes with --compile",
                        hint="tpuctl train --dry-run --compile --accelerator TYPE")
    options = launch.TrainOptions(
        local=local, num_workers=num_workers, stages=planning.parse_stages(stages),
        resume=resume, overwrite=overwrite, new_data_order=new_data_order, dry_run=dry_run,
        down=down,
        auto_resume=auto_resume, max_hours=max_hours, max_cost=max_cost,
        push_to_hub=push_to_hub, download=download, engine=engine)
    the_launch = launch.plan_train(config_path, options)
    if compile_steps:
        from launcher import tpu_compile

        tpu_compile.check_can_compile(the_launch.config)
        target = tpu_compile.compile_target(the_launch, accelerator=accelerator)
    if dry_run:
        typer.echo(planning.render_plan(the_launch.plan))
        typer.echo(f"model: {model_line(the_launch.config)}")
        typer.echo(f"engine: {the_launch.config.train.engine}")
        price = the_launch.provider.price()
        if price:
            typer.echo(f"cost: {price}")
        if down:
            typer.echo("when the job ends: worker 0 deletes the TPU (--down)")
        print_run_plan(*run_plan_lines(the_launch, read_remote=False))
        print_publishing(the_launch)
        if compile_steps:
            report = tpu_compile.compile_steps(the_launch, target, on_note=typer.echo)
            for line in tpu_compile.render(report):
                typer.echo(line)
        return
    console = render.console()

    def note(message: str) -> None:
        console.print(message, markup=False)

    def started(job) -> None:
        work = job.set_up
        console.print(f"workers ready ({'set up: ' + ', '.join(work) if work else 'all cached'})")
        console.print(f"job {job.plan.job_id} started on {counted(len(job.plan.workers), 'worker')} "
                      f"(stages: {', '.join(s.name for s in job.plan.steps)})", markup=False)

    # Worked out before the workers start (they would share the cores a CPU estimate probes),
    # shown once the job has started (a refusal at start stays the only line printed).
    plan_lines = run_plan_lines(the_launch, read_remote=True)
    with render.shipping_progress(console, len(the_launch.plan.workers)) as on_event:
        job = launch.start(the_launch, on_event=on_event, on_note=note)
    started(job)
    print_run_plan(*plan_lines)
    print_publishing(the_launch)
    if detach:
        job.close()
        console.print(f"follow it with `tpuctl logs -c {config_path}`", markup=False)
        return
    with render.watching(console, len(job.plan.workers)) as (sink, view):
        job, outcome = launch.follow_to_end(the_launch, job, sink=sink, on_note=note,
                                            on_started=started)
    launch.finish(the_launch, job, outcome, on_note=note)
    try:
        render.report(outcome, job, config_path, view)
    finally:
        if not outcome.detached:
            for line in render.goodput_lines(config_path):
                note(line)


def run_plan_lines(the_launch, *, read_remote: bool) -> tuple[list[str], list[str]]:
    """The run's figures (parameters, tokens, FLOPs, time, cost), and warnings: mis-sizing and
    settings the run will not use."""
    from launcher.estimate import describe

    return describe(the_launch, read_remote=read_remote)


def print_run_plan(lines: list[str], warnings: list[str]) -> None:
    for line in lines:
        typer.echo(line)
    for line in warnings:
        typer.echo(f"warning: {line}", err=True)


def print_publishing(the_launch) -> None:
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


def model_line(config) -> str:
    from payload.training.runplan import describe_model

    try:
        return describe_model(config)
    except UserError as exc:  # e.g. an init_from folder on gs:// this machine cannot read
        return f"{config.model.family} (size unknown here: {exc})"
