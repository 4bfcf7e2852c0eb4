"""Write launcher/tpu_lock.py: every package a TPU worker's environment installs, pinned, one exact
lock per engine's route, as pip resolves pyproject's sets for that route's Python on manylinux
x86_64 (the TPU VMs' platform).

    python scripts/write_tpu_lock.py        # resolve every route (pip install --dry-run --report)
    python scripts/write_tpu_lock.py jax    # only the JAX route; the others' pins stay as they are
    python scripts/write_tpu_lock.py --keep-pins   # the same pins, hashes (re)read from the index

- tensorflow (TPU_LOCK): the `worker` set with TensorFlow as tensorflow-tpu, plus the libtpu
  tensorflow-tpu was built with, for the images' own CPython 3.10.
- jax (JAX_TPU_LOCK): the `worker` and `jax` sets with jax as jax[tpu] (which names its libtpu
  release itself) and TensorFlow as tensorflow-cpu, for the CPython the route brings with uv
  (payload.core.engines.JAX_TPU_PYTHON).

Each pin comes with the sha256 of the wheel the package index serves for it (from the same
report: pip's `download_info`), and so does the uv that brings the JAX route's Python
(launcher.worker_python.UV_VERSION). The workers then install exactly this list with --no-deps
--require-hashes --only-binary :all:: nothing is left for pip to pick on the day, so a newer
release of any dependency cannot change a run, and a file that is not the one locked (a
replaced upload, a mirror's own build, an sdist to build) is refused. tests/test_plan.py checks
that each list still satisfies pyproject's requirements, that every pin has its hash, and that
the file is what `render` writes.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "launcher" / "tpu_lock.py"
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64",
             "linux_x86_64")
# tensorflow-tpu 2.20.0's own METADATA asks for `libtpu~=0.0.14` (which lets pip take any 0.0.x
# release after it); the exact release named there is the one pinned.
TF_LIBTPU = "libtpu==0.0.14"
# The index the workers install from (pip's default), asked with this machine's pip settings
# left out (--isolated): a local mirror, wheel folder or constraint must not shape the lock.
INDEX = "https://pypi.org/simple"
# The CPython uv runs under on a TPU VM: the images' own (it installs the route's Python).
HOST_PYTHON = "3.10"


@dataclass(frozen=True, kw_only=True)
class Lock:
    """One route's lock as the file holds it: its engine, the Python it is for, where its libtpu
    pin comes from, and the pins (tf-keras last: installed without its dependencies too)."""

    engine: str
    python: str  # X.Y
    libtpu_source: str
    pins: tuple[str, ...]
    sha256: dict[str, str] = field(default_factory=dict)  # pin -> its wheel's sha256


def _route(engine: str):
    sys.path.insert(0, str(REPO))
    from launcher import worker_python
    from payload.core.engines import engine_spec

    return worker_python, engine_spec(engine).tpu_route


def python_of(engine: str) -> str:
    """X.Y of the CPython the route's workers run: the images' 3.10, or what the route brings."""
    _, route = _route(engine)
    return ".".join(route.python.split(".")[:2]) if route.python else "3.10"


def requirements_of(engine: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(resolved, installed without dependencies) requirements of a route, from pyproject."""
    worker_python, _ = _route(engine)
    from payload.core.engines import engine_spec

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in engine_spec(engine).extras:
        wanted += project["optional-dependencies"][extra]
    return worker_python.tpu_requirements(tuple(wanted), engine)


