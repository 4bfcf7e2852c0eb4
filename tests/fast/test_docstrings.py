"""Every module's usage example stays true: the functions it calls exist and take the arguments
shown, the `tpuctl` commands and options it shows exist, and so do `python -m payload` stages.

A module docstring opens with one line of purpose, then an indented example. The example is
parsed as Python (shell lines excepted) and every call whose target the module can name is
checked against the real signature, so renaming a function or a parameter without updating the
example fails here.
"""

from __future__ import annotations

import ast

import pytest

from tests.support.docstring_examples import (
    check_call,
    check_shell,
    check_types,
    resolve,
)


def test_the_checker_catches_a_stale_example():
    """A wrong argument name, a missing function and a missing command are all caught."""
    from launcher import plan

    stale = ast.parse("parse_stages(text=None, extra=1)").body[0].value
    with pytest.raises(AssertionError, match="does not fit"):
        check_call(stale, plan.parse_stages, plan)
    with pytest.raises(AssertionError, match="does not have"):
        resolve(ast.parse("no_such_function()").body[0].value.func, plan, set())
    with pytest.raises(AssertionError, match="does not exist"):
        check_shell("tpuctl no-such-command", "x")
    with pytest.raises(AssertionError, match="has no option"):
        check_shell("tpuctl train --no-such-option", "x")
    from launcher import job_shell, records

    with pytest.raises(AssertionError, match="returns one Poll"):
        check_types(ast.parse("state, lines = parse_poll(output)"), job_shell)
    with pytest.raises(AssertionError, match="JobRecord has no logbook"):
        check_types(ast.parse("r = current_job(base, 'x')\nr.logbook()"), records)
