"""`tpuctl --help` and every command's help read well in 80 columns: no line is cut before the
terminal's edge (a docstring's own line breaks used to split phrases such as "trust its host /
keys") and nothing is cut off with an ellipsis."""

from __future__ import annotations

import itertools

import pytest

from launcher.cli import app
from tests.support.paths import REPO
from tests.support.runners import tpuctl

WIDTH = 80
COMMANDS = [[]] + [[command.name or command.callback.__name__]
                   for command in app.registered_commands]


def _help(args: list[str]) -> list[str]:
    result = tpuctl(*args, "--help", env={"COLUMNS": str(WIDTH), "TERM": "dumb"}, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _early_breaks(lines: list[str]) -> list[str]:
    """Lines that end before the next line's first word had to move down: a continuation line
    (its text starts in the column where the text of the line above starts, with nothing left
    of it) follows a line that had room for that word."""
    found = []
    for above, line in itertools.pairwise(lines):
        boxed = line.startswith("│")
        text = line.strip("│ ")
        if not text or text.startswith("[") or above.startswith(("╭", "╰")):
            continue
        start = len(line) - len(line.lstrip("│ ")) if boxed else len(line) - len(line.lstrip())
        if boxed and start <= 2:
            continue  # a new row: its first column is filled
        if start >= len(above) or above[start] == " " or above[start - 1] != " ":
            continue  # the line above has no text starting in this column
        if above[start:].strip("│ ").startswith(("[", "Usage")):
            continue
        right = line.rfind("│") if boxed else WIDTH
        room = right - start - (1 if boxed else 0)  # the cell's width, less its padding
        used = len(above[start:right].rstrip())
        if used + 1 + len(text.split()[0]) <= room:
            found.append(f"{above.rstrip()}\n{line.rstrip()}")
    return found


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a) or "tpuctl" for a in COMMANDS])
def test_help_fits_80_columns_without_early_breaks(args):
    lines = _help(args)
    assert all(len(line) <= WIDTH for line in lines), "\n".join(lines)
    assert "…" not in "\n".join(lines), "\n".join(lines)  # nothing cut off
    early = _early_breaks(lines)
    assert not early, "lines broken before the edge:\n" + "\n\n".join(early)
