"""A run of the suite that skips tests for a missing tool says so at the end: which groups were
skipped and the command that installs what they need (issue 15), so a laptop run that covers
less than CI does not pass for a full one."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import REPO


def test_a_skip_for_a_missing_tool_is_named_in_the_summary_with_its_install_command():
    # No terraform on this PATH: the fmt check skips, and the summary says what to run.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
         "tests/integration/test_infra.py::test_terraform_fmt_check_passes"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stdout[-2000:]
    summary = result.stdout[result.stdout.index("what this machine lacks"):]
    assert "1 skipped: Terraform  ->  make setup-terraform" in summary, result.stdout


