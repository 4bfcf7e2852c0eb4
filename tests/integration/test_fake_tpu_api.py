"""The fake TPU API (testbed/fakes/tpu_api.py) as the real google-cloud-tpu client sees it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest
from google.api_core import exceptions

from testbed.fakes import tpu_api
from testbed.fakes.tpu_api import FakeTpuApi
from tests.support.paths import REPO
from tests.support.runners import payload_env
from tests.support.tpu_api_calls import create, name


@pytest.fixture
def api():
    with FakeTpuApi() as fake:
        yield fake


@pytest.fixture
def client(api):
    return api.client()






def test_runs_as_its_own_process_and_is_driven_over_http(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "testbed.fakes.tpu_api", "--port", "0"],
                            cwd=REPO, env=payload_env(), stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        endpoint = f"http://127.0.0.1:{port}"

        def control(method, **kwargs):
            request = urllib.request.Request(f"{endpoint}/_fake/{method}", method="POST",
                                             data=json.dumps(kwargs).encode())
            with urllib.request.urlopen(request, timeout=10) as answer:
                return json.load(answer)["result"]

        control("set_workers", workers=[{"ip": "10.9.0.7", "host_keys": {"ssh-ed25519": "K"}}])
        control("fail", rpc="GetNode", error={"preset": "not_found", "name": "x"})
        remote = tpu_api.tpu_client(endpoint)
        node = create(remote, "run").result()
        assert [e.ip_address for e in node.network_endpoints] == ["10.9.0.7"]
        with pytest.raises(exceptions.NotFound):
            remote.get_node(name=name("run"))
        control("preempt", node="run")
        assert remote.get_node(name=name("run")).state.name == "PREEMPTED"
        assert [r["rpc"] for r in control("requests")][:2] == ["CreateNode", "GetOperation"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
