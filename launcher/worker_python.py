"""Where the workers' Python comes from: an existing interpreter, a venv from a wheelhouse, or a
venv from the package index; and the small scripts that set it up on a worker.

    env = plan_environment(python=None, wheelhouse_digest=None,
                           requirements=("tensorflow==2.20.0",), tpu=True, engine="jax")
    env.mode, env.key, env.setup        # pure: ship.py runs env.setup on each worker

Environments are keyed by a hash of what they contain, so an unchanged set-up is found on the
worker and skipped. Nothing here touches a file, a process or the network.

On a TPU VM each engine has its route (payload.core.engines: `spec.tpu_route`): an exact
lock of every package (launcher.tpu_lock, written by scripts/write_tpu_lock.py) installed without
dependencies, for the Python the route runs on, each the wheel of the sha256 the lock records
and no other (`hash_pinned_install`: --require-hashes --only-binary=:all:). TensorFlow runs on the image's own Python 3.10
with tensorflow-tpu and the libtpu it was built with. JAX 0.10.2 needs Python 3.11 or newer
(jax, jaxlib, libtpu 0.0.42, orbax-checkpoint and tensorstore all say so in Requires-Python),
which the Ubuntu 22.04 TPU images do not have: its set-up first brings a pinned CPython with uv
(`uv python install`, a python-build-standalone build whose sha256 the pinned uv release
carries), then installs jax[tpu] and its libtpu, and no TensorFlow (the stages need none).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from enum import Enum

from payload.core import layout
from payload.core.engines import DEFAULT, engine_spec

# Where tpuctl keeps its files on a worker, relative to the folder commands start in (the SSH
# user's home; a local worker's own working directory).
WORKER_ROOT = layout.OWN_DIR


class EnvMode(str, Enum):
    """Where the worker's Python environment comes from."""

    CREATE = "create"  # a venv installed from the package index
    WHEELHOUSE = "wheelhouse"  # a venv installed from a shipped folder of wheels
    EXISTING = "existing"  # a Python already on the workers; only the payload is added


@dataclass(frozen=True, kw_only=True)
class Environment:
    """The Python every stage runs with on a worker, and what it takes to set it up."""

    mode: EnvMode
    python: str  # interpreter that runs the stages, relative to the worker root or absolute
    key: str  # hash of what the environment contains; set-up is skipped when it exists
    dir: str  # where the environment (or its completion marker) lives on the worker
    requirements: tuple[str, ...]
    setup: tuple[str, ...]  # argv of the set-up command (pure; run by ship.py)


