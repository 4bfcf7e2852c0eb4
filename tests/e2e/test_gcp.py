"""The gcp provider end to end against stand-ins: `tpuctl up` runs real terraform on the twin
module (whose TPU resource creates the node through the TPU API, as google_tpu_v2_vm does), the
TPU API is testbed/fakes/tpu_api.py driven by the real google-cloud-tpu client, and the node's
workers are the real sshd fleet, publishing the fleet's real host keys as guest attributes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from launcher.cli import app
from launcher.launch import STAGE_ENTRY_ENV
from testbed.fakes.tpu_api import FakeTpuApi, no_capacity, quota_exceeded
from tests.support.cloud import (
    attach_fleet,
    kill_jobs,
    stub_stages,
    use_cloud_stand_ins,
)
from tests.support.paths import REPO
from tests.support.runners import invoke
from tests.support.waits import wait_for, when_worker0_logs

runner = CliRunner()


def _key_body(host_key: str) -> str:
    return host_key.split()[1]


@pytest.fixture
def cloud(fleet, storage_emulator, tmp_path, tpuctl_home, monkeypatch):
    """A fake TPU API whose nodes are the fleet's first `hosts` workers, terraform on the twin."""
    if fleet.port != 22:
        pytest.skip("TPU workers listen on port 22: needs the fleet in network namespaces")
    from payload.core import storage

    use_cloud_stand_ins(monkeypatch, storage_emulator, poll_s=0.1)
    # The project's bucket exists already: `up` uses it as it is (and never deletes it).
    if storage.client().lookup_bucket("test-project-tpuctl") is None:
        storage.client().create_bucket("test-project-tpuctl")
    # On the fleet's bridge: the launcher here and the workers in their namespaces both reach it
    # (worker 0 deletes its own TPU through it after `train --down`).
    with FakeTpuApi(host=f"{fleet.subnet}.1") as api:
        monkeypatch.setenv("TPUCTL_TPU_API_ENDPOINT", api.endpoint)
        attach_fleet(api, fleet)
        yield api
    storage._client = None


def gcp_config(folder: Path, fleet, **cluster) -> Path:
    shared = fleet.shared / folder.name[:40]
    shared.mkdir(exist_ok=True)
    corpus = shared / "corpus.txt"
    corpus.write_text("".join(f"line {i} of a tiny corpus\n" for i in range(100)))
    raw = {
        "name": "tpurun",
        "output_dir": str(shared / "out"),
        "cluster": {"provider": "gcp", "project": "test-project", "zone": "us-central2-b",
                    "accelerator_type": "v4-16", "ssh_source_ranges": ["10.0.0.0/8"],
                    "user": "root", "identity_file": fleet.identity_file,
                    "python": sys.executable, **cluster},
        "data": {"corpus": str(corpus), "seq_len": 32},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        # v4-16: 8 chips, one replica each (payload.training.runplan.replicas_of)
        "train": {"steps": 4, "batch_size": 8, "learning_rate": 1e-3},
    }
    path = folder / "tpuctl.yaml"
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


def _one_line_error(result, *needles):
    assert result.exit_code != 0, result.output
    message = str(result.exception)
    for needle in needles:
        assert needle in message, message
    return message


