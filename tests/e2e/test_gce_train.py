"""Training on provider gce against stand-ins, end to end: `up` (real terraform on the slice twin,
Compute Engine as testbed/fakes/compute.py), `train` with the JAX engine on both VMs of the slice
(the real sshd fleet; the corpus staged through the Cloud Storage emulator; JAX on the CPU because
the Compute endpoint is a stand-in), `status`, `down`; a spot VM preempted mid-training and
recovered with --auto-resume; `train --down` deleting the run's own slice from worker 0."""

from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path

import pytest
import yaml

from launcher.launch import STAGE_ENTRY_ENV
from launcher.providers import gce, gce_api
from testbed.fakes.compute import FakeCompute
from tests.support.cloud import attach_fleet, kill_jobs, stub_stages, use_cloud_stand_ins
from tests.support.paths import TERRAFORM_TWIN_SLICE
from tests.support.runners import invoke
from tests.support.waits import wait_for, when_worker0_logs

PROJECT, REGION, ZONE = "test-project", "us-east5", "us-east5-b"
TWIN = TERRAFORM_TWIN_SLICE
BUCKET = f"{PROJECT}-tpuctl"


@pytest.fixture
def cloud(fleet, storage_emulator, tpuctl_home, monkeypatch):
    """A fake Compute Engine on the fleet's bridge whose VMs are the fleet's workers 0 and 1."""
    if fleet.port != 22:
        pytest.skip("the VMs listen on port 22: needs the fleet in network namespaces")
    from payload.core import storage

    use_cloud_stand_ins(monkeypatch, storage_emulator, poll_s=0.05)
    monkeypatch.setattr(gce, "SLICE_MODULE", TWIN)
    if storage.client().lookup_bucket(BUCKET) is None:
        storage.client().create_bucket(BUCKET)
    with FakeCompute(host=f"{fleet.subnet}.1") as api:
        monkeypatch.setenv(gce_api.ENDPOINT_ENV, api.endpoint)
        attach_fleet(api, fleet)
        yield api
    storage._client = None


def _corpus(folder: Path) -> Path:
    path = folder / "corpus.txt"
    path.write_text("".join(f"sentence {i} about {' '.join(['rivers', 'stones'][i % 2:])} "
                            f"and light {i % 13}\n" for i in range(400)))
    return path


def gce_config(folder: Path, fleet, *, train: dict | None = None, **cluster) -> Path:
    """A 2-VM v6e slice (ct6e-standard-4t, 2x4) on spot VMs; output on the fleet's shared disk."""
    shared = fleet.shared / folder.name[:40]
    shared.mkdir(exist_ok=True)
    raw = {
        "name": "trillium",
        "output_dir": str(shared / "out"),
        "cluster": {"provider": "gce", "project": PROJECT, "zone": ZONE,
                    "machine_type": "ct6e-standard-4t", "topology": "2x4",
                    "provisioning": "spot", "ssh_source_ranges": ["10.0.0.0/8"],
                    "user": "root", "identity_file": fleet.identity_file,
                    "python": sys.executable, **cluster},
        "data": {"corpus": str(_corpus(shared)), "seq_len": 32, "validation_fraction": 0.1,
                 "records_per_shard": 50},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"engine": "jax", "steps": 4, "batch_size": 8, "learning_rate": 1e-3,
                  **(train or {})},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _out(fleet, tmp_path: Path) -> Path:
    return fleet.shared / tmp_path.name[:40] / "out"


def _nothing_left(cloud) -> bool:
    return (cloud.group_names() == cloud.instance_names() == cloud.template_names()
            == cloud.policy_names() == cloud.firewall_names() == [])


