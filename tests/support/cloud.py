"""The local stand-ins (the `testbed` package) wired to the launcher: stand-in stages, a storage
emulator, fake clouds whose machines are the sshd fleet's workers.

    stub = install_stub(tmp_path / "stub", {"fail": {"prepare": 1}})
    with storage_server() as url: ...
    use_cloud_stand_ins(monkeypatch, url, poll_s=0.05)
    attach_fleet(api, fleet); api.use_fleet([2])
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from testbed import install_stub
from tests.support.paths import TERRAFORM_TWIN


def stub_stages(fleet, tmp_path: Path, behaviour: dict | None, monkeypatch) -> None:
    """The workers run the stub stages (install_stub) on the fleet's shared disk."""
    from launcher.launch import STAGE_ENTRY_ENV

    monkeypatch.setenv(STAGE_ENTRY_ENV, str(install_stub(fleet.shared / tmp_path.name[:40]
                                                         / "stub", behaviour)))


@contextlib.contextmanager
def storage_server(host: str = "127.0.0.1", default_bucket: str | None = None):
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

    monkeypatch.setattr(gcp_infra, "INFRA_MODULE", TERRAFORM_TWIN)
    monkeypatch.setattr(gcp_site, "POLL_S", poll_s)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage_url)
    monkeypatch.setenv("TF_CLI_CONFIG_FILE", "/dev/null")
    monkeypatch.setattr(storage, "_client", None)


def fleet_workers(fleet, indexes) -> list:
    """The fleet's workers `indexes` as a fake cloud's machines: their addresses and their real
    ed25519 host keys (what the guest agent would publish)."""
    from testbed.fakes.tpu_api import Worker

    return [Worker(fleet.hosts[i], host_keys={"ssh-ed25519": fleet.host_keys[i].split()[1]})
            for i in indexes]


def attach_fleet(api, fleet) -> None:
    """`api.use_fleet(indexes)`: the fake cloud's next machines are those fleet workers; it
    starts with workers 0 and 1."""
    api.use_fleet = lambda indexes: api.set_workers(fleet_workers(fleet, indexes))
    api.use_fleet([0, 1])


def kill_jobs(fleet, indexes=(0, 1)) -> None:
    """SIGKILL the job processes on the fleet's workers `indexes` (their machines were lost)."""
    for i in indexes:
        for line in fleet.job_processes(i):
            os.kill(int(line.split(":")[0]), 9)
