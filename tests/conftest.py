"""The suite's tiers, the fast tier's guard, and the fixtures every tier shares.

Tiers are folders: tests/fast (no process, no ML framework: `make test-fast`, a few minutes),
tests/integration (real stages on tiny models, real terraform) and tests/e2e (whole pipelines,
sshd fleets, the gs:// sandbox, the clouds' stand-ins, crash consistency). A test's tier is a
marker named after its folder (`-m fast`); `slow` marks the long ones inside a tier. Helpers live
in tests/support (import them from there, never from here).
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.environment import suite_environment

# Before anything reads it (huggingface_hub reads HF_HUB_OFFLINE once, at import): the suite runs
# the same whatever the user's shell exports.
_SUITE_ENVIRONMENT = suite_environment(os.environ)
os.environ.clear()
os.environ.update(_SUITE_ENVIRONMENT)

import pytest  # noqa: E402

from tests.support import corpora, runs  # noqa: E402, F401  (the run's shared cache, first)
from tests.support.guard import FastGuard  # noqa: E402
from tests.support.paths import REPO  # noqa: E402
from tests.support.summary import skipped_groups  # noqa: E402

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One JAX compilation cache for every test and every process a test starts (and the next run):
# the suite compiles the same tiny programs in dozens of processes, and a compiled program is
# found again by what it computes, so a hit is never a different program. A test about the
# cache itself points JAX elsewhere.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(REPO / ".cache" / "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))

TESTS = Path(__file__).resolve().parent
TIERS = ("fast", "integration", "e2e")
_SESSION_GUARD: FastGuard | None = None


def _tier_of(path: Path) -> str | None:
    try:
        first = Path(path).resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return first if first in TIERS else None


def pytest_configure(config):
    global _SESSION_GUARD
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (tests/{tier}/)")
    # A session of the fast tier alone is guarded from collection on: nothing may have imported
    # a framework before its first test, so an import anywhere in it is caught.
    paths = [a.split("::")[0] for a in config.args] or [str(TESTS)]
    if all(_tier_of(Path(p)) == "fast" for p in paths):
        _SESSION_GUARD = FastGuard().__enter__()


def pytest_unconfigure(config):
    if _SESSION_GUARD is not None:
        _SESSION_GUARD.__exit__(None, None, None)


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = _tier_of(Path(str(item.path)))
        if tier:
            item.add_marker(tier)
    # The fast tier first: in a mixed session its guard still sees every framework import.
    items.sort(key=lambda item: _tier_of(Path(str(item.path))) != "fast")


@pytest.fixture(autouse=True)
def _tier_guard(request):
    """A fast test starts no process and imports no framework (tests/support/guard.py)."""
    if request.node.get_closest_marker("fast") is None or _SESSION_GUARD is not None:
        yield
        return
    with FastGuard():
        yield


@pytest.fixture(scope="session")
def documents() -> list[str]:
    return corpora.bundled_documents()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, documents) -> Path:
    """~400 KB, one paragraph per line: fast to train on, big enough to learn from."""
    return corpora.one_paragraph_per_line(tmp_path_factory.mktemp("corpus") / "small.txt",
                                          documents[:1200])


@pytest.fixture(scope="session")
def fleet():
    """Three real sshd workers (testbed/fleet.py), up once for the whole session."""
    from testbed.fleet import Fleet, sshd_available

    if not sshd_available():
        pytest.skip("needs root and openssh-server (apt-get install -y openssh-server)")
    # TPUCTL_FLEET_LOOPBACK=1 tries the fallback for machines without network namespaces.
    with Fleet(3, use_netns=False if os.environ.get("TPUCTL_FLEET_LOOPBACK") else None) as f:
        yield f


@pytest.fixture(scope="module")
def storage_emulator(fleet):
    """Cloud Storage on the fleet's bridge: the launcher and the workers see the same one."""
    from tests.support.cloud import storage_server

    with storage_server(f"{fleet.subnet}.1" if fleet.use_netns else "127.0.0.1") as url:
        yield url


@pytest.fixture(scope="module")
def gcs_emulator():
    """A Cloud Storage emulator on a free local port, with bucket `tpuctl-test`."""
    from tests.support.cloud import storage_server

    with storage_server(default_bucket="tpuctl-test") as host:
        saved = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = host
        import payload.core.storage

        payload.core.storage._client = None
        try:
            yield host
        finally:
            payload.core.storage._client = None
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved


@pytest.fixture
def tpuctl_home(tmp_path, monkeypatch):
    """The launcher's own state (job records, log copies, local workers) under tmp_path."""
    home = tmp_path / "home"
    monkeypatch.setenv("TPUCTL_HOME", str(home))
    return home


@pytest.fixture
def local_run(tmp_path, tpuctl_home, monkeypatch):
    """make(behaviour, workers=2, **sections) -> a tiny config for local workers whose stages
    are the stand-ins of testbed/stub_stages.py, doing what `behaviour` says."""
    from launcher.launch import STAGE_ENTRY_ENV
    from tests.support.cloud import install_stub
    from tests.support.configs import tiny_config

    def make(behaviour=None, workers=2, **sections):
        stub = install_stub(tmp_path / "stub", behaviour)
        monkeypatch.setenv(STAGE_ENTRY_ENV, str(stub))
        return tiny_config(tmp_path, output_dir=str(tmp_path / "out"),
                           cluster={"provider": "local", "workers": workers}, **sections)
    return make


@pytest.fixture(scope="session")
def gcs_sandbox():
    """A network namespace where TensorFlow's own gs:// and google-cloud-storage both reach one
    fake Cloud Storage (testbed/fakes/gcs.py), up once for the whole session."""
    from testbed.fakes.gcs import GcsSandbox, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with GcsSandbox() as sandbox:
        yield sandbox


def pytest_terminal_summary(terminalreporter):
    reasons = []
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", None)
        if isinstance(longrepr, tuple) and len(longrepr) == 3:
            reasons.append(str(longrepr[2]).removeprefix("Skipped: "))
    if reasons:
        terminalreporter.section("skipped: what this machine lacks (CI runs these)", sep="-")
        for line in skipped_groups(reasons):
            terminalreporter.line(line)