def test_up_train_down_on_a_stand_in_pod_slice(cloud, fleet, tmp_path, tpuctl_home,
                                               monkeypatch):
    config = gcp_config(tmp_path, fleet)
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, up.output
    assert "TPU tpurun is READY" in up.output and "tpuctl down" in up.output
    # The v4-16 table says 2 hosts and the API agrees: nothing to report.
    assert "accelerator table" not in up.output
    known = (tpuctl_home / "gcp/tpurun/known_hosts").read_text().splitlines()
    assert known == [f"{fleet.hosts[i]} {fleet.host_keys[i]}" for i in (0, 1)]
    node = cloud.node("tpurun")
    assert node["metadata"]["ssh-keys"].startswith("root:ssh-ed25519 ")
    assert node["labels"]["tpuctl-run"] == "tpurun"
    uid = node["id"]
    # up twice changes nothing.
    again = invoke("up", "-c", config)
    assert again.exit_code == 0, again.output
    assert cloud.node("tpurun")["id"] == uid
    assert len(cloud.requests("CreateNode")) == 1

    stub_stages(fleet, tmp_path, None, monkeypatch)
    trained = invoke("train", "-c", config)
    assert trained.exit_code == 0, trained.output
    # The laptop's corpus went to the bucket, where TPU hosts can read it.
    assert "corpus staged in gs://test-project-tpuctl/corpus/: 1 files, 1 uploaded" in (
        trained.output)
    shipped = yaml.safe_load(next(tpuctl_home.glob("jobs/tpurun/*/config.yaml")).read_text())
    assert shipped["data"]["corpus"][0].startswith("gs://test-project-tpuctl/corpus/")
    # A pod slice: every host serves its TPU while worker 0 drives training.
    assert "worker-0 | train 0/2" in trained.output
    assert "worker-1 | train" not in trained.output
    assert trained.output.count("no TPU to serve here") == 2
    assert "TPUCTL_TPU_WORKERS" not in trained.output
    assert "TPU tpurun is still up ($25.76/h)" in trained.output

    status = invoke("status", "-c", config)
    assert status.exit_code == 0, status.output
    assert "TPU tpurun (v4-16 in us-central2-b): READY" in status.output
    assert f"worker-1: {fleet.hosts[1]}" in status.output and "$25.76/h" in status.output

    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert "nothing of run tpurun is left billing" in down.output
    assert cloud.node_names() == []
    twice = invoke("down", "-c", config)
    assert twice.exit_code == 0, twice.output


def test_a_jax_run_on_the_stand_in_pod_slice_trains_on_every_host(cloud, fleet, tmp_path,
                                                                   tpuctl_home, monkeypatch):
    """train.engine: jax: no TPU servers, no driver host: every host runs the train stage, each
    told worker 0's coordinator."""
    config = gcp_config(tmp_path, fleet)
    raw = yaml.safe_load(config.read_text())
    raw["train"]["engine"] = "jax"
    config.write_text(yaml.safe_dump(raw))
    assert invoke("up", "-c", config).exit_code == 0
    stub_stages(fleet, tmp_path, {"report_env": ["TPUCTL_JAX_COORDINATOR"]}, monkeypatch)
    trained = invoke("train", "-c", config, "--stages", "train")
    assert trained.exit_code == 0, trained.output
    assert "worker-0 | train 0/2" in trained.output and "worker-1 | train 1/2" in trained.output
    assert "no TPU to serve here" not in trained.output
    coordinators = {line.rsplit("=", 1)[1] for line in trained.output.splitlines()
                    if "train sees TPUCTL_JAX_COORDINATOR=" in line}
    assert len(coordinators) == 1 and next(iter(coordinators)).startswith(f"{fleet.hosts[0]}:")
    assert invoke("down", "-c", config).exit_code == 0


