"""Running measurements in their own Python processes, with this checkout on the path.

    out = run_python(["-m", "payload", "prepare", "--config", path])
    figures = json_run(["-m", "bench.measure", "ceiling", tokenizer, text])
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def env() -> dict:
    """This process's environment with the checkout importable, TensorFlow quiet, tf-keras
    in use, and no inherited TF_CONFIG (a measurement runs alone)."""
    out = dict(os.environ)
    out["PYTHONPATH"] = str(REPO) + os.pathsep + out.get("PYTHONPATH", "")
    out.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    out["TF_USE_LEGACY_KERAS"] = "1"
    out.pop("TF_CONFIG", None)
    return out


def run_python(args: list[str]) -> str:
    """`python ARGS` from the checkout; its stdout, or RuntimeError with its stderr's tail."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env(),
                          cwd=REPO, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{args[:3]} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def json_run(args: list[str]) -> dict:
    """The JSON object a measurement prints as its last line."""
    return json.loads(run_python(args).strip().splitlines()[-1])
