"""The engines' specs (payload.core.engines): every fact about an engine that needs no framework,
asked by name, and the names themselves spelled there alone."""

from __future__ import annotations

from typing import get_args

import pytest

from payload.core.engines import DEFAULT, ENGINE_NAMES, ENGINES, engine_spec
from payload.core.errors import UserError


def test_the_configs_engine_names_are_the_specs():
    from payload.config import EngineName, TrainConfig

    assert get_args(EngineName) == ENGINE_NAMES
    assert TrainConfig.model_fields["engine"].default == DEFAULT


def test_an_engine_that_is_none_is_one_line_naming_the_engines():
    with pytest.raises(UserError, match=r"'torch' is not an engine") as caught:
        engine_spec("torch")
    assert caught.value.hint == f"use one of {', '.join(ENGINE_NAMES)}"
    assert engine_spec(None) is ENGINES[DEFAULT]


def test_tensorflow_is_told_about_libtpu_only_on_its_own_route():
    assert engine_spec("tensorflow").tensorflow_env_on_tpu("/env/libtpu/libtpu.so") == {
        "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/env/libtpu/libtpu.so"}
    assert engine_spec("tensorflow").tensorflow_env_on_tpu(None) == {}
    assert engine_spec("jax").tensorflow_env_on_tpu("/env/libtpu/libtpu.so") == {
        "NEXT_PLUGGABLE_DEVICE_USE_C_API": "", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": ""}


def test_each_engine_names_its_checkpoints_as_its_files_do(tmp_path):
    from payload.core import layout

    out = str(tmp_path)
    tf, jax = engine_spec("tensorflow"), engine_spec("jax")
    assert tf.checkpoint_path(out, 4) == layout.join(out, "checkpoints", "ckpt-4")
    assert jax.checkpoint_path(out, 4) == layout.join(out, "checkpoints", "4")
    assert (tf.checkpoint_words(4), jax.checkpoint_words(4)) == (
        "checkpoint ckpt-4", "checkpoint of step 4")


def test_a_worker_installs_the_stages_set_and_its_engines():
    assert engine_spec("tensorflow").extras == ("worker", "tensorflow")
    assert engine_spec("jax").extras == ("worker", "jax")


# What only TensorFlow brings: itself in any build, tf-keras, Keras 3 and TensorBoard (with its
# server and web stack), and the packages nothing else in the worker set asks for.
TENSORFLOW_ONLY = {"tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-keras", "keras",
                   "tensorboard", "tensorboard-data-server", "tensorflow-io-gcs-filesystem",
                   "h5py", "libclang", "gast", "astunparse", "google-pasta", "flatbuffers",
                   "termcolor", "wrapt", "namex", "werkzeug", "markdown"}


def test_the_jax_route_installs_no_tensorflow():
    """The JAX engine's sets (pyproject's extras its spec names) ask for no TensorFlow, and its
    TPU lock holds none of it, nor anything only TensorFlow needs; the TensorFlow route's lock
    still holds TensorFlow (tensorflow-tpu) and tf-keras."""
    from packaging.requirements import Requirement

    from launcher import ship
    from launcher.worker_python import tpu_lock

    def names(requirements):
        return {Requirement(r).name.lower() for r in requirements}

    assert not names(ship.worker_requirements(extras=engine_spec("jax").extras)) & TENSORFLOW_ONLY
    assert not names(tpu_lock("jax")) & TENSORFLOW_ONLY
    assert {"tensorflow", "tf-keras"} <= names(
        ship.worker_requirements(extras=engine_spec("tensorflow").extras))
    assert {"tensorflow-tpu", "tf-keras", "tensorboard"} <= names(tpu_lock("tensorflow"))


def test_the_names_are_spelled_in_the_specs_alone():
    """No module of payload/ or launcher/ but the specs spells an engine's name as a string to
    compare with or to key a table by (a docstring, a comment, a package name may say it)."""
    import ast

    from tests.support.paths import REPO

    offenders = []
    for root in ("payload", "launcher"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path == REPO / "payload" / "core" / "engines.py":
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Compare):
                    values = [node.left, *node.comparators]
                elif isinstance(node, ast.Dict):
                    values = [k for k in node.keys if k is not None]
                else:
                    continue
                offenders += [f"{path.relative_to(REPO)}:{v.lineno}" for v in values
                              if isinstance(v, ast.Constant) and v.value in ENGINE_NAMES]
    assert offenders == []
