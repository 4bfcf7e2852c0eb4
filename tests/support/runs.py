"""Output folders made once per test session and copied into each test's own folder: a run
with its tokenizer and shards (`prepared_run`), and one trained (and exported) by an engine
(`trained_run`). Every test gets a fresh copy it may change; the originals are never touched.

    out = prepared_run(tmp_path, "roberta")                     # tokenizer/ and data/
    config = training_run_config(out, "roberta", steps=40)      # then train it yourself
    out = trained_run(tmp_path, "gpt2", engine="jax", steps=6)   # + checkpoints/, metrics.json
    out = trained_run(tmp_path, "bert", export=True)            # + model/
    config = config_beside(out)                                 # the run's own config file

Under pytest-xdist the workers share one cache (made by the controller, each entry made under a
file lock by whichever worker asks first); the process that made it removes it when it exits.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from tests.support.configs import write_training_config
from tests.support.runners import payload_env, run_payload

# One cache for the whole test run: the first process to import this (the xdist controller, or a
# plain pytest) makes it and names it in the environment, so the workers it starts, and any pytest
# a test starts, share it; only that first process removes it, when it exits.
_SHARED = os.environ.get("TPUCTL_TEST_CACHE")
if _SHARED and Path(_SHARED).is_dir():
    CACHE = Path(_SHARED)
else:
    CACHE = Path(tempfile.mkdtemp(prefix="tpuctl-tests-"))
    os.environ["TPUCTL_TEST_CACHE"] = str(CACHE)
    atexit.register(shutil.rmtree, CACHE, True)


@contextlib.contextmanager
def _locked(name: str):
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _made_once(name: str, make) -> Path:
    """CACHE/name/run, made by `make(out)` the first time anyone asks (DONE marks it whole)."""
    folder = CACHE / name
    with _locked(name):
        if not (folder / "DONE").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder / "run")
            (folder / "DONE").touch()
    return folder / "run"


def _copy(source: Path, root: Path, name: str) -> Path:
    out = root / name
    shutil.copytree(source, out, symlinks=True)
    return out


def config_beside(out: Path) -> Path:
    """The config file a prepared or trained run's copy was given (out.parent/OUT.yaml)."""
    return out.parent / f"{out.name}.yaml"


def _stage(stage: str, out: Path, family: str, *args: str, **train) -> None:
    config = write_training_config(out, family, **train)
    result = run_payload(stage, "--config", str(config), *args, check=False,
                         env=payload_env(), timeout=900)
    if result.returncode != 0:
        raise AssertionError(f"{stage} of the shared {family} run failed:\n"
                             f"{result.stderr[-3000:]}")


def prepared_run(root: Path, family: str) -> Path:
    """A fresh output_dir under `root` holding a tokenizer and prepared shards for `family`."""

    def make(out: Path) -> None:
        for stage in ("tokenizer", "prepare"):
            _stage(stage, out, family)

    return _copy(_made_once(f"prepared-{family}", make), root, f"run-{family}")


def trained_run(root: Path, family: str, *, export: bool = False, **train) -> Path:
    """A fresh output_dir under `root`: `prepared_run` trained with these `train` settings (the
    training tests' defaults otherwise: configs.training_config), exported when `export`."""
    key = json.dumps({"family": family, "export": export, **train}, sort_keys=True)
    name = f"trained-{family}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"

    def make(out: Path) -> None:
        prepared = prepared_run(out.parent, family)
        prepared.rename(out)
        _stage("train", out, family, **train)
        if export:
            _stage("export", out, family, **train)

    out = _copy(_made_once(name, make), root, f"run-{family}")
    write_training_config(out, family, **train)
    return out


def stage_command(stage: str, config: Path, *args: str) -> list[str]:
    """The payload's command line for a stage, as the launcher runs it."""
    return [sys.executable, "-m", "payload", stage, "--config", str(config), *args]


def run_stage(stage: str, config: Path, *args: str, env=None, timeout: float = 300):
    """A stage as a process of its own; the finished process, whatever its exit status."""
    return run_payload(stage, "--config", str(config), *args, check=False,
                       env=env or payload_env(), timeout=timeout)