@pytest.mark.slow  # the real stages, two JAX processes over two VMs: ~2 min here
def test_up_train_status_down_with_jax_on_a_stand_in_slice(cloud, fleet, tmp_path,
                                                           tpuctl_home, monkeypatch):
    """Every real stage: tokenizer, prepare on both VMs, train (one JAX program over both VMs,
    told its peers by the launcher, on the CPU), export. The run learns."""
    monkeypatch.delenv(STAGE_ENTRY_ENV, raising=False)
    config = gce_config(tmp_path, fleet, train={
        "steps": 20, "learning_rate": 5e-3, "checkpoint_every": 10, "eval_every": 10,
        "eval_batches": 2})
    up = invoke("up", "-c", config)
    assert up.exit_code == 0, up.output
    # The plan gives JAX its peers explicitly: worker 0's coordinator, the count, the index.
    dry = invoke("train", "-c", config, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "2 workers, hardware tpu/v6e-8/trillium" in dry.output
    assert f"'TPUCTL_JAX_COORDINATOR=<VM 0 internal address>:{gce.COORDINATOR_PORT}'" in (
        dry.output)
    assert f"TPUCTL_COMPUTE_API_ENDPOINT={cloud.endpoint}" in dry.output
    assert "--worker-index 1 --num-workers 2" in dry.output
    assert "payload.cloud.tpu_server" not in dry.output  # no TPU servers, no driver host

    trained = invoke("train", "-c", config)
    assert trained.exit_code == 0, trained.output
    assert f"corpus staged in gs://{BUCKET}/corpus/" in trained.output
    # Both VMs trained as one program and ended with the same weights.
    hashes = re.findall(r"worker-(\d) \| .*finished at step 20; weights sha256 (\w+)",
                        trained.output)
    assert sorted(w for w, _ in hashes) == ["0", "1"], trained.output
    assert hashes[0][1] == hashes[1][1]
    out = _out(fleet, tmp_path)
    metrics = json.loads((out / "metrics.json").read_text())
    # JAX on each VM's CPU (the Compute endpoint is a stand-in): one device per process.
    assert metrics["engine"] == "jax" and metrics["replicas"] == 2, metrics
    evals = metrics["evals"]
    assert evals[-1]["loss"] < evals[0]["loss"], evals  # it learned
    assert (out / "model" / "model.safetensors").exists()
    assert "slice trillium is still up" in trained.output

    status = invoke("status", "-c", config)
    assert status.exit_code == 0, status.output
    assert "slice trillium (v6e-8 = 2x4 on ct6e-standard-4t in us-east5-b): RUNNING" in (
        status.output)
    assert "20/20" in status.output, status.output

    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert "nothing of run trillium is left billing" in down.output
    assert _nothing_left(cloud)


def test_a_preempted_spot_vm_is_recovered_and_the_job_resumes(cloud, fleet, tmp_path,
                                                               tpuctl_home, monkeypatch):
    """A spot VM taken back mid-training, its processes gone: --auto-resume 1 sees it, deletes
    and recreates the run's MIG (provider.recover), ships again and resumes from the newest
    checkpoint to the final step."""
    from launcher import job_control

    monkeypatch.setattr(job_control, "TROUBLE_EVERY_S", 1.0)
    config = gce_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    first_uid = str(gce_api.ComputeApi(project=PROJECT, region=REGION).group("trillium").uid)
    stub_stages(fleet, tmp_path, {"steps": {"train": 60}, "checkpoint_every": 10}, monkeypatch)
    out = _out(fleet, tmp_path)

    def preempt_mid_training():
        victim = cloud.instance_names()[1]
        cloud.preempt(victim)
        kill_jobs(fleet, (0, 1))  # the slice is lost: bulk TPU VMs go together

    killer = when_worker0_logs(tpuctl_home, "trillium", "step 25 ",
                                       preempt_mid_training)
    result = invoke("train", "-c", config, "--auto-resume", "1")
    killer.join(timeout=5)
    assert result.exit_code == 0, result.output
    # A spot VM taken back is deleted (instanceTerminationAction DELETE), not TERMINATED.
    assert re.search(r"slice trillium lost a VM: 1 of its 2 left .*: recovering \(1 of 1\)",
                     result.output), result.output
    assert "deleting instance group trillium" in result.output
    assert "resuming from step" in result.output
    assert "step 60 loss" in result.output
    history = json.loads((out / "recoveries.json").read_text())
    assert len(history) == 1 and "lost a VM" in history[0]["reason"]
    assert 0 <= history[0]["lost_at_step"] - history[0]["resumed_from_step"] <= 10, history
    new_uid = str(gce_api.ComputeApi(project=PROJECT, region=REGION).group("trillium").uid)
    assert new_uid != first_uid
    billing = json.loads((out / ".tpuctl" / "billing.json").read_text())["nodes"]
    assert [n["uid"] for n in billing] == [first_uid, new_uid]
    assert billing[0]["deleted"] is not None and billing[1]["deleted"] is None
    assert invoke("down", "-c", config).exit_code == 0
    assert _nothing_left(cloud)


def test_a_detached_job_with_down_deletes_its_own_slice(cloud, fleet, tmp_path, monkeypatch):
    """--down with no launcher watching: worker 0 deletes the run's MIG (and with it the VMs)
    through Compute Engine, checked by the id `up` recorded; `down` removes the rest."""
    config = gce_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    stub_stages(fleet, tmp_path, {"steps": {"train": 5}}, monkeypatch)
    started = invoke("train", "-c", config, "--down", "--detach")
    assert started.exit_code == 0, started.output
    assert "worker 0 deletes slice trillium when the job ends" in started.output
    log = _out(fleet, tmp_path) / "logs" / "worker-0.log"
    try:
        wait_for(lambda: cloud.group_names() == [], timeout_s=90)
    except AssertionError:
        raise AssertionError(log.read_text() if log.exists() else "no log") from None
    assert len(cloud.requests("regionInstanceGroupManagers.delete")) == 1
    assert cloud.instance_names() == []  # the VMs went with their MIG
    wait_for(lambda: log.exists() and "deleting slice trillium (the run asked for --down)" in (
        log.read_text()), timeout_s=30)
    # What costs nothing (template, policy, firewall rules) waits for `down`.
    assert [name[:len("trillium-")] for name in cloud.template_names()] == ["trillium-"]
    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert _nothing_left(cloud)


def test_down_on_a_slice_recreated_under_the_run_name_deletes_nothing(cloud, fleet, tmp_path,
                                                                      monkeypatch):
    """The self-delete checks the MIG's id: one recreated under the same name is left alone."""
    from payload.cloud import self_delete

    config = gce_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    group = gce_api.ComputeApi(project=PROJECT, region=REGION).group("trillium")
    spec = {"api": "compute", "project": PROJECT, "zone": ZONE, "region": REGION,
            "name": "trillium", "uid": str(int(group.uid) + 1), "api_endpoint": cloud.endpoint}
    assert "another instance group now" in self_delete.delete_own(spec)
    assert cloud.group_names() == ["trillium"]
    assert self_delete.delete_own({**spec, "uid": group.uid}).startswith("deleting slice")
    assert cloud.group_names() == []
    assert self_delete.delete_own(spec) == "slice trillium is already gone"
    assert invoke("down", "-c", config).exit_code == 0
    assert _nothing_left(cloud)


def test_a_limit_reached_ends_the_job_and_worker_0_deletes_the_slice(cloud, fleet, tmp_path,
                                                                     monkeypatch):
    """train.max_hours is over before the first stage (the slice bills from its creation):
    the agents end the job at once, detached, and worker 0 deletes the run's MIG (--down). The
    limit is the agents' (payload.jobs.agent), so the stub stages stand in for the real ones."""
    config = gce_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    stub_stages(fleet, tmp_path, {"steps": {"train": 600}}, monkeypatch)
    started = invoke("train", "-c", config, "--down", "--detach", "--max-hours", "0.000001")
    assert started.exit_code == 0, started.output
    log = _out(fleet, tmp_path) / "logs" / "worker-0.log"
    try:
        wait_for(lambda: cloud.group_names() == [], timeout_s=90)
        wait_for(lambda: log.exists() and "deleting slice trillium" in log.read_text(),
                 timeout_s=30)
    except AssertionError:
        raise AssertionError(log.read_text() if log.exists() else "no log") from None
    assert "stopping, train.max_hours 1e-06 reached" in log.read_text()
    assert "== tpuctl: train on worker-0 ==" not in log.read_text()
    assert invoke("down", "-c", config).exit_code == 0
    assert _nothing_left(cloud)


def test_without_auto_resume_a_lost_vm_ends_the_run_and_down_removes_the_slice(
        cloud, fleet, tmp_path, tpuctl_home, monkeypatch):
    from launcher import job_control

    monkeypatch.setattr(job_control, "TROUBLE_EVERY_S", 1.0)
    config = gce_config(tmp_path, fleet)
    assert invoke("up", "-c", config).exit_code == 0
    stub_stages(fleet, tmp_path, {"steps": {"train": 600}}, monkeypatch)

    when_worker0_logs(tpuctl_home, "trillium", "step 5 ",
                              lambda: cloud.preempt(cloud.instance_names()[0]))
    result = invoke("train", "-c", config, "--down")
    assert result.exit_code == 1, result.output
    assert "slice trillium lost a VM" in result.output
    assert _nothing_left(cloud)  # --down: nothing is left billing or holding quota
    assert "still up" not in result.output


@pytest.mark.slow  # the real stages twice over (before and after the preemption): ~2-3 min
def test_a_preempted_slice_resumes_the_real_jax_run_from_its_checkpoint(
        cloud, fleet, tmp_path, tpuctl_home, monkeypatch):
    """The same recovery with the real stages: the JAX run on both VMs loses them mid-training,
    --auto-resume brings up a new MIG, and training resumes from the newest Orbax checkpoint
    (not from step 0) to the final step, both VMs ending with the same weights."""
    from launcher import job_control

    monkeypatch.setattr(job_control, "TROUBLE_EVERY_S", 1.0)
    monkeypatch.delenv(STAGE_ENTRY_ENV, raising=False)
    config = gce_config(tmp_path, fleet, train={
        "steps": 300, "learning_rate": 5e-3, "checkpoint_every": 20, "eval_every": 20,
        "eval_batches": 1})
    assert invoke("up", "-c", config).exit_code == 0
    out = _out(fleet, tmp_path)

    def newest_step() -> int:
        from payload.training import progress

        lines = "".join(p.read_text(errors="replace") for p in tpuctl_home.glob(
            "jobs/trillium/*/logs/worker-0.log")).splitlines()
        records = [r for r in map(progress.parse, lines) if r and r["kind"] == "train"]
        return records[-1]["step"] if records else 0

    def preempt_mid_training():
        wait_for(lambda: newest_step() >= 40, timeout_s=240, interval_s=0.05)
        cloud.preempt(cloud.instance_names()[0])
        kill_jobs(fleet, (0, 1))

    killer = threading.Thread(target=preempt_mid_training, daemon=True)
    killer.start()
    result = invoke("train", "-c", config, "--auto-resume", "1")
    killer.join(timeout=5)
    assert result.exit_code == 0, result.output
    assert re.search(r"lost a VM: .*: recovering \(1 of 1\)", result.output), result.output
    history = json.loads((out / "recoveries.json").read_text())
    assert len(history) == 1 and history[0]["resumed_from_step"] >= 20, history
    assert 0 <= history[0]["lost_at_step"] - history[0]["resumed_from_step"] <= 20, history
    hashes = re.findall(r"worker-(\d) \| .*finished at step 300; weights sha256 (\w+)",
                        result.output)
    assert sorted(w for w, _ in hashes) == ["0", "1"], result.output
    assert hashes[0][1] == hashes[1][1]
    assert (out / "model" / "model.safetensors").exists()
    assert invoke("down", "-c", config).exit_code == 0
    assert _nothing_left(cloud)