@pytest.mark.slow  # up, the four real stages on a worker over ssh, down: ~60-90 s here
def test_a_v6e_runs_every_real_stage_with_the_jax_engine(cloud, fleet, tmp_path, tpuctl_home,
                                                         monkeypatch):
    """Issue 19: a v6e-8 (one host in the accelerator table and the API) with `train.engine:
    jax`: `up`, then `train` with the real stages (tokenizer, prepare, train, export) over ssh on
    the fleet's worker, JAX on its CPU, then `down`. The same config on the TensorFlow engine is
    one line before anything is made."""
    monkeypatch.delenv(STAGE_ENTRY_ENV, raising=False)
    cloud.use_fleet([0])
    config = gcp_config(tmp_path, fleet, zone="us-east5-b", accelerator_type="v6e-8")
    raw = yaml.safe_load(config.read_text())
    raw["train"] = {"engine": "jax", "steps": 40, "batch_size": 8, "learning_rate": 5e-3,
                    "warmup_steps": 4, "eval_every": 20, "checkpoint_every": 20,
                    "eval_batches": 2}
    # Enough text for a validation split that evaluates (the shared tiny corpus has 100 lines).
    Path(raw["data"]["corpus"]).write_text("".join(
        f"sentence {i} about {['rivers', 'stones', 'light'][i % 3]} and tpus {i % 13}\n"
        for i in range(600)))
    raw["data"]["validation_fraction"] = 0.1
    out = Path(raw["output_dir"])

    tensorflow = yaml.safe_load(config.read_text())
    tensorflow["train"] = {**raw["train"], "engine": "tensorflow"}
    tf_config = tmp_path / "tensorflow.yaml"
    tf_config.write_text(yaml.safe_dump(tensorflow))
    for command in ("up", "train"):
        # (Exit status 2 through the real entry point: tests/test_bad_inputs.py.)
        message = _one_line_error(invoke(command, "-c", tf_config), "v6e-8",
                                  "set train.engine: jax")
        assert "\n" not in message
    assert cloud.node_names() == [] and not cloud.requests("CreateNode")
    assert not out.exists()

    config.write_text(yaml.safe_dump(raw))
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, up.output
    assert "TPU tpurun is READY" in up.output
    node = cloud.node("tpurun")
    assert node["acceleratorType"] == "v6e-8" and node["runtimeVersion"] == "v2-alpha-tpuv6e"
    trained = invoke("train", "-c", config)
    assert trained.exit_code == 0, trained.output[-5000:]
    assert "finished at step 40; weights sha256" in trained.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["engine"] == "jax" and metrics["final"]["step"] == 40
    evals = metrics["evals"]
    assert [e["step"] for e in evals] == [0, 20, 40], metrics
    assert evals[-1]["loss"] < 0.85 * evals[0]["loss"], evals  # it learned
    model = out / "model"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in model.iterdir()}
    assert json.loads((model / "tpuctl_export.json").read_text())["checkpoint"].endswith(
        "checkpoints/40")
    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert cloud.node_names() == []


def test_a_recreated_tpu_gets_new_addresses_and_keys_and_old_jobs_are_gone(
        cloud, fleet, tmp_path, tpuctl_home, monkeypatch):
    config = gcp_config(tmp_path, fleet)
    stub_stages(fleet, tmp_path, None, monkeypatch)
    assert invoke("up", "-c", config).exit_code == 0
    first = invoke("train", "-c", config, "--detach")
    assert first.exit_code == 0, first.output
    wait_for(lambda: invoke("status", "-c", config).output.count("exited") == 2, 60)
    # Preempted and recreated elsewhere: other hosts, other keys.
    cloud.preempt("tpurun")
    status = invoke("status", "-c", config)
    assert "PREEMPTED" in status.output, status.output
    assert invoke("down", "-c", config).exit_code == 0
    cloud.use_fleet([2, 1])
    assert invoke("up", "-c", config).exit_code == 0
    known = (tpuctl_home / "gcp/tpurun/known_hosts").read_text().splitlines()
    assert known[0] == f"{fleet.hosts[2]} {fleet.host_keys[2]}"
    stale = invoke("logs", "-c", config, "--no-follow")
    _one_line_error(stale, "the job's machines are gone", "recreated")
    second = invoke("train", "-c", config)
    assert second.exit_code == 0, second.output
    assert "worker-0 | train 0/2 on worker-2" in second.output
    assert invoke("down", "-c", config).exit_code == 0


def test_a_host_key_that_does_not_match_is_refused_and_nothing_runs(cloud, fleet, tmp_path,
                                                                    monkeypatch):
    config = gcp_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    cloud.set_host_key("tpurun", 1, _key_body(fleet.host_keys[2]))
    stub_stages(fleet, tmp_path, None, monkeypatch)
    result = invoke("train", "-c", config)
    _one_line_error(result, "worker-1", "host key does not match")
    assert not fleet.job_processes(0) and not fleet.job_processes(1)
    assert invoke("down", "-c", config).exit_code == 0


def test_a_worker_without_a_published_host_key_names_the_org_policy(cloud, fleet, tmp_path,
                                                                     monkeypatch):
    from launcher.providers import gcp_site

    monkeypatch.setattr(gcp_site, "HOST_KEYS_WAIT_S", 0.5)
    config = gcp_config(tmp_path, fleet)
    cloud.hide_guest_attributes()
    result = invoke("up", "-c", config)
    _one_line_error(result, "publishes no ssh-ed25519 host key",
                    "compute.disableGuestAttributesAccess", "nothing that bills is left")
    assert cloud.node_names() == []  # the failed up removed the TPU it made
    cloud.hide_guest_attributes(False)
    assert invoke("down", "-c", config).exit_code == 0


