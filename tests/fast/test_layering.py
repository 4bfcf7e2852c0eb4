"""payload/ in layers, read from every module's imports (the AST, nothing imported): which rooms
may import which frameworks, no engine imports another, and no room imports one above it.

The rooms from the bottom up: core (errors, layout, storage, the engines' and families' specs),
cloud, config, data, training (the neutral core: the loop, inputs, schedule, checkpoint rules,
metrics), engines (one folder per framework), stages (train, export, publish), and the worker's
entry points on top (jobs, __main__). Only an engine's own folder imports its framework, and the
data modules that read and write TFRecords with TensorFlow (the shards' decoder, TensorBoard's
events) import it; the reader and the objectives import no framework.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

PAYLOAD = REPO / "payload"
# Top-level packages that are an ML framework (what the fast tier's guard refuses too).
FRAMEWORKS = {"tensorflow", "tf_keras", "keras", "jax", "jaxlib", "flax", "optax", "orbax",
              "tensorstore", "torch"}
# Which frameworks a module may import, by its path under payload/ (the longest prefix wins).
MAY_IMPORT = {
    "engines/tensorflow/": {"tensorflow", "tf_keras"},
    "engines/jax/": {"jax", "jaxlib", "flax", "optax", "orbax", "tensorstore"},
    "data/shards.py": {"tensorflow"},
}
# The rooms, bottom first: a module may import its own room and the rooms below it.
ROOMS = ("core", "cloud", "config", "data", "training", "engines", "stages", "jobs", "__main__")


def modules() -> list[Path]:
    return sorted(PAYLOAD.rglob("*.py"))


def imported(path: Path, source: str | None = None) -> list[tuple[str, int]]:
    """(module name, line) of every import in the file (or in `source`, as if it stood there),
    inside functions too; relative ones resolved against the file's package."""
    tree = ast.parse(path.read_text(encoding="utf-8") if source is None else source)
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            found.append((base, node.lineno))
            # `from payload.engines import tensorflow`: the names may be modules too.
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def relative(path: Path) -> str:
    return path.relative_to(PAYLOAD).as_posix()


def allowed_frameworks(path: Path) -> set[str]:
    where = relative(path)
    prefixes = [p for p in MAY_IMPORT if where == p or (p.endswith("/") and where.startswith(p))]
    return MAY_IMPORT[max(prefixes, key=len)] if prefixes else set()


def room(name: str) -> str | None:
    """The room of a payload module (`payload.training.loop` -> training), None outside."""
    parts = name.split(".")
    if parts[0] != "payload" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in ROOMS else None


def test_only_an_engine_and_the_tfrecord_modules_import_a_framework():
    offenders = []
    for path in modules():
        allowed = allowed_frameworks(path)
        offenders += [f"{relative(path)}:{line} imports {name}"
                      for name, line in imported(path)
                      if name.split(".")[0] in FRAMEWORKS - allowed]
    assert offenders == []


def test_the_training_core_imports_no_framework():
    """The loop, inputs, schedule, checkpoint rules, metrics, strategy, run plan, utilisation,
    pretrained reading and pre-flight: no framework at all."""
    core = [p for p in modules() if relative(p).startswith(("training/", "core/", "config/"))]
    assert len(core) > 20
    offenders = [f"{relative(path)}:{line} imports {name}" for path in core
                 for name, line in imported(path) if name.split(".")[0] in FRAMEWORKS]
    assert offenders == []


def test_no_engine_imports_another():
    engines = sorted(p.name for p in (PAYLOAD / "engines").iterdir()
                     if p.is_dir() and (p / "__init__.py").exists())
    assert {"tensorflow", "jax"} <= set(engines)
    offenders = []
    for engine in engines:
        others = {f"payload.engines.{other}" for other in engines if other != engine}
        for path in sorted((PAYLOAD / "engines" / engine).rglob("*.py")):
            offenders += [f"{relative(path)}:{line} imports {name}"
                          for name, line in imported(path)
                          if any(name == o or name.startswith(o + ".") for o in others)]
    assert offenders == []


def test_no_room_imports_one_above_it():
    offenders = []
    for path in modules():
        here = room("payload." + relative(path).removesuffix(".py").replace("/", "."))
        if here is None:
            continue
        for name, line in imported(path):
            there = room(name)
            if there is not None and ROOMS.index(there) > ROOMS.index(here):
                offenders.append(f"{relative(path)}:{line} ({here}) imports {name} ({there})")
    assert offenders == []


@pytest.mark.parametrize(("source", "expected"), [
    ("import tensorflow as tf\n", ["tensorflow"]),
    ("def f():\n    from jax import numpy\n", ["jax", "jax.numpy"]),
    ("from payload.engines import jax\n", ["payload.engines", "payload.engines.jax"]),
    ("from .layout import join\n", ["payload.core.layout", "payload.core.layout.join"]),
])
def test_imports_are_read_inside_functions_from_lists_and_relative(source, expected):
    assert [name for name, _ in imported(PAYLOAD / "core" / "probe.py", source)] == expected
