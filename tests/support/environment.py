"""The environment the suite runs in, whatever the user's shell holds: the variables through
which a user configures Hugging Face, Google Cloud, JAX, XLA, TensorFlow, libtpu and tpuctl
itself are dropped before anything reads them (tests/conftest.py, first), so that
`HF_HUB_OFFLINE=1` or `JAX_PLATFORMS=tpu` in a shell changes no result.

    os.environ.clear(); os.environ.update(suite_environment(os.environ))

What the suite sets itself follows (conftest.py); the suite's own knobs stay.
"""

from __future__ import annotations

from collections.abc import Mapping

# Prefixes of what a user may have set for these tools.
USER_PREFIXES = ("HF_", "HUGGINGFACE_", "HUGGING_FACE_", "TRANSFORMERS_", "TOKENIZERS_",
                 "TPUCTL_", "GOOGLE_", "CLOUDSDK_", "GCE_", "JAX_", "XLA_", "TF_", "TPU_",
                 "LIBTPU_", "KERAS_", "ORBAX_")
# Single variables of the same kind.
USER_VARIABLES = ("STORAGE_EMULATOR_HOST", "KERAS_HOME", "PJRT_DEVICE")
# The suite's own knobs (docs/testing.md), and what the Makefile exports for every run.
SUITE_KNOBS = ("TPUCTL_FLEET_LOOPBACK", "TPUCTL_RECORD_GOLDEN", "TPUCTL_TEST_CACHE",
               "TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS")


def suite_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without what a user sets for the tools under test (the suite's knobs kept)."""
    return {name: value for name, value in environ.items()
            if name in SUITE_KNOBS or not (name.startswith(USER_PREFIXES)
                                           or name in USER_VARIABLES)}
