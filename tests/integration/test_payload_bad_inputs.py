"""The payload's bad-input catalogue (issue 8): every input below ends with one line naming the
key or value, exit status 2, no traceback, and nothing created.

Each case builds its inputs under `case/` and runs either a stage (`python -m payload ...`,
checked by exit status and stderr) or the launcher's pre-flight (`check_before_start`, which
raises the one-line `UserError`); everything under the test's folder is compared before and
after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.payload_inputs import config, tree
from tests.support.runners import assert_user_error, payload_env


def _unreadable(root: Path) -> Path:
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("root reads any file; needs setpriv to drop that capability")
    path = config(root)
    path.chmod(0)
    return path




def test_an_unreadable_config_is_one_line_exit_2_and_creates_nothing(tmp_path):
    """As a process: root reads any file, so it first drops the capabilities that let it, as a
    user would lack them."""
    case = tmp_path / "case"
    case.mkdir()
    config = _unreadable(case)
    before = tree(tmp_path)
    command = [sys.executable, "-m", "payload", "tokenizer", "--config", str(config)]
    if os.geteuid() == 0:
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                   "--inh-caps=-dac_override,-dac_read_search", *command]
    result = subprocess.run(command, env=payload_env(), capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert_user_error(result, "cannot read", "run.yaml", "Permission denied")
    assert tree(tmp_path) == before, "something was created or changed"