# Runs on a worker with the existing Python: are the pinned packages there, at those versions?
# TensorFlow counts under any of its builds (the TPU one, or the CPU one).
VERSION_CHECK = """\
import re, sys
from importlib import metadata
bad = []
builds = {"tensorflow": ("tensorflow", "tensorflow-tpu", "tensorflow-cpu")}
for req in sys.argv[1:]:
    name = re.split(r"[<>=!~;\\[ ]", req, maxsplit=1)[0]
    pin = re.search(r"==\\s*([^,; ]+)", req)
    have = None
    for dist in builds.get(name.lower(), (name,)):
        try:
            have = metadata.version(dist); break
        except metadata.PackageNotFoundError:
            pass
    if have is None:
        bad.append(name + " is missing"); continue
    if pin and have != pin.group(1):
        bad.append(f"{name} is {have}, needs {pin.group(1)}")
if bad:
    print("; ".join(bad)); sys.exit(1)
"""
# Python that does a set-up at most once, whoever else tries at the same time: under an exclusive
# lock (flock) on a file beside what it builds, it skips when the completion marker is there,
# else builds and then writes the marker. Two jobs sharing a home (NFS) never build the same
# environment or payload at once; the second waits, then reuses.
ONCE = """\
import fcntl, os, shutil, subprocess, sys, zipfile
def once(folder, build):
    os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
    with open(folder + ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(folder, ".complete")):
            return "reused"
        build()
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, ".complete"), "w").close()
        return "built"
"""
# Unpacks the payload wheel into its folder (a wheel is a zip; no pip needed for pure code):
# python -c ONCE+PAYLOAD_UNPACK WHEEL TARGET. The wheel is this job's copy: removed either way.
PAYLOAD_UNPACK = """\
def _unpack(wheel=sys.argv[1], target=sys.argv[2]):
    shutil.rmtree(target + ".tmp", ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target + ".tmp")
    shutil.rmtree(target, ignore_errors=True)
    os.rename(target + ".tmp", target)
try:
    print("payload", once(sys.argv[2], _unpack))
finally:
    os.remove(sys.argv[1])
"""
# Runs a set-up command once per folder: python -c ONCE+RUN_ONCE FOLDER ARGV...
RUN_ONCE = """\
def _run(argv=sys.argv[2:]):
    code = subprocess.call(argv)
    if code:
        sys.exit(code)
print("env", once(sys.argv[1], _run))
"""
# Puts a copied folder into place once: python -c ONCE+MOVE_ONCE COPY FOLDER (COPY is removed).
MOVE_ONCE = """\
def _move(copy=sys.argv[1], folder=sys.argv[2]):
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(copy, folder)
print("wheelhouse", once(sys.argv[2], _move))
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""
# The uv that brings a route's own Python onto a TPU VM (payload.core.engines: TpuRoute.python).
UV_VERSION = "0.13.9"


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower()


def tpu_requirements(requirements: tuple[str, ...], engine: str = DEFAULT,
                     ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(normal, no-deps) requirements for a TPU VM on `engine`'s route: the packages
    the route renames (tensorflow-tpu for TensorFlow, jax[tpu] for jax), and tf-keras without
    its dependencies (they would pull the plain TensorFlow back in)."""
    renames = dict(engine_spec(engine).tpu_route.renames)
    normal, nodeps = [], []
    for req in requirements:
        name = _name(req)
        if name == "tf-keras":
            nodeps.append(req)
        elif name in renames:
            normal.append(renames[name] + req[len(name):])
        else:
            normal.append(req)
    return tuple(normal), tuple(nodeps)


def tpu_lock(engine: str) -> tuple[str, ...]:
    """The exact package list `engine` installs on a TPU VM."""
    from launcher import tpu_lock as locks

    return getattr(locks, engine_spec(engine).tpu_route.lock)


def tpu_lock_hashes(engine: str) -> dict[str, str]:
    """Each pin of `engine`'s lock -> the sha256 of its wheel on the package index."""
    from launcher import tpu_lock as locks

    return getattr(locks, f"{engine_spec(engine).tpu_route.lock}_SHA256")


def uv_lock() -> tuple[tuple[str, ...], dict[str, str]]:
    """((uv==UV_VERSION,), its wheel's sha256 by pin): the uv that brings the JAX route's
    Python, as launcher.tpu_lock holds it."""
    from launcher import tpu_lock as locks

    return (f"uv=={UV_VERSION}",), locks.UV_LOCK_SHA256


def hashed(pins: tuple[str, ...], sha256: dict[str, str]) -> tuple[str, ...]:
    """`PIN --hash=sha256:HEX` for each pin: the requirement lines of a hash-checked install.
    A pin without a hash is a lock scripts/write_tpu_lock.py did not write (or a UV_VERSION changed
    without running it)."""
    missing = [pin for pin in pins if pin not in sha256]
    if missing:
        raise ValueError(f"launcher/tpu_lock.py has no hash for {', '.join(missing)}: run "
                         "python scripts/write_tpu_lock.py --keep-pins")
    return tuple(f"{pin} --hash=sha256:{sha256[pin]}" for pin in pins)


# How a TPU environment installs: the locked wheels and no others, each checked against its
# hash, nothing built from source, no dependency added. `--hash` is only read from a
# requirements file, which the set-up writes first (LOCK_FILE, in the venv it installs into).
HASH_PINNED = ("--require-hashes", "--only-binary=:all:", "--no-deps")
LOCK_FILE = "tpuctl-lock.txt"


def hash_pinned_install(pip: list[str], source: list[str], lines: tuple[str, ...],
                        requirements_file: str) -> str:
    """The shell line that writes the `hashed` requirement `lines` to `requirements_file` and
    installs exactly those wheels with `pip`."""
    return (shlex.join(["printf", "%s\\n", *lines]) + f" > {shlex.quote(requirements_file)}"
            + " && " + shlex.join([*pip, *source, *HASH_PINNED,
                                   f"--requirement={requirements_file}"]))


