"""The fast tier's guard: a fast test starts no process and imports no ML framework.

    with FastGuard():            # around one fast test (tests/conftest.py does this)
        ...                      # subprocess.Popen, os.fork, `import tensorflow` -> TierViolation

A test that needs either belongs in tests/integration or tests/e2e. Imports are caught when a
framework is first imported: `make test-fast` runs the fast tier in a session of its own with the
guard on from collection, so nothing has imported one before.
"""

from __future__ import annotations

import importlib.abc
import os
import subprocess
import sys

# Top-level packages a fast test may not import (each costs seconds, or gigabytes of memory).
FRAMEWORKS = frozenset({"tensorflow", "tf_keras", "keras", "jax", "jaxlib", "flax", "optax",
                        "orbax", "tensorstore", "torch"})


class TierViolation(RuntimeError):
    """A fast test did what only a slower tier may."""


class _Refuse(importlib.abc.Loader):
    def __init__(self, name: str):
        self.name = name

    def create_module(self, spec):
        raise TierViolation(f"a fast test imported {self.name}: move it to tests/integration")

    def exec_module(self, module):  # pragma: no cover - create_module raises first
        raise TierViolation(self.name)


class _Blocker(importlib.abc.MetaPathFinder):
    """Finds the frameworks (so availability checks still see them) but refuses to load them."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".", 1)[0] not in FRAMEWORKS or fullname in sys.modules:
            return None
        from importlib.machinery import ModuleSpec, PathFinder

        if PathFinder.find_spec(fullname, path) is None:
            return None  # not installed: the import fails as it would anyway
        return ModuleSpec(fullname, _Refuse(fullname))


def _refuse_spawn(what: str):
    def refuse(*_args, **_kwargs):
        raise TierViolation(f"a fast test started a process ({what}): move it to "
                            "tests/integration")

    return refuse


class FastGuard:
    """While active: no process can start and no framework can be imported."""

    _SPAWNERS = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "spawnv",
                 "spawnve", "spawnvp", "spawnvpe", "execv", "execve", "execvp", "execvpe")

    def __init__(self):
        self._saved: list[tuple[object, str, object]] = []
        self._blocker = _Blocker()

    def __enter__(self) -> FastGuard:
        def patch(owner, name, value):
            if hasattr(owner, name):
                self._saved.append((owner, name, getattr(owner, name)))
                setattr(owner, name, value)

        patch(subprocess.Popen, "_execute_child", _refuse_spawn("subprocess"))
        for name in self._SPAWNERS:
            patch(os, name, _refuse_spawn(f"os.{name}"))
        sys.meta_path.insert(0, self._blocker)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()
        if self._blocker in sys.meta_path:
            sys.meta_path.remove(self._blocker)
