import os
from pathlib import Path

import pytest

from tests.fleet import Fleet, sshd_available

HERE = Path(__file__).parent
REPO = HERE.parent


@pytest.fixture(scope="session")
def fleet():
    """Three real sshd workers, up once for the whole session."""
    if not sshd_available():
        pytest.skip("needs root and openssh-server (apt-get install -y openssh-server)")
    with Fleet(3) as f:
        yield f


@pytest.fixture
def tpuctl_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("TPUCTL_HOME", str(home))
    return home


@pytest.fixture
def subprocess_env():
    """Environment for a `tpuctl` subprocess that imports this checkout."""
    return {**os.environ, "PYTHONPATH": str(REPO)}
