"""The launcher's early refusal of a checkpoint clash, before anything starts."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import REPO


def test_check_start_needs_no_tensorflow():
    code = ("import sys, payload.training.checkpoints as c; c.check_start('/nonexistent', resume=False, "
            "overwrite=False); print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr
