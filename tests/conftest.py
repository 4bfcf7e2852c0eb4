"""Shared fixtures: small corpora made from the bundled text, run configs, payload subprocesses."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
BUNDLED = REPO / "payload" / "data" / "corpus.txt.gz"
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def bundled_documents() -> list[str]:
    text = gzip.decompress(BUNDLED.read_bytes()).decode("utf-8")
    return [d for d in text.split("\n\n") if d.strip()]


@pytest.fixture(scope="session")
def documents() -> list[str]:
    return bundled_documents()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory, documents) -> Path:
    """~400 KB, one paragraph per line: fast to train on, big enough to learn from."""
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    lines = [" ".join(d.split()) for d in documents[:1200]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def base_config(output_dir: Path, corpus, **sections) -> dict:
    config = {
        "name": "test",
        "output_dir": str(output_dir),
        "cluster": {"provider": "local", "workers": 1},
        "data": {"corpus": [str(c) for c in (corpus if isinstance(corpus, list) else [corpus])],
                 "seq_len": 32, "validation_fraction": 0.1, "records_per_shard": 200},
        "tokenizer": {"kind": "bpe", "vocab_size": 600, "sample_mb": None},
        "model": {"family": "roberta", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"steps": 10, "batch_size": 8, "learning_rate": 1e-3},
    }
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(config.get(section), dict):
            config[section] = {**config[section], **values}
        else:
            config[section] = values
    return config


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def payload_env(**extra: str) -> dict:
    """The environment a stage runs with in tests: this checkout first on the path, tf-keras,
    no traceback switch and no stray TF_CONFIG; `extra` on top."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.pop("TPUCTL_DEBUG", None)
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def run_payload(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m payload ARGS` as a user would; returns the finished process."""
    proc = subprocess.run(
        [sys.executable, "-m", "payload", *args], capture_output=True, text=True,
        env=kwargs.pop("env", payload_env()), timeout=kwargs.pop("timeout", 300), **kwargs,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"payload {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def assert_user_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit status 2, one line on stderr, no traceback, mentioning every needle."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, f"exit {proc.returncode}: {err[-2000:]}"
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture(scope="session")
def fleet():
    """Three real sshd workers (tests/fleet.py), up once for the whole session."""
    from tests.fleet import Fleet, sshd_available

    if not sshd_available():
        pytest.skip("needs root and openssh-server (apt-get install -y openssh-server)")
    # TPUCTL_FLEET_LOOPBACK=1 tries the fallback for machines without network namespaces.
    with Fleet(3, use_netns=False if os.environ.get("TPUCTL_FLEET_LOOPBACK") else None) as f:
        yield f



@pytest.fixture(scope="module")
def storage_emulator(fleet):
    """Cloud Storage on the fleet's bridge: the launcher and the workers see the same one."""
    from tests import helpers

    with helpers.storage_emulator(f"{fleet.subnet}.1" if fleet.use_netns else "127.0.0.1") as url:
        yield url

@pytest.fixture
def tpuctl_home(tmp_path, monkeypatch):
    """The launcher's own state (job records, log copies, local workers) under tmp_path."""
    home = tmp_path / "home"
    monkeypatch.setenv("TPUCTL_HOME", str(home))
    return home


@pytest.fixture
def local_run(tmp_path, tpuctl_home, monkeypatch):
    """make(behaviour, workers=2, **sections) -> a tiny config for local workers whose stages
    are the stand-ins of tests/stub_stages.py, doing what `behaviour` says."""
    from launcher.launch import STAGE_ENTRY_ENV
    from tests.helpers import install_stub, tiny_config

    def make(behaviour=None, workers=2, **sections):
        stub = install_stub(tmp_path / "stub", behaviour)
        monkeypatch.setenv(STAGE_ENTRY_ENV, str(stub))
        return tiny_config(tmp_path, output_dir=str(tmp_path / "out"),
                           cluster={"provider": "local", "workers": workers}, **sections)
    return make


@pytest.fixture(scope="session")
def gcs_sandbox():
    """A network namespace where TensorFlow's own gs:// and google-cloud-storage both reach one
    fake Cloud Storage (tests/fakes/gcs.py), up once for the whole session."""
    from tests.fakes.gcs import GcsSandbox, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with GcsSandbox() as sandbox:
        yield sandbox


# What a skipped test lacked, read from its reason, and the command that provides it. A laptop
# run skips what this machine cannot do; the summary says so, and how to cover it (CI does).
SKIP_NEEDS = (  # the first key found in a reason names the group: the narrowest need first
    ("tcsh", "tcsh (a worker login shell)", "apt-get install -y tcsh"),
    ("openssh-server", "real SSH workers (sshd)", "apt-get install -y openssh-server (as root)"),
    ("network namespaces", "workers in network namespaces",
     "run as root where `ip netns` works (apt-get install -y iproute2)"),
    ("terraform", "Terraform", "make setup-terraform"),
    ("checkov", "checkov", "make setup-checkov"),
    (".venv-torch", "PyTorch + transformers 5.x (.venv-torch)", "make setup-torch"),
    ("gs:// sandbox", "the gs:// sandbox (mount and network namespaces)",
     "run as root with util-linux and iproute2; make setup"),
    ("namespaces here", "the gs:// sandbox (mount and network namespaces)",
     "run as root with util-linux and iproute2; make setup"),
    ("ns_last_pid", "steering process ids (ns_last_pid)", "run as root"),
    ("setpriv", "setpriv", "apt-get install -y util-linux"),
    ("could not import", "a Python package", "make setup"),
)


def skipped_groups(reasons: list[str]) -> list[str]:
    """One line per group of skipped tests: how many, what they need, what installs it."""
    groups: dict[tuple[str, str], int] = {}
    for reason in reasons:
        need, command = next(((n, c) for key, n, c in SKIP_NEEDS if key in reason), (reason, ""))
        if need == "a Python package":
            need = f"the Python package {reason.split(chr(39))[1]}" if "'" in reason else need
        groups[(need, command)] = groups.get((need, command), 0) + 1
    return [f"{count:4d} skipped: {need}" + (f"  ->  {command}" if command else "")
            for (need, command), count in sorted(groups.items(), key=lambda g: -g[1])]


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
