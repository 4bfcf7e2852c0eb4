"""Write launcher/tpu_lock.py: every package a TPU worker's environment installs, pinned, as pip
resolves pyproject's `worker` set (TensorFlow as tensorflow-tpu) plus the exact libtpu for the
TPU VM images' Python (3.10 on Ubuntu 22.04) on manylinux x86_64.

    python scripts/tpu_lock.py          # resolve (pip install --dry-run --report) and write it

The workers then install exactly this list with --no-deps: nothing is left for pip to pick on
the day, so a newer release of any dependency cannot change a run. tests/test_plan.py checks
that the list still satisfies pyproject's requirements.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "launcher" / "tpu_lock.py"
PYTHON_VERSION = "3.10"
# tensorflow-tpu 2.20.0's own METADATA asks for `libtpu~=0.0.14` (which lets pip take any 0.0.x
# release after it); the exact release named there is the one pinned.
LIBTPU = "libtpu==0.0.14"
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64",
             "linux_x86_64")


def worker_requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["worker"])


def main() -> None:
    sys.path.insert(0, str(REPO))
    from launcher.environment import tpu_requirements

    normal, nodeps = tpu_requirements(tuple(worker_requirements()))
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
                "--quiet", "--report", str(report), "--target", str(Path(tmp) / "t"),
                "--python-version", PYTHON_VERSION, "--implementation", "cp",
                "--only-binary=:all:", *[f"--platform={p}" for p in PLATFORMS],
                *normal, LIBTPU]
        subprocess.run(argv, check=True)
        found = json.loads(report.read_text())["install"]
    pins = sorted(f"{item['metadata']['name'].lower().replace('_', '-')}=="
                  f"{item['metadata']['version']}" for item in found)
    lines = [f'    "{pin}",' for pin in [*pins, *nodeps]]
    OUT.write_text(
        '"""Every package a TPU worker\'s environment installs, exactly (written by\n'
        "scripts/tpu_lock.py: pip's resolution of pyproject's worker set, TensorFlow as\n"
        f"tensorflow-tpu, plus {LIBTPU}, for CPython {PYTHON_VERSION} on manylinux x86_64; tf-keras\n"
        'last, as pyproject pins it: it is installed without its dependencies too).\n"""\n\n'
        "TPU_LOCK: tuple[str, ...] = (\n" + "\n".join(lines) + "\n)\n")
    print(f"wrote {OUT} ({len(pins) + len(nodeps)} packages)")


if __name__ == "__main__":
    main()
