"""Small builders shared by the launcher tests: stand-in stages, tiny configs, the CLI."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from pathlib import Path

import yaml

HERE = Path(__file__).parent
REPO = HERE.parent
PYTHON = str(Path(REPO / ".venv/bin/python")) if (REPO / ".venv/bin/python").exists() else None


def install_stub(folder: Path, behaviour: dict | None = None) -> Path:
    """Copy the stand-in stages into `folder`, with what they should do wrong."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "stub_stages.py"
    shutil.copy(HERE / "stub_stages.py", target)
    (folder / "stub_stages.json").write_text(json.dumps(behaviour or {}))
    return target


def tiny_config(folder: Path, *, output_dir: str, cluster: dict, name: str = "t",
                corpus: str | None = None, **sections) -> Path:
    """A valid run config small enough for the real stages to finish in seconds."""
    folder.mkdir(parents=True, exist_ok=True)
    if corpus is None:
        corpus_file = folder / "corpus.txt"
        corpus_file.write_text("".join(f"line {i} of a tiny corpus for tests\n"
                                       for i in range(200)))
        corpus = str(corpus_file)
    raw = {
        "name": name,
        "output_dir": output_dir,
        "cluster": cluster,
        "data": {"corpus": corpus, "seq_len": 32, "validation_fraction": 0.1,
                 "records_per_shard": 50},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"steps": 4, "batch_size": 4, "learning_rate": 1e-3, "checkpoint_every": 2,
                  "eval_every": 2, "eval_batches": 1},
    }
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def wait_for(predicate, timeout_s: float = 30.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {predicate}")


def when_worker0_logs(tpuctl_home, run: str, text: str, action) -> threading.Thread:
    """Call `action` (a preemption, say) once worker 0's log of the run's job has `text`, from a
    thread of its own, started here: the test's command runs meanwhile."""

    def wait_then_act():
        wait_for(lambda: text in "".join(
            p.read_text() for p in tpuctl_home.glob(f"jobs/{run}/*/logs/worker-0.log")),
            timeout_s=90, interval_s=0.05)
        action()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def process_with_pid(pid: int, argv: list[str], attempts: int = 500):
    """An unrelated process, leader of its own session and group, that gets exactly `pid`:
    how a finished job's recorded process group id comes to be reused. The kernel hands out
    the id after the one in ns_last_pid (root only); other processes forking at the same moment
    can take it first, so this tries again. None where ids cannot be steered."""
    import os
    import subprocess

    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), timeout_s=30)
    for _ in range(attempts):
        try:
            with open(NS_LAST_PID, "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(argv, start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


@contextlib.contextmanager
def storage_emulator(host: str = "127.0.0.1", default_bucket: str | None = None):
    """A Cloud Storage emulator (gcp-storage-emulator, in memory) on a free port of `host`;
    yields its URL, for STORAGE_EMULATOR_HOST."""
    import socket

    import pytest

    server_mod = pytest.importorskip("gcp_storage_emulator.server")
    sock = socket.socket()
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    sock.close()
    server = server_mod.create_server(host, port, in_memory=True, default_bucket=default_bucket)
    server.start()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def use_cloud_stand_ins(monkeypatch, storage_url: str, *, poll_s: float) -> None:
    """Point the gcp provider at the stand-ins: Terraform on the twin module (needs terraform on
    PATH, else the test skips), Cloud Storage at the emulator, the API polled every `poll_s`."""
    import pytest

    if shutil.which("terraform") is None:
        pytest.skip("needs terraform on PATH (make setup-terraform)")
    from launcher.providers import gcp_infra, gcp_site
    from payload.core import storage

    monkeypatch.setattr(gcp_infra, "INFRA_MODULE", REPO / "tests" / "terraform_twin")
    monkeypatch.setattr(gcp_site, "POLL_S", poll_s)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage_url)
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/dev/null")
    monkeypatch.setattr(storage, "_client", None)


def invoke(*args):
    """`tpuctl ARGS` in this process (Typer's CliRunner); arguments may be paths or numbers."""
    from typer.testing import CliRunner

    from launcher.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def fleet_workers(fleet, indexes) -> list:
    """The fleet's workers `indexes` as a fake cloud's machines: their addresses and their real
    ed25519 host keys (what the guest agent would publish)."""
    from tests.fakes.tpu_api import Worker

    return [Worker(fleet.hosts[i], host_keys={"ssh-ed25519": fleet.host_keys[i].split()[1]})
            for i in indexes]


def attach_fleet(api, fleet) -> None:
    """`api.use_fleet(indexes)`: the fake cloud's next machines are those fleet workers; it
    starts with workers 0 and 1."""
    api.use_fleet = lambda indexes: api.set_workers(fleet_workers(fleet, indexes))
    api.use_fleet([0, 1])


def stub_stages(fleet, tmp_path: Path, behaviour: dict | None, monkeypatch) -> None:
    """The workers run the stub stages (install_stub) on the fleet's shared disk."""
    from launcher.launch import STAGE_ENTRY_ENV

    monkeypatch.setenv(STAGE_ENTRY_ENV, str(install_stub(fleet.shared / tmp_path.name[:40]
                                                         / "stub", behaviour)))


def kill_jobs(fleet, indexes=(0, 1)) -> None:
    """SIGKILL the job processes on the fleet's workers `indexes` (their machines were lost)."""
    import os

    for i in indexes:
        for line in fleet.job_processes(i):
            os.kill(int(line.split(":")[0]), 9)