def test_host_keys_published_after_ready_are_waited_for(cloud, fleet, tmp_path):
    """The guest agent publishes host keys after boot, not at READY: `up` waits, saying so."""
    import threading

    config = gcp_config(tmp_path, fleet)
    cloud.hide_guest_attributes()
    asked = threading.Event()

    def publish_once_asked():  # the keys appear only after `up` has found none
        while not asked.is_set():
            if cloud.requests("GetGuestAttributes"):
                cloud.hide_guest_attributes(False)
                return
            asked.wait(0.05)

    publisher = threading.Thread(target=publish_once_asked)
    publisher.start()
    try:
        result = invoke("up", "-c", config)
    finally:
        asked.set()
        publisher.join()
    assert result.exit_code == 0, result.output
    assert "waiting for the host key of worker 0" in result.output
    assert result.output.count("waiting for the host key") == 1
    assert invoke("down", "-c", config).exit_code == 0


def test_a_reserved_request_names_its_reservation_and_marks_the_node_reserved(cloud, fleet,
                                                                             tmp_path):
    """As Google's TF release CI does (xlml/utils/tpu.py): the node of a request for reserved
    capacity carries scheduling_config.reserved."""
    reservation = "projects/test-project/locations/us-central2-b/reservations/my-tpus"
    config = gcp_config(tmp_path, fleet, reservation=reservation)
    cloud.plan_queued_resource("tpurun", wait_polls=1)
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, up.output
    body = cloud.requests("CreateQueuedResource")[0].body
    assert body["reservationName"] == reservation and "spot" not in body
    assert body["tpu"]["nodeSpec"][0]["node"]["schedulingConfig"] == {"reserved": True}
    assert invoke("down", "-c", config).exit_code == 0


def test_queued_request_waits_then_becomes_the_tpu(cloud, fleet, tmp_path):
    config = gcp_config(tmp_path, fleet, queued=True, provisioning="spot", queue_hours=2)
    cloud.plan_queued_resource("tpurun", wait_polls=3)
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, up.output
    assert "WAITING_FOR_RESOURCES" in up.output and "READY" in up.output
    body = cloud.requests("CreateQueuedResource")[0].body
    assert body["queueingPolicy"]["validUntilDuration"] == "7200s"
    assert "spot" in body
    assert body["tpu"]["nodeSpec"][0]["node"]["tags"][0].startswith("tpuctl-")
    assert len(cloud.requests("CreateNode")) == 0  # not Terraform: the queue made it
    assert invoke("down", "-c", config).exit_code == 0
    assert cloud.node_names() == [] and cloud.requests("ListQueuedResources")[-1] is not None


def test_a_failed_queued_request_is_shown_and_deleted(cloud, fleet, tmp_path):
    from testbed.fakes.tpu_api import ApiError

    config = gcp_config(tmp_path, fleet, queued=True)
    cloud.plan_queued_resource("tpurun", wait_polls=1, outcome="FAILED",
                               error=ApiError("RESOURCE_EXHAUSTED", "no v4 capacity today"))
    result = invoke("up", "-c", config)
    _one_line_error(result, "ended FAILED", "no v4 capacity today", "holds no quota")
    with pytest.raises(KeyError):
        cloud.queued_resource("tpurun")
    assert invoke("down", "-c", config).exit_code == 0


@pytest.mark.parametrize("case", ["quota", "permission", "api-disabled"])
def test_api_refusals_are_one_line_with_the_apis_reason(cloud, fleet, tmp_path, case):
    from testbed.fakes.tpu_api import permission_denied, service_disabled

    config = gcp_config(tmp_path, fleet)
    error, needle = {
        "quota": (quota_exceeded("us-central2-b", "TPUV4PodPerProjectPerZone"), "quota"),
        "permission": (permission_denied("tpu.acceleratorTypes.list", "projects/test-project"),
                       "permission denied"),
        "api-disabled": (service_disabled("test-project"), "gcloud services enable tpu"),
    }[case]
    cloud.fail("ListAcceleratorTypes", error)
    result = invoke("up", "-c", config)
    _one_line_error(result, needle)
    assert cloud.node_names() == []


