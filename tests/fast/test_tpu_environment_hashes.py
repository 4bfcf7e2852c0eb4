"""A TPU environment installs hash-pinned wheels only (issue 27, item 7): every package of an
engine's lock, and the uv that brings the JAX route's Python, is installed from a requirements
file of `PIN --hash=sha256:HEX` lines with --require-hashes --only-binary=:all: --no-deps, so
a wheel that is not the one locked is refused; and real pip does refuse it."""

from __future__ import annotations

import re
import shlex

import pytest

from launcher.worker_python import (
    HASH_PINNED,
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


