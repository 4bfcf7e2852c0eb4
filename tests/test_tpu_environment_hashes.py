"""A TPU environment installs hash-pinned wheels only (issue 27, item 7): every package of an
engine's lock, and the uv that brings the JAX route's Python, is installed from a requirements
file of `PIN --hash=sha256:HEX` lines with --require-hashes --only-binary=:all: --no-deps, so
a wheel that is not the one locked is refused; and real pip does refuse it."""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from launcher.environment import (
    HASH_PINNED,
    hash_pinned_install,
    hashed,
    plan_environment,
    tpu_lock,
    tpu_lock_hashes,
    uv_lock,
)

REQS = ("tensorflow==2.20.0", "tf-keras==2.20.1", "jax==0.10.2")
HASH_LINE = re.compile(r"^(\S+==\S+) --hash=sha256:([0-9a-f]{64})$")


def pip_installs(setup: str) -> list[tuple[list[str], list[str]]]:
    """(pip's arguments, the requirement lines it reads) for every pip install of a set-up."""
    written, found = {}, []
    for part in setup.split(" && "):
        words = shlex.split(part)
        if words[:1] == ["printf"]:
            end = words.index(">")
            written[words[end + 1]] = words[2:end]
        elif "install" in words and words[words.index("install") - 1] == "pip":
            args = words[words.index("install") + 1:]
            files = [a.split("=", 1)[1] for a in args if a.startswith("--requirement=")]
            found.append((args, [line for f in files for line in written[f]]))
    return found


@pytest.mark.parametrize("engine", ["tensorflow", "jax"])
@pytest.mark.parametrize("wheelhouse", [None, "w1"])
def test_every_tpu_install_is_hash_pinned_wheels_only(engine, wheelhouse):
    env = plan_environment(python=None, wheelhouse_digest=wheelhouse, requirements=REQS,
                           tpu=True, engine=engine)
    installs = pip_installs(env.setup[2])
    assert installs
    pinned = []
    for args, lines in installs:
        assert set(HASH_PINNED) <= set(args), args  # no pip install that is not hash-checked
        assert not [a for a in args if not a.startswith("-") and "://" not in a
                    and not a.startswith(".tpuctl/wheelhouse")], args  # no bare requirement
        for line in lines:
            match = HASH_LINE.match(line)
            assert match, line
            pinned.append(match.group(1))
    uv = list(uv_lock()[0]) if engine == "jax" else []
    assert sorted(pinned) == sorted([*tpu_lock(engine), *uv])


def test_every_pin_of_every_lock_has_its_hash():
    for engine in ("tensorflow", "jax"):
        assert set(tpu_lock_hashes(engine)) == set(tpu_lock(engine)), engine
    pins, sha256 = uv_lock()
    assert set(pins) <= set(sha256)
    with pytest.raises(ValueError, match=r"no hash for b==2.*--keep-pins"):
        hashed(("a==1", "b==2"), {"a==1": "0" * 64})


def test_the_hashes_are_part_of_the_environment_key(monkeypatch):
    from launcher import tpu_lock as locks

    before = plan_environment(python=None, wheelhouse_digest=None, requirements=REQS, tpu=True)
    pin = locks.TPU_LOCK[0]
    monkeypatch.setitem(locks.TPU_LOCK_SHA256, pin, "0" * 64)
    after = plan_environment(python=None, wheelhouse_digest=None, requirements=REQS, tpu=True)
    assert after.key != before.key  # another file is another environment


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