def test_no_capacity_in_the_zone_falls_back_to_the_next(cloud, fleet, tmp_path):
    config = gcp_config(tmp_path, fleet, fallback_zones=["us-central2-a"])
    cloud.fail_operation("CreateNode", no_capacity("us-central2-b"))
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, up.output
    assert "trying us-central2-a" in up.output
    assert "READY in us-central2-a" in up.output
    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output


def test_down_of_a_run_never_up_is_one_line(cloud, fleet, tmp_path):
    config = gcp_config(tmp_path, fleet)
    _one_line_error(invoke("down", "-c", config), "never brought up")


def test_train_down_neither_runs_on_nor_deletes_a_tpu_made_by_hand(cloud, fleet, tmp_path,
                                                                  monkeypatch):
    """The run's TPU was deleted outside tpuctl and a node of the same name made by hand, the
    run's label copied onto it: `train --down` refuses it, and it keeps running untouched."""
    config = gcp_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    zone = "projects/test-project/locations/us-central2-b"
    cloud.client().delete_node(name=f"{zone}/nodes/tpurun").result()
    mine = str(cloud.client().create_node(parent=zone, node_id="tpurun", node={
        "accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base",
        "labels": {"tpuctl-run": "tpurun"}}).result().id)
    stub_stages(fleet, tmp_path, {"steps": {"train": 2}}, monkeypatch)
    result = invoke("train", "-c", config, "--down")
    _one_line_error(result, "TPU tpurun in us-central2-b", "was not made by tpuctl")
    assert cloud.node("tpurun")["id"] == mine and cloud.node("tpurun")["state"] == "READY"
    assert not fleet.job_processes(0) and not fleet.job_processes(1)


@pytest.mark.parametrize(("change", "needle"), [
    ({"accelerator_type": "v9-8"}, "unknown accelerator type 'v9-8'"),
    # In a v6e zone: in us-central2-b the zone is refused too, on a line of its own
    # (tests/test_bad_inputs.py: every problem at once).
    ({"accelerator_type": "v6e-8", "zone": "us-east5-b"}, "no working route on TPU v6e"),
    ({"zone": "europe-west4-a"}, "does not offer v4-16"),
    ({"runtime_version": "tpu-vm-tf-2.18.0-pod-pjrt"}, "runtime_version"),
    ({"runtime_version": "no-such-runtime"}, "unknown runtime_version"),
    ({"project": None}, "cluster.project"),
    ({"bucket": "UPPER_case"}, "not a bucket name"),
    ({"ssh_source_ranges": ["0.0.0.0/0"]}, "whole internet"),
    ({"ssh_source_ranges": ["not-a-cidr"]}, "not a CIDR"),
    ({"tpu_name": "9lives"}, "not a TPU name"),
    ({"fallback_zones": ["us-east1-d"]}, "cluster.fallback_zones"),
    ({"ssh_source_ranges": None}, "ssh_source_ranges is not set"),
])
def test_gcp_bad_inputs_are_one_line_and_create_nothing(cloud, fleet, tmp_path, change,
                                                        needle):
    config = gcp_config(tmp_path, fleet)
    raw = yaml.safe_load(config.read_text())
    for key, value in change.items():
        if value is None:
            raw["cluster"].pop(key)
        else:
            raw["cluster"][key] = value
    config.write_text(yaml.safe_dump(raw))
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "up", "-c", str(config)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], lines
    assert cloud.node_names() == [] and not cloud.requests("CreateNode")


