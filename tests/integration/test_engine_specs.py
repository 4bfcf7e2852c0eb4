"""The engines' specs against the real framework: what the JAX route tells TensorFlow on a TPU
host keeps it from loading libtpu (payload.core.engines)."""

from payload.core.engines import engine_spec


def test_tensorflow_on_the_jax_route_loads_no_device_library():
    """Real TensorFlow: a TF_PLUGGABLE_DEVICE_LIBRARY_PATH left in the environment makes its
    import load that library (here a missing one, so the import fails); with the JAX route's
    variables over it, the import loads nothing."""
    import os
    import subprocess
    import sys

    stale = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
             "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/nonexistent/libtpu/libtpu.so"}
    code = "import tensorflow; print('imported')"

    def run(env):
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=300)

    loaded = run(stale)
    assert loaded.returncode != 0 and "/nonexistent/libtpu/libtpu.so" in loaded.stderr
    clean = run({**stale, **engine_spec("jax").tensorflow_env_on_tpu("/nonexistent/libtpu/libtpu.so")})
    assert clean.returncode == 0 and clean.stdout.strip() == "imported", clean.stderr
