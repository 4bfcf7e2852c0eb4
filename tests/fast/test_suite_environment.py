"""The suite's own environment (tests/support/environment.py, applied first by conftest.py):
what a user exports for the tools under test is dropped, the suite's knobs stay."""

from __future__ import annotations

import os

from tests.support.environment import suite_environment


def test_the_users_variables_are_dropped_and_the_suites_knobs_kept():
    users = {"HF_HUB_OFFLINE": "1", "HF_TOKEN": "t", "HUGGING_FACE_HUB_TOKEN": "t",
             "TRANSFORMERS_OFFLINE": "1", "GOOGLE_APPLICATION_CREDENTIALS": "/c.json",
             "CLOUDSDK_CORE_PROJECT": "p", "JAX_PLATFORMS": "tpu", "XLA_FLAGS": "--x",
             "TPUCTL_HOME": "/h", "TPUCTL_DEBUG": "1", "TF_FORCE_GPU_ALLOW_GROWTH": "true",
             "STORAGE_EMULATOR_HOST": "http://x", "LIBTPU_INIT_ARGS": "--y"}
    kept = {"PATH": "/usr/bin", "HOME": "/root", "TPUCTL_FLEET_LOOPBACK": "1",
            "TPUCTL_RECORD_GOLDEN": "1", "TPUCTL_TEST_CACHE": "/cache",
            "TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": "."}
    assert suite_environment({**users, **kept}) == kept


def test_this_session_holds_none_of_the_users_variables():
    """conftest.py applied it: only what the suite sets itself is left of those prefixes."""
    assert suite_environment(os.environ) == {
        k: v for k, v in os.environ.items()
        if k not in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                     "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "JAX_COMPILATION_CACHE_MAX_SIZE")}
    assert "HF_HUB_OFFLINE" not in os.environ and "HF_TOKEN" not in os.environ
