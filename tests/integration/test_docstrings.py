"""Every module's usage example stays true: the functions it calls exist and take the arguments
shown, the `tpuctl` commands and options it shows exist, and so do `python -m payload` stages.

A module docstring opens with one line of purpose, then an indented example. The example is
parsed as Python (shell lines excepted) and every call whose target the module can name is
checked against the real signature, so renaming a function or a parameter without updating the
example fails here.
"""

from __future__ import annotations

import ast
import importlib
import textwrap

import pytest

from tests.support.docstring_examples import (
    bound_names,
    check_call,
    check_shell,
    check_types,
    resolve,
)
from tests.support.paths import REPO

PACKAGES = ("launcher", "payload")
SHELL_PREFIXES = ("tpuctl ", "python -m ", "python3 -m ", "make ", "pip ")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _example_blocks(doc: str) -> list[str]:
    """The indented blocks of a docstring (its usage examples), dedented."""
    blocks, current = [], []
    for line in doc.splitlines()[1:]:
        if line.startswith("    ") or (current and not line.strip()):
            current.append(line)
        else:
            if current:
                blocks.append(textwrap.dedent("\n".join(current)).strip("\n"))
            current = []
    if current:
        blocks.append(textwrap.dedent("\n".join(current)).strip("\n"))
    return [b for b in blocks if b.strip()]


def _split_shell(block: str) -> tuple[list[str], str]:
    """(shell lines, the rest as Python source with the shell lines blanked)."""
    shell, python = [], []
    for line in block.splitlines():
        if line.lstrip().startswith(SHELL_PREFIXES):
            command = line.split("  #")[0].strip()
            shell.extend(part.strip() for part in command.split("&&"))
            python.append("")
        else:
            python.append(line)
    return shell, "\n".join(python)
















@pytest.mark.parametrize("name", _modules())
def test_module_usage_example_is_true(name):
    module = importlib.import_module(name)
    doc = module.__doc__
    assert doc and doc.strip(), f"{name} has no docstring"
    for block in _example_blocks(doc):
        shell, source = _split_shell(block)
        for line in shell:
            check_shell(line, name)
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise AssertionError(f"{name}: its usage example is not Python: {exc}\n{block}") from None
        bound = bound_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(imported, alias.name), f"{name}: {node.module} has no " \
                        f"{alias.name}"
            if isinstance(node, ast.Call):
                target = resolve(node.func, module, bound)
                if target is not None and callable(target):
                    check_call(node, target, module)
        check_types(tree, module)


