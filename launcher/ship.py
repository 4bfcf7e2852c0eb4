"""Ship the payload: build this project's wheel once, copy it to every worker in parallel, set up
the worker environment, all cached so an unchanged second run does no package work.

    wheel, digest = build_wheel(out_dir)              # deterministic: same sources, same bytes
    ship(executor, workers, environment, paths, wheel, wheelhouse=None, on_event=print)

The payload goes into its own folder on each worker (`.tpuctl/payload/<digest>`, put on
PYTHONPATH by the plan), so an existing Python (a custom image, a shared venv) is used without
being modified. Environments are keyed by a hash of what they contain (launcher.worker_python); a
`.complete` marker records a finished set-up, and set-ups run under a lock on the worker, so two
jobs sharing a home never build the same environment or payload at once.
"""

from __future__ import annotations

import base64
import hashlib
import io
import shlex
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from launcher.executors import on_workers
from launcher.plan import JobPaths, Worker
from launcher.worker_python import (
    MOVE_ONCE,
    ONCE,
    PAYLOAD_UNPACK,
    RUN_ONCE,
    VERSION_CHECK,
    WORKER_ROOT,
    Environment,
    EnvMode,
)
from payload.core import storage
from payload.core.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
# Only the worker package: nothing of launcher/ runs on a worker (the job agent, run lock and
# file checks are payload.jobs, run with `python -m`).
PACKAGES = ("payload",)
# Code and templates only: the bundled demo corpus is read from the launcher's side by path,
# and leaving it out keeps every copy small.
DATA_SUFFIXES = (".py", ".yaml")
DIST = "tpuctl"
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
COMPLETE = ".complete"


def _version() -> str:
    from payload import __version__

    return __version__


def _source_files(root: Path = REPO_ROOT) -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if (path.is_file() and "__pycache__" not in path.parts
                    and path.name.endswith(DATA_SUFFIXES)):
                yield path.relative_to(root).as_posix(), path


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def wheel_bytes(root: Path = REPO_ROOT) -> bytes:
    """The project as a wheel, byte for byte the same for the same sources (fixed timestamps)."""
    version = _version()
    info = f"{DIST}-{version}.dist-info"
    entries = [(name, path.read_bytes()) for name, path in _source_files(root)]
    entries.append((f"{info}/METADATA",
                    f"Metadata-Version: 2.1\nName: {DIST}\nVersion: {version}\n".encode()))
    entries.append((f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: tpuctl\n"
                    b"Root-Is-Purelib: true\nTag: py3-none-any\n"))
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{info}/RECORD", (record + f"{info}/RECORD,,\n").encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            item = zipfile.ZipInfo(name, date_time=ZIP_EPOCH)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(item, data)
    return buffer.getvalue()


def payload_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def write_wheel(out_dir: Path, data: bytes) -> Path:
    """Keep the wheel under out_dir (once per content); its path."""
    path = out_dir / payload_digest(data) / f"{DIST}-{_version()}-py3-none-any.whl"
    if not path.exists():  # two launchers may write it at once: each whole, the same bytes
        storage.write_bytes(str(path), data)
    return path


def build_wheel(out_dir: Path, root: Path = REPO_ROOT) -> tuple[Path, str]:
    """Build and keep the wheel; its path and digest."""
    data = wheel_bytes(root)
    return write_wheel(out_dir, data), payload_digest(data)


def worker_requirements(root: Path = REPO_ROOT, extras: tuple[str, ...] = ("worker",),
                        ) -> tuple[str, ...]:
    """The worker's pinned dependencies: pyproject's `extras` (the engine's:
    payload.core.engines' `spec.extras`), plus the base set."""
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        project = tomllib.loads(pyproject.read_text())["project"]
        return tuple(project["dependencies"]) + tuple(
            req for extra in extras for req in project["optional-dependencies"][extra])
    from importlib import metadata

    reqs = metadata.requires(DIST) or []
    wanted = {f"'{extra}'" for extra in extras} | {f'"{extra}"' for extra in extras}
    return tuple(r.split(";")[0].strip() for r in reqs
                 if "extra ==" not in r or any(w in r for w in wanted))


def wheelhouse_digest(folder: str) -> str:
    """Names and sizes of the wheels: enough to notice a changed wheelhouse without reading it."""
    path = Path(folder)
    wheels = sorted(path.glob("*.whl")) + sorted(path.glob("*.tar.gz"))
    if not path.is_dir() or not wheels:
        raise UserError(f"cluster.wheelhouse: no wheels in {folder}",
                        hint="fill it with `pip download -d FOLDER 'tpuctl[worker,tensorflow]'` "
                             "('tpuctl[worker,jax]' for train.engine jax)")
    listing = "\n".join(f"{w.name} {w.stat().st_size}" for w in wheels)
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


def _wheelhouse_dir(digest: str) -> str:
    return f"{WORKER_ROOT}/wheelhouse/{digest}"


def probe_command(environment: Environment, paths: JobPaths, wheelhouse: str | None) -> str:
    """One round trip that says which parts are already on the worker (and makes room)."""
    checks = [("payload", paths.payload_dir), ("env", environment.dir)]
    if wheelhouse:
        checks.append(("wheelhouse", _wheelhouse_dir(wheelhouse)))
    found = "; ".join(f"test -f {shlex.quote(d + '/' + COMPLETE)} && echo {name}"
                      for name, d in checks)
    return f"mkdir -p {shlex.quote(WORKER_ROOT + '/payload')}; {found}; true"