def environment_key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def plan_environment(
    *, python: str | None, wheelhouse_digest: str | None, requirements: tuple[str, ...],
    tpu: bool, engine: str = DEFAULT,
) -> Environment:
    """The worker environment: existing Python, a venv from a wheelhouse, or one from the index;
    on a TPU VM, the exact lock of `engine`'s route, hash-checked, on the Python that route
    brings.

    Its key hashes everything it contains, so an unchanged set-up is found and skipped.
    """
    requirements = tuple(sorted(requirements))
    if python:
        key = environment_key("existing", python, *requirements)
        env_dir = f"{WORKER_ROOT}/env/{key}"
        return Environment(mode=EnvMode.EXISTING, python=python, key=key, dir=env_dir,
                           requirements=requirements,
                           setup=(python, "-c", VERSION_CHECK, *requirements))
    route = engine_spec(engine).tpu_route if tpu else None
    if route is not None:
        # Exactly the locked set, each without its dependencies: tensorflow-tpu 2.20.0 asks only
        # for libtpu~=0.0.14, so pip would otherwise take a libtpu many releases newer than the
        # one TensorFlow was built with (and any newer numpy, protobuf, ...); jax[tpu] names its
        # libtpu release, the lock holds the build of it that pip took. Each is the wheel of
        # that hash and no other (hash_pinned_install).
        normal, locked = (), hashed(tpu_lock(engine), tpu_lock_hashes(engine))
    else:
        normal, locked = requirements, ()
    # The Python the route brings: its build and the uv that installs it are part of the key.
    interpreter = ((route.python_build, *hashed(*uv_lock()))
                   if route is not None and route.python else ())
    if wheelhouse_digest:
        mode = EnvMode.WHEELHOUSE
        key = environment_key("wheelhouse", wheelhouse_digest, *interpreter, *normal,
                              "--no-deps", *locked)
        source = ["--no-index", "--find-links", f"{WORKER_ROOT}/wheelhouse/{wheelhouse_digest}"]
    else:
        mode = EnvMode.CREATE
        key = environment_key("index", *interpreter, *normal, "--no-deps", *locked)
        source = [arg for link in (route.find_links if route else ())
                  for arg in ("--find-links", link)]
    env_dir = f"{WORKER_ROOT}/env/{key}"
    pip = [f"{env_dir}/bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    script = [f"rm -rf {shlex.quote(env_dir)}"]
    if interpreter:
        script += python_install_script(env_dir, route.python_build, source)
    else:
        script.append(shlex.join(["python3", "-m", "venv", env_dir]))
    if normal:
        script.append(shlex.join([*pip, *source, *normal]))
    if locked:
        script.append(hash_pinned_install(pip, source, locked, f"{env_dir}/{LOCK_FILE}"))
    return Environment(mode=mode, python=f"{env_dir}/bin/python", key=key, dir=env_dir,
                       requirements=requirements, setup=("sh", "-c", " && ".join(script)))


def python_install_script(env_dir: str, build: str, source: list[str]) -> list[str]:
    """Shell lines that make `env_dir` a venv of the pinned CPython `build`, on a host whose own
    python3 is older: a throw-away venv holds the pinned uv (from the index, or the wheelhouse
    `source` names; its wheel hash-checked), uv installs the build under the environment (no
    `python3.11` on PATH, no shell profile touched; uv checks the build's sha256), and that
    interpreter makes the venv. The interpreter lives and goes with the environment."""
    tools, pythons = f"{env_dir}/.uv", f"{env_dir}/.python"
    uv = [f"{tools}/bin/uv"]
    install_dir = f"UV_PYTHON_INSTALL_DIR={shlex.quote(pythons)}"
    pip = [f"{tools}/bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    return [
        shlex.join(["python3", "-m", "venv", tools]),
        hash_pinned_install(pip, source, hashed(*uv_lock()), f"{tools}/{LOCK_FILE}"),
        f"{install_dir} " + shlex.join([*uv, "python", "install", "--no-config", "--no-bin",
                                        build]),
        f'"$({install_dir} '
        + shlex.join([*uv, "python", "find", "--no-config", "--managed-python", build])
        + ')" ' + shlex.join(["-m", "venv", env_dir]),
    ]