def test_the_tpu_api_endpoint_reaches_the_workers(cloud, fleet, tmp_path, tpuctl_home):
    """Workers get the stand-in endpoint too, and with it train on the CPU."""
    config = gcp_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    dry = invoke("train", "-c", config, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert f"TPUCTL_TPU_API_ENDPOINT={cloud.endpoint}" in dry.output
    assert "--hardware tpu/v4-16/tpurun" in dry.output
    assert "python -m payload.cloud.tpu_server" in dry.output.replace(sys.executable, "python")
    assert "TPUCTL_TPU_WORKERS=grpc://" in dry.output
    assert json.loads((tpuctl_home / "gcp/tpurun/site.json").read_text()) == {
        "zone": "us-central2-b"}
    assert invoke("down", "-c", config).exit_code == 0


def test_doctor_checks_against_the_stand_ins(cloud, fleet, tmp_path):
    from testbed.fakes.tpu_api import service_disabled

    config = gcp_config(tmp_path, fleet)
    before = invoke("doctor", "-c", config)
    assert before.exit_code == 0, before.output
    assert "ok    Cloud TPU API enabled in test-project" in before.output
    assert "ok    v4-16 offered" in before.output
    assert "ok    runtime version offered: v2-alpha-tpuv5" in before.output
    assert "gs://test-project-tpuctl exists and is readable" in before.output
    assert "skip  TPU quota" in before.output
    assert "no TPU yet" in before.output
    assert invoke("up", "-c", config).exit_code == 0
    after = invoke("doctor", "-c", config)
    assert "ok    SSH reachable from here: 2 workers answer on port 22" in after.output
    cloud.set_accelerator_types(["v5litepod-8"], zone="us-central2-b")
    missing = invoke("doctor", "-c", config)
    assert missing.exit_code == 1
    assert "fix   v4-16 offered: us-central2-b does not offer v4-16" in missing.output
    cloud.fail("ListAcceleratorTypes", service_disabled("test-project"), times=None)
    disabled = invoke("doctor", "-c", config)
    assert disabled.exit_code == 1
    assert "gcloud services enable tpu.googleapis.com" in disabled.output
    cloud.clear_failures()
    assert invoke("down", "-c", config).exit_code == 0


def test_status_shows_state_symptoms_and_cost(cloud, fleet, tmp_path):
    config = gcp_config(tmp_path, fleet)
    before = invoke("status", "-c", config)
    assert "none in us-central2-b (bring it up with `tpuctl up`)" in before.output
    assert invoke("up", "-c", config).exit_code == 0
    cloud.set_health("tpurun", "UNHEALTHY_MAINTENANCE", "maintenance soon")
    cloud.set_symptoms("tpurun", [("HBM_OUT_OF_MEMORY", "worker 1 ran out of HBM", "1")])
    status = invoke("status", "-c", config)
    assert status.exit_code == 0, status.output
    assert "health UNHEALTHY_MAINTENANCE" in status.output
    assert "HBM_OUT_OF_MEMORY: worker 1 ran out of HBM" in status.output
    assert "$25.76/h; up 0.0 h, about $0.00 so far" in status.output
    assert "no job yet" in status.output
    raw = yaml.safe_load(config.read_text())
    raw["train"].update(max_hours=10, max_cost=250)
    config.write_text(yaml.safe_dump(raw))
    limited = invoke("status", "-c", config)
    assert "stops at train.max_hours 10 or train.max_cost $250.00: checkpoint, export" in (
        limited.output), limited.output
    assert invoke("down", "-c", config).exit_code == 0


def test_a_detached_job_with_down_deletes_its_own_tpu(cloud, fleet, tmp_path, monkeypatch):
    """--down with no launcher watching: worker 0 deletes the TPU through the API itself."""
    config = gcp_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    stub_stages(fleet, tmp_path, {"steps": {"train": 5}}, monkeypatch)
    started = invoke("train", "-c", config, "--down", "--detach")
    assert started.exit_code == 0, started.output
    assert "letting the workers delete their own TPU" in started.output

    def deleting():
        return cloud.node_names() == [] or cloud.node("tpurun")["state"] == "DELETING"

    log = fleet.shared / tmp_path.name[:40] / "out" / "logs" / "worker-0.log"
    try:
        wait_for(deleting, timeout_s=90)
    except AssertionError:
        raise AssertionError(log.read_text() if log.exists() else "no log") from None
    assert len(cloud.requests("DeleteNode")) == 1
    assert "deleting TPU tpurun (the run asked for --down)" in log.read_text()
    assert invoke("down", "-c", config).exit_code == 0
    assert cloud.node_names() == []


def test_a_failed_self_delete_is_loud_in_the_log_status_and_jobs(cloud, fleet, tmp_path,
                                                                  monkeypatch):
    """Issue 17, defect 2: the self-delete was denied (403) while the TPU kept billing, and only
    the agent's log said so. Now the log, `status` and `jobs --check` say it, with the fix."""
    from testbed.fakes.tpu_api import permission_denied

    config = gcp_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    stub_stages(fleet, tmp_path, {"steps": {"train": 2}}, monkeypatch)
    cloud.fail("DeleteNode", permission_denied("tpu.nodes.delete"))
    started = invoke("train", "-c", config, "--down", "--detach")
    assert started.exit_code == 0, started.output
    log = fleet.shared / tmp_path.name[:40] / "out" / "logs" / "worker-0.log"
    wait_for(lambda: log.exists() and "STILL UP AND BILLING" in log.read_text(), timeout_s=90)
    assert "run `tpuctl down`" in log.read_text()
    assert cloud.node("tpurun")["state"] == "READY"  # the denied delete left it billing

    wait_for(lambda: "self-delete failed" in invoke("status", "-c", config).output,
             timeout_s=60)
    status = invoke("status", "-c", config)
    assert status.exit_code == 0, status.output
    assert "WARNING: the job asked for --down, but its self-delete failed" in status.output
    assert "TPU tpurun is still up" in status.output and "tpuctl down" in status.output
    jobs = runner.invoke(app, ["jobs", "-c", str(config), "--check"], env={"COLUMNS": "400"})
    assert "the job asked for --down, but its self-delete failed" in jobs.output, jobs.output
    assert invoke("down", "-c", config).exit_code == 0
    assert cloud.node_names() == []
    status = invoke("status", "-c", config)
    assert "self-delete failed" not in status.output


def test_preemption_is_recovered_with_auto_resume(cloud, fleet, tmp_path, tpuctl_home,
                                                  monkeypatch):
    """The node is preempted mid-training and its workers' processes die: --auto-resume 1
    deletes it, recreates it, ships again and resumes from the newest checkpoint."""

    from launcher import job_control, launch

    monkeypatch.setattr(job_control, "TROUBLE_EVERY_S", 1.0)
    config = gcp_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    first_uid = cloud.node("tpurun")["id"]
    stub_stages(fleet, tmp_path, {"steps": {"train": 60}, "checkpoint_every": 10}, monkeypatch)
    out = fleet.shared / tmp_path.name[:40] / "out"

    def preempt_mid_training():
        cloud.preempt("tpurun")
        kill_jobs(fleet, (0, 1))

    killer = when_worker0_logs(tpuctl_home, "tpurun", "step 25 ",
                                       preempt_mid_training)
    result = invoke("train", "-c", config, "--auto-resume", "1")
    killer.join(timeout=5)
    assert result.exit_code == 0, result.output
    assert "PREEMPTED: recovering (1 of 1)" in result.output
    assert "resuming from step" in result.output
    history = json.loads((out / "recoveries.json").read_text())
    assert len(history) == 1 and "PREEMPTED" in history[0]["reason"]
    redone = history[0]["lost_at_step"] - history[0]["resumed_from_step"]
    assert 0 <= redone <= 10, history  # at most checkpoint_every steps trained twice
    assert "step 60 loss" in result.output
    assert cloud.node("tpurun")["id"] != first_uid
    billing = json.loads((out / ".tpuctl" / "billing.json").read_text())["nodes"]
    assert [n["uid"] for n in billing] == [first_uid, cloud.node("tpurun")["id"]]
    assert billing[0]["deleted"] is not None and billing[1]["deleted"] is None
    assert invoke("down", "-c", config).exit_code == 0
    del launch
    # Issue 37: the goodput report shows the preemption, the steps redone and the recovery,
    # and its dollars add up to the billing record (closed by `down`) at the table's price.
    billing = json.loads((out / ".tpuctl" / "billing.json").read_text())["nodes"]
    assert all(n["deleted"] is not None for n in billing)
    shown = invoke("goodput", "-c", config, "--format", "json")
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.output)
    buckets = report["buckets"]
    assert sum(b["seconds"] for b in buckets.values()) == pytest.approx(report["wall_s"],
                                                                        rel=0.01)
    rate = report["price"]["usd_per_hour"]
    billed = sum(n["deleted"] - n["created"] for n in billing) * rate / 3600
    assert sum(b["dollars"] for b in buckets.values()) == pytest.approx(billed, rel=0.01)
    [hit] = report["disruptions"]
    assert hit["lost_at_step"] == history[0]["lost_at_step"]
    assert hit["resumed_from_step"] == history[0]["resumed_from_step"]
    assert hit["steps_redone"] == redone and hit["recovery_s"] > 0
    # (The stand-in stages compile nothing; the real ones do: test_launch_pipeline.py.)
    for name in ("provisioning", "environment_setup", "checkpoint_save", "productive",
                 "wasted_progress_from_disruption", "infrastructure_recovery_from_disruption"):
        assert buckets[name]["seconds"] > 0, (name, buckets)
    assert hit["wasted_dollars"] > 0
    text = invoke("goodput", "-c", config)
    assert f"{redone} steps redone" in text.output and "billed chip-hours" in text.output


