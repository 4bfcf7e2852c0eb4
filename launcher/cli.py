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
    help="Pretrain language models on Cloud TPUs: from raw text to a Hugging Face model.",
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


def main() -> None:
    """Console entry point: one line and exit status 2 for user mistakes, unless TPUCTL_DEBUG."""
    try:
        app()  # standalone: usage errors print themselves and exit 2
    except UserError as exc:
        if os.environ.get("TPUCTL_DEBUG"):
            raise
        typer.echo(f"error: {one_line(str(exc))}", err=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
