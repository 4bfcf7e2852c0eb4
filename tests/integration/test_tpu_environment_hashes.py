"""A TPU environment installs hash-pinned wheels only (issue 27, item 7): every package of an
engine's lock, and the uv that brings the JAX route's Python, is installed from a requirements
file of `PIN --hash=sha256:HEX` lines with --require-hashes --only-binary=:all: --no-deps, so
a wheel that is not the one locked is refused; and real pip does refuse it."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from launcher.worker_python import (
    hash_pinned_install,
    hashed,
)


def tiny_wheel(folder: Path, name: str = "tpuctl_probe", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel, built by hand (the format is a zip with a RECORD)."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": b"VALUE = 1\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 .encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    record = []
    for arc, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arc},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    with zipfile.ZipFile(path, "w") as archive:
        for arc, data in files.items():
            archive.writestr(arc, data)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def test_pip_installs_the_locked_wheel_and_refuses_any_other(tmp_path):
    """The set-up's install line, run by a real shell and pip: the wheel of the locked hash
    goes in; the same name and version with another hash (a replaced or rebuilt file) does
    not, and nothing is installed."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = tiny_wheel(wheels)
    good = hashlib.sha256(wheel.read_bytes()).hexdigest()
    source = ["--no-index", "--find-links", str(wheels)]

    def install(sha: str, target: Path) -> subprocess.CompletedProcess:
        pip = [sys.executable, "-m", "pip", "--isolated", "install", "--quiet",
               "--disable-pip-version-check", "--target", str(target)]
        line = hash_pinned_install(pip, source, hashed(("tpuctl-probe==1.0",),
                                                       {"tpuctl-probe==1.0": sha}),
                                   str(tmp_path / f"lock-{sha[:8]}.txt"))
        return subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=120)

    ok = install(good, tmp_path / "good")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "good" / "tpuctl_probe" / "__init__.py").exists()
    bad = install("0" * 64, tmp_path / "bad")
    assert bad.returncode != 0
    assert "DO NOT MATCH THE HASHES" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad" / "tpuctl_probe").exists()