def pip_report(requirements, python: str, *, deps: bool = True) -> list[dict]:
    """What `pip install` would install for `python` on manylinux x86_64, wheels only, from
    INDEX (its report's `install` list; nothing is installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run",
                "--ignore-installed", "--quiet", "--report", str(report), "--target",
                str(Path(tmp) / "t"), "--index-url", INDEX, "--python-version", python,
                "--implementation", "cp", "--only-binary=:all:",
                *[f"--platform={p}" for p in PLATFORMS], *([] if deps else ["--no-deps"]),
                *requirements]
        subprocess.run(argv, check=True)
        return json.loads(report.read_text())["install"]


def _pin(item: dict) -> str:
    return f"{_dist(item['metadata']['name'])}=={item['metadata']['version']}"


def hashes(pins, python: str) -> dict[str, str]:
    """Each exact pin's wheel sha256, as the index serves it for `python` (no dependencies
    followed: the pins are the whole set)."""
    found = {_pin(item): item["download_info"]["archive_info"]["hashes"]["sha256"]
             for item in pip_report(pins, python, deps=False)}
    missing = [pin for pin in pins if _canonical(pin) not in found]
    if missing:
        sys.exit(f"the index gave no wheel for {', '.join(missing)}")
    return {pin: found[_canonical(pin)] for pin in pins}


def _canonical(pin: str) -> str:
    name, version = pin.split("==", 1)
    return f"{_dist(name)}=={version}"


def resolve(engine: str) -> Lock:
    """pip's resolution of the route (it asks the package index), with each pin's hash."""
    normal, nodeps = requirements_of(engine)
    python = python_of(engine)
    extra = (TF_LIBTPU,) if engine == "tensorflow" else ()
    found = pip_report([*normal, *extra], python)
    pins = sorted(_pin(item) for item in found)
    if engine == "tensorflow":
        source = f"tensorflow-tpu's own metadata: libtpu~=0.0.14, pinned as {TF_LIBTPU}"
    else:
        jax = next(item for item in found if _dist(item["metadata"]["name"]) == "jax")
        wanted = [r for r in jax["metadata"].get("requires_dist", [])
                  if r.startswith("libtpu") and "tpu" in r.split(";", 1)[-1]]
        source = (f"jax {jax['metadata']['version']}'s own metadata: "
                  + "; ".join(w.split(";")[0].strip() for w in wanted))
    pins = (*pins, *nodeps)
    return Lock(engine=engine, python=python, libtpu_source=source, pins=pins,
                sha256=hashes(pins, python))


def _dist(name: str) -> str:
    return name.lower().replace("_", "-")


# The lock's name in the file for each route (payload.core.engines: TpuRoute.lock names the same).
NAMES = {"tensorflow": "TPU_LOCK", "jax": "JAX_TPU_LOCK"}
# The uv the JAX route's set-up installs, with its wheel's hash (launcher.worker_python.UV_VERSION).
UV = "UV_LOCK_SHA256"


def _hash_table(name: str, sha256: dict[str, str]) -> str:
    body = "".join(f'    "{pin}": "{digest}",\n' for pin, digest in sha256.items())
    return f"{name}: dict[str, str] = {{\n{body}}}\n"


def render(locks: dict[str, Lock], uv: dict[str, str] | None = None) -> str:
    """The text of launcher/tpu_lock.py for these locks (in NAMES' order) and uv's hash."""
    notes, tuples = [], []
    for engine, name in NAMES.items():
        lock = locks[engine]
        notes.append(f"{name}: train.engine {engine}, CPython {lock.python}; libtpu from "
                     f"{lock.libtpu_source}.")
        meta = (f"{name}_PYTHON = {lock.python!r}\n"
                f"{name}_LIBTPU_SOURCE = {lock.libtpu_source!r}\n")
        body = "\n".join(f'    "{pin}",' for pin in lock.pins)
        tuples.append(f"{meta}{name}: tuple[str, ...] = (\n{body}\n)\n"
                      + _hash_table(f"{name}_SHA256", lock.sha256))
    if uv is not None:
        tuples.append(_hash_table(UV, uv))
    return (
        '"""Every package a TPU worker\'s environment installs, exactly, one lock per engine\'s '
        "route.\n\n    from launcher.worker_python import tpu_lock\n"
        '    tpu_lock("jax")     # JAX_TPU_LOCK: what plan_environment installs for train.engine '
        "jax\n\nWritten by scripts/write_tpu_lock.py: pip's resolution of pyproject's sets for "
        "the route's\nPython on manylinux x86_64; tf-keras last, as pyproject pins it: it is "
        "installed without its\ndependencies too. Beside each lock, the sha256 of every pin's "
        "wheel on the package index\n(NAME_SHA256; uv's in UV_LOCK_SHA256): workers install "
        "with --require-hashes --only-binary :all:.\n\n"
        + "\n".join(_wrap(note) for note in notes)
        + '\n"""\n\n' + "\n".join(tuples))


def _wrap(text: str, width: int = 99) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


def _values(text: str) -> dict:
    values = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            values[target.id] = ast.literal_eval(node.value)
    return values


def read(text: str) -> dict[str, Lock]:
    """The locks a launcher/tpu_lock.py text holds (what `render` wrote)."""
    values = _values(text)
    return {engine: Lock(engine=engine, python=values[f"{name}_PYTHON"],
                         libtpu_source=values[f"{name}_LIBTPU_SOURCE"], pins=values[name],
                         sha256=values.get(f"{name}_SHA256", {}))
            for engine, name in NAMES.items() if name in values}


def read_uv(text: str) -> dict[str, str] | None:
    """uv's pin and hash in a launcher/tpu_lock.py text (None before there was one)."""
    return _values(text).get(UV)


def uv_hash() -> dict[str, str]:
    """{uv==UV_VERSION: its wheel's sha256} for the TPU images' own Python."""
    worker_python, _ = _route("jax")
    return hashes([f"uv=={worker_python.UV_VERSION}"], HOST_PYTHON)


def main(args: list[str]) -> None:
    keep_pins = "--keep-pins" in args
    engines = [a for a in args if a != "--keep-pins"]
    unknown = set(engines) - set(NAMES)
    if unknown:
        sys.exit(f"unknown route(s) {', '.join(sorted(unknown))}: choose from {', '.join(NAMES)}")
    locks = read(OUT.read_text()) if OUT.exists() else {}
    for engine in engines or list(NAMES):
        if keep_pins:
            if engine not in locks:
                sys.exit(f"no lock yet for {engine}: run without --keep-pins")
            lock = locks[engine]
            locks[engine] = replace(lock, sha256=hashes(lock.pins, lock.python))
        else:
            locks[engine] = resolve(engine)
    missing = set(NAMES) - set(locks)
    if missing:
        sys.exit(f"no lock yet for {', '.join(sorted(missing))}: run without arguments")
    OUT.write_text(render(locks, uv_hash()))
    print(f"wrote {OUT} (" + ", ".join(f"{e}: {len(lock.pins)} packages"
                                       for e, lock in locks.items()) + ", and uv)")


if __name__ == "__main__":
    main(sys.argv[1:])