def test_without_auto_resume_a_preemption_ends_the_run_naming_it(cloud, fleet, tmp_path,
                                                                  tpuctl_home, monkeypatch):
    from launcher import job_control

    monkeypatch.setattr(job_control, "TROUBLE_EVERY_S", 1.0)
    config = gcp_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    stub_stages(fleet, tmp_path, {"steps": {"train": 600}}, monkeypatch)
    when_worker0_logs(tpuctl_home, "tpurun", "step 5 ",
                              lambda: cloud.preempt("tpurun"))
    result = invoke("train", "-c", config, "--down")
    assert result.exit_code == 1, result.output
    assert "TPU tpurun is PREEMPTED" in result.output
    assert cloud.node_names() == []  # --down: nothing is left, billing or holding quota
    assert "still up" not in result.output


def test_queued_request_is_cancelled_when_the_launcher_gives_up(cloud, fleet, tmp_path):
    config = gcp_config(tmp_path, fleet, queued=True, queue_hours=0.0005)
    cloud.plan_queued_resource("tpurun", wait_polls=None)  # waits until its deadline
    result = invoke("up", "-c", config)
    _one_line_error(result, "queued request tpurun", "holds no quota")
    with pytest.raises(KeyError):
        cloud.queued_resource("tpurun")
    assert cloud.node_names() == []