def _mark_complete(folder: str) -> str:
    """Shell that records a finished set-up of `folder` (what `probe_command` looks for)."""
    return f"mkdir -p {shlex.quote(folder)} && touch {shlex.quote(folder + '/' + COMPLETE)}"


def _unpack_command(python: str, paths: JobPaths) -> str:
    return shlex.join([python, "-c", ONCE + PAYLOAD_UNPACK, paths.wheel, paths.payload_dir])


def _check_and_unpack_command(environment: Environment, paths: JobPaths) -> str:
    """An existing Python's version check and the payload unpacking in one process: on a
    busy host every interpreter start counts."""
    code = ("import sys\n_wheel, _target = sys.argv[1:3]\ndel sys.argv[1:3]\n" + VERSION_CHECK
            + "sys.argv[1:] = [_wheel, _target]\n" + ONCE + PAYLOAD_UNPACK)
    return (shlex.join([environment.python, "-c", code, paths.wheel, paths.payload_dir,
                        *environment.requirements])
            + " && " + _mark_complete(environment.dir))


def _env_python_for_extract(environment: Environment) -> str:
    return environment.python if environment.mode is EnvMode.EXISTING else "python3"


def _setup_command(environment: Environment) -> str:
    """The environment's set-up, done once: a second job setting up the same environment at
    the same time (a shared home) waits for the first, then reuses what it built."""
    return shlex.join([_env_python_for_extract(environment), "-c", ONCE + RUN_ONCE,
                       environment.dir, *environment.setup])


def _move_wheelhouse_command(python: str, copy: str, target: str) -> str:
    return shlex.join([python, "-c", ONCE + MOVE_ONCE, copy, target])


def _env_error(worker: Worker, environment: Environment, output: str, rc: int) -> UserError:
    why = output.strip().splitlines()
    detail = why[-1] if why else f"exit {rc}"
    if environment.mode is EnvMode.EXISTING:
        return UserError(f"{worker.label}: {environment.python} cannot run the payload: {detail}",
                         hint="install the pinned worker dependencies there (pip install "
                         "'tpuctl[worker,tensorflow]', or 'tpuctl[worker,jax]' for train.engine "
                         "jax), or drop cluster.python")
    return UserError(f"{worker.label}: environment set-up failed: {detail}",
                     hint="for workers without a package index set cluster.wheelhouse")


def ship_one(executor, worker: Worker, environment: Environment, paths: JobPaths, wheel: Path,
             wheelhouse: tuple[str, str] | None, on_event: Callable[[Worker, str], None]) -> dict:
    """Bring one worker up to date in as few round trips as possible; what this job had to do
    itself (another job may have built a part first while this one waited for it)."""
    wh_digest = wheelhouse[1] if wheelhouse else None
    present = set(executor.run(worker, probe_command(environment, paths, wh_digest)).stdout.split())
    done = {"payload": "payload" not in present, "env": "env" not in present,
            "wheelhouse": bool(wheelhouse) and "wheelhouse" not in present}
    python = _env_python_for_extract(environment)
    if done["wheelhouse"]:
        folder, digest = wheelhouse
        target = _wheelhouse_dir(digest)
        copy = f"{paths.job_dir}/wheelhouse"  # this job's own copy, moved into place once
        files = sorted(p for p in Path(folder).iterdir() if p.is_file())
        on_event(worker, f"copying the wheelhouse ({len(files)} files)")
        for f in files:
            executor.put(worker, str(f), f"{copy}/{f.name}")
        res = executor.run(worker, _move_wheelhouse_command(python, copy, target))
        if not res.ok:
            raise UserError(f"{worker.label}: could not put the wheelhouse in place: "
                            f"{(res.stderr or res.stdout).strip()[-200:]}")
        done["wheelhouse"] = "wheelhouse built" in res.stdout
    if done["payload"]:
        on_event(worker, "copying the payload")
        executor.put(worker, str(wheel), paths.wheel)
    if done["env"] and done["payload"] and environment.mode is EnvMode.EXISTING:
        on_event(worker, "checking the environment")
        res = executor.run(worker, _check_and_unpack_command(environment, paths))
        if not res.ok:
            raise _env_error(worker, environment, res.stdout + res.stderr, res.rc)
        done["payload"] = "payload built" in res.stdout
        on_event(worker, "ready")
        return done
    if done["env"]:
        on_event(worker, f"setting up the environment ({environment.mode.value})")
        res = executor.run(worker, _setup_command(environment), timeout_s=3600)
        if not res.ok:
            raise _env_error(worker, environment, res.stdout + res.stderr, res.rc)
        done["env"] = "env built" in res.stdout
    if done["payload"]:
        res = executor.run(worker, _unpack_command(python, paths))
        if not res.ok:
            raise UserError(f"{worker.label}: could not unpack the payload: "
                            f"{(res.stderr or res.stdout).strip()[-200:]}")
        done["payload"] = "payload built" in res.stdout
    on_event(worker, "ready")
    return done


def ship(executor, workers: tuple[Worker, ...], environment: Environment,
         paths: tuple[JobPaths, ...], wheel: Path, *, wheelhouse: tuple[str, str] | None = None,
         on_event: Callable[[Worker, str], None] = lambda w, m: None) -> list[dict]:
    """Bring every worker up to date in parallel (`paths`: each worker's, by index); the first
    failure is raised."""
    return on_workers(workers, lambda w: ship_one(executor, w, environment, paths[w.index],
                                                  wheel, wheelhouse, on_event))
