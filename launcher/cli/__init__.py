"""The `tpuctl` command line: a thin layer that validates input and hands off to plain functions.

    tpuctl init .
    tpuctl train --local --workers 2
    tpuctl logs --worker 1 --no-follow

One module per command group (train: init, train; cluster: up, down, doctor, status; jobs:
logs, stop, jobs, ssh; goodput), the shared options in `options`, the rich output in `render`, the
exception -> one line table in `errors`. Each command parses its options, calls the use-case
(launcher.launch: plans, starts and reopens jobs, decides teardown and download; it prints
nothing) and shows what came back. Heavy libraries (TensorFlow, transformers, cloud clients)
are imported inside commands only, so `tpuctl --help` answers at once. Every user mistake is a
`UserError` caught once, in `main`.
"""

from __future__ import annotations

import os
import sys

import typer

from launcher.cli import cluster, goodput, jobs, train
from launcher.cli.errors import error_messages, usage_line

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


# In the order `tpuctl --help` has always listed them.
for command in (train.init, cluster.up, cluster.down, cluster.doctor, train.train, jobs.logs,
                jobs.stop, cluster.status, jobs.jobs, goodput.goodput):
    app.command()(command)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(jobs.ssh)


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
        typer.echo(f"error: {usage_line(exc)}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        table = error_messages()
        message = next((m for t, m in table.items() if isinstance(exc, t)), None)
        if message is None or os.environ.get("TPUCTL_DEBUG"):
            raise
        from launcher.view import visible

        for line in message(exc).splitlines():  # several problems: one line each
            typer.echo(f"error: {visible(line)}", err=True)
        sys.exit(getattr(exc, "exit_code", 2))
    sys.exit(code if isinstance(code, int) else 0)