def test_a_limit_reached_before_training_ends_the_job_and_deletes_the_tpu(
        cloud, fleet, tmp_path, monkeypatch):
    """The real stages on the stand-in pod slice, detached: train.max_hours is over before
    the first step (the TPU bills from its creation, set-up included), so the agents end the
    job at once, in its first stage, and worker 0 deletes the TPU (--down). The limit binds the
    whole job, not only the training loop (which stops by itself with a checkpoint:
    tests/test_train.py)."""
    monkeypatch.delenv(STAGE_ENTRY_ENV, raising=False)
    config = gcp_config(tmp_path, fleet)
    raw = yaml.safe_load(config.read_text())
    raw["train"].update(steps=200, checkpoint_every=100, eval_every=100, eval_batches=1)
    config.write_text(yaml.safe_dump(raw))
    assert invoke("up", "-c", config).exit_code == 0
    started = invoke("train", "-c", config, "--down", "--detach", "--max-hours", "0.000001")
    assert started.exit_code == 0, started.output
    out = fleet.shared / tmp_path.name[:40] / "out"
    log = out / "logs" / "worker-0.log"

    def deleting():
        return cloud.node_names() == [] or cloud.node("tpurun")["state"] == "DELETING"

    try:
        wait_for(deleting, timeout_s=400, interval_s=1.0)
    except AssertionError:
        raise AssertionError(log.read_text() if log.exists() else "no log") from None
    text = log.read_text()
    assert "stopping, train.max_hours 1e-06 reached" in text
    assert "== tpuctl: tokenizer on worker-0 ==" not in text  # ended before its first stage
    assert not (out / "metrics.json").exists() and not (out / "model").exists()
    assert "deleting TPU tpurun (the run asked for --down)" in text
    assert invoke("down", "-c", config).exit_code == 0
