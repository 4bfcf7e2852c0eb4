"""Where things are: the checkout, the bundled corpus, the PyTorch 5.x environment, the scripts.

    from tests.support.paths import REPO, SCRIPTS, torch_python
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "payload" / "data" / "corpus.txt.gz"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
# A folder whose sitecustomize hides TensorFlow and tf-keras from any Python started with it
# first on PYTHONPATH (the JAX route without TensorFlow).
NO_TENSORFLOW = Path(__file__).resolve().parent / "no_tensorflow"
TORCH_PYTHON = REPO / ".venv-torch" / "bin" / "python"
TORCH_READY = REPO / ".venv-torch" / ".installed"
LIBTPU = REPO / ".venv-libtpu" / "libtpu" / "libtpu.so"
TERRAFORM_TWIN = REPO / "tests" / "terraform_twin"
TERRAFORM_TWIN_SLICE = REPO / "tests" / "terraform_twin_slice"


def torch_python() -> Path:
    """The PyTorch transformers 5.x Python; skips the test where `make setup-torch` was not run."""
    if not TORCH_READY.exists():
        pytest.skip("no transformers 5.x environment (.venv-torch; `make setup-torch`)")
    return TORCH_PYTHON


def libtpu() -> Path:
    """The TPU compiler (libtpu) for the compile tests; skips where `make setup-libtpu` was not
    run."""
    if not LIBTPU.is_file():
        pytest.skip("no TPU compiler (.venv-libtpu; `make setup-libtpu`)")
    return LIBTPU
