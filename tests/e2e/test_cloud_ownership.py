"""tpuctl deletes or claims in the cloud only what it can show it made (issue 16, points 1-3):
a TPU of the run's name made by hand survives a failed `up`, `down`, `status`, a recovery and
`train --down`; objects in the bucket that are not the run's survive `down --delete-bucket`.

The TPU API is testbed/fakes/tpu_api.py, driven by the real google-cloud-tpu client; `up` and
`down` run real terraform on the twin module (its TPU is created and deleted by name through
that API, as google_tpu_v2_vm does); Cloud Storage is the in-memory emulator. No worker is
reached over SSH here: a node's workers are addresses with published host keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.fakes.tpu_api import FakeTpuApi, Worker
from tests.support.cloud import storage_server, use_cloud_stand_ins
from tests.support.cloud_owned import (
    COPIED_LABEL,
    FALLBACK,
    HOST_KEY,
    PROJECT,
    ZONE,
    config_file,
    invoke,
    make_by_hand,
)
from tests.support.paths import REPO
from tests.support.runners import assert_user_error, tpuctl


@pytest.fixture(scope="module")
def storage_url():
    with storage_server("127.0.0.1") as url:
        yield url


@pytest.fixture
def cloud(storage_url, tpuctl_home, monkeypatch):
    from payload.core import storage

    use_cloud_stand_ins(monkeypatch, storage_url, poll_s=0.05)
    for bucket in list(storage.client().list_buckets()):  # each test starts from nothing
        for blob in bucket.list_blobs(versions=True):
            blob.delete()
        if bucket.name != "test-project-tpuctl":
            bucket.delete()
    if storage.client().lookup_bucket("test-project-tpuctl") is None:
        storage.client().create_bucket("test-project-tpuctl")
    with FakeTpuApi(host="127.0.0.1") as api:
        monkeypatch.setenv("TPUCTL_TPU_API_ENDPOINT", api.endpoint)
        api.set_workers([Worker(f"10.9.0.{i}", host_keys={"ssh-ed25519": HOST_KEY})
                         for i in (2, 3)])
        yield api
    storage._client = None






def node_ids(api: FakeTpuApi) -> list[str]:
    return sorted(api.node(name)["id"] for name in api.node_names())




def run_cli(*args) -> subprocess.CompletedProcess:
    """The CLI in its own process: exit status and stderr as a user sees them."""
    return subprocess.run([sys.executable, "-m", "launcher.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]




# -- 1. a failed `up` ---------------------------------------------------------------------------


@pytest.mark.parametrize("labels", [None, COPIED_LABEL], ids=["unlabelled", "label-copied"])
def test_up_refuses_a_hand_made_node_of_the_runs_name_and_creates_nothing(
        cloud, tmp_path, tpuctl_home, labels):
    from payload.core.errors import UserError

    mine = make_by_hand(cloud, labels=labels)
    config = config_file(tmp_path)
    result = invoke("up", "-c", config)  # in this process: Terraform is the twin
    assert isinstance(result.exception, UserError), result.output
    assert node_ids(cloud) == [mine]
    assert not cloud.requests("DeleteNode")
    assert not (tpuctl_home / "infra" / "tpurun" / "terraform.tfstate").exists()
    one_error_line(run_cli("up", "-c", config), "TPU tpurun in us-central2-b",
                   "was not made by tpuctl",
                   "gcloud compute tpus tpu-vm delete tpurun --zone us-central2-b",
                   "cluster.tpu_name")
    assert node_ids(cloud) == [mine]


def test_a_failed_up_deletes_only_the_runs_own_tpu(cloud, tmp_path, tpuctl_home, monkeypatch):
    """The run's TPU is in its zone; a node of the same name made by hand is in the fallback
    zone. `up` fails (no host keys): the run's node goes, the hand-made one stays."""
    from launcher.providers import gcp_site

    monkeypatch.setattr(gcp_site, "HOST_KEYS_WAIT_S", 0.5)  # keys published late: not waited for
    config = config_file(tmp_path, fallback_zones=[FALLBACK])
    assert invoke("up", "-c", config).exit_code == 0
    mine = make_by_hand(cloud, zone=FALLBACK, labels=COPIED_LABEL)
    cloud.hide_guest_attributes()
    failed = invoke("up", "-c", config)
    assert failed.exit_code != 0
    assert node_ids(cloud) == [mine]
    assert "nothing that bills is left" in str(failed.exception)
    assert "TPU tpurun in us-central2-a (id " in failed.output
    assert "left alone" in failed.output


# -- 2. down, status, recovery, train --down ----------------------------------------------------


def test_down_of_a_run_never_up_leaves_a_hand_made_node_alone(cloud, tmp_path):
    mine = make_by_hand(cloud, labels=COPIED_LABEL)
    proc = run_cli("down", "-c", config_file(tmp_path))
    one_error_line(proc, "never brought up", "TPU tpurun in us-central2-b",
                   "tpuctl has no record of making it", "gcloud compute tpus tpu-vm delete")
    assert node_ids(cloud) == [mine]


def _replace_by_hand(cloud) -> str:
    """The run's node is deleted outside tpuctl and someone makes another of the same name."""
    cloud.client().delete_node(name=f"projects/{PROJECT}/locations/{ZONE}/nodes/tpurun").result()
    return make_by_hand(cloud, labels=COPIED_LABEL)


def test_down_spares_a_node_made_by_hand_where_the_runs_was(cloud, tmp_path, tpuctl_home):
    """Terraform's state still holds the run's TPU, and Terraform finds a TPU by name: the
    hand-made node leaves its state instead of being deleted."""
    config = config_file(tmp_path)
    assert invoke("up", "-c", config).exit_code == 0
    mine = _replace_by_hand(cloud)
    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert node_ids(cloud) == [mine]
    assert "was not made by tpuctl for run tpurun" in down.output
    assert "took TPU tpurun in us-central2-b out of the run's state" in down.output
    assert "nothing of run tpurun is left billing" in down.output
    assert len(cloud.requests("DeleteNode")) == 1  # the one the test made, outside tpuctl


def test_up_and_down_after_a_new_tpu_name_never_delete_a_hand_made_node_of_the_old(
        cloud, tmp_path, tpuctl_home):
    """Issue 32, item 1: the run's TPU was replaced by hand under its name, then the config
    names another TPU. The plan would replace the state's TPU, found by its old name: `up`
    refuses in one line with nothing applied, and `down` takes the hand-made node out of the
    state (Terraform finds the TPU by the name in its state, not the config's)."""
    config = config_file(tmp_path)
    assert invoke("up", "-c", config).exit_code == 0
    mine = _replace_by_hand(cloud)
    config = config_file(tmp_path, tpu_name="tpurun-b")
    state = (tpuctl_home / "infra" / "tpurun" / "terraform.tfstate").read_text()
    assert_user_error(tpuctl("up", "-c", config),  # in this process: Terraform is the twin
                      f"Terraform would replace TPU tpurun in {ZONE} (id {mine})",
                      "nothing was applied", "gcloud compute tpus tpu-vm describe tpurun")
    assert node_ids(cloud) == [mine]
    assert len(cloud.requests("DeleteNode")) == 1  # the one the test made, outside tpuctl
    assert len(cloud.requests("CreateNode")) == 2  # the run's first, the hand-made: no more
    assert (tpuctl_home / "infra" / "tpurun" / "terraform.tfstate").read_text() == state
    down = invoke("down", "-c", config)
    assert down.exit_code == 0, down.output
    assert "took TPU tpurun in us-central2-b out of the run's state" in down.output
    assert node_ids(cloud) == [mine]
    assert len(cloud.requests("DeleteNode")) == 1


def test_train_down_refuses_a_hand_made_node(cloud, tmp_path, tpuctl_home):
    config = config_file(tmp_path)
    assert invoke("up", "-c", config).exit_code == 0
    mine = _replace_by_hand(cloud)
    result = invoke("train", "-c", config, "--down")
    assert result.exit_code != 0
    assert "was not made by tpuctl" in str(result.exception), result.output
    assert node_ids(cloud) == [mine]
    assert len(cloud.requests("DeleteNode")) == 1


def _provider(config: Path):
    from launcher.providers.gcp import GcpProvider
    from payload.config import load_config

    return GcpProvider.from_config(load_config(config), num_workers=None)


def test_recovery_replaces_the_runs_preempted_node(cloud, tmp_path, tpuctl_home):
    config = config_file(tmp_path)
    assert invoke("up", "-c", config).exit_code == 0
    first = cloud.node("tpurun")["id"]
    cloud.preempt("tpurun")
    _provider(config).recover(lambda message: None)
    second = cloud.node("tpurun")["id"]
    assert second != first and cloud.node("tpurun")["state"] == "READY"
    owned = json.loads((tpuctl_home / "gcp/tpurun/owned.json").read_text())
    assert [n["uid"] for n in owned["nodes"]] == [first, second]


def test_recovery_never_deletes_a_hand_made_node(cloud, tmp_path):
    from payload.core.errors import UserError

    config = config_file(tmp_path)
    assert invoke("up", "-c", config).exit_code == 0
    mine = _replace_by_hand(cloud)
    with pytest.raises(UserError, match=r"cannot recover: TPU tpurun .* was not made by tpuctl"):
        _provider(config).recover(lambda message: None)
    assert node_ids(cloud) == [mine]


def queue_by_hand(api: FakeTpuApi) -> None:
    """A queued request named like the run's TPU, made outside tpuctl, still waiting."""
    from google.cloud import tpu_v2

    api.plan_queued_resource("tpurun", wait_polls=None)
    parent = f"projects/{PROJECT}/locations/{ZONE}"
    api.client().create_queued_resource(
        parent=parent, queued_resource_id="tpurun", queued_resource=tpu_v2.QueuedResource(
            tpu=tpu_v2.QueuedResource.Tpu(node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(
                parent=parent, node_id="tpurun", node=tpu_v2.Node(
                    accelerator_type="v4-16", runtime_version="tpu-ubuntu2204-base",
                    labels=COPIED_LABEL))]))).result()


def test_a_queued_request_made_by_hand_is_neither_taken_nor_deleted(cloud, tmp_path):
    from payload.core.errors import UserError

    queue_by_hand(cloud)
    config = config_file(tmp_path, queued=True)
    up = invoke("up", "-c", config)
    assert isinstance(up.exception, UserError), up.output
    assert "queued request tpurun in us-central2-b was not made by tpuctl" in str(up.exception)
    one_error_line(run_cli("down", "-c", config), "never brought up",
                   "gcloud compute tpus queued-resources delete tpurun")
    assert cloud.queued_resource("tpurun")["state"]["state"] == "WAITING_FOR_RESOURCES"
    assert not cloud.requests("DeleteQueuedResource")


# -- 3. down --delete-bucket ---------------------------------------------------------------------


BUCKET = "tpurun-own-bucket"


def _bucket_run(cloud, tmp_path):
    """`up` creates the bucket (Terraform's twin only records it: the test makes it in the
    emulator), then the run stages its corpus and writes its outputs there."""
    from launcher import staging
    from payload.core import storage

    corpus = tmp_path / "books.txt"
    corpus.write_text("a line of the run's own corpus\n")
    config = config_file(tmp_path, bucket=BUCKET)
    assert invoke("up", "-c", config).exit_code == 0
    bucket = storage.client().create_bucket(BUCKET)
    staged = staging.stage_corpus([str(corpus)], bucket=BUCKET, run="tpurun")
    for name in ("tpurun/.tpuctl/owner", "tpurun/model/config.json", "tpurun/metrics.json"):
        bucket.blob(name).upload_from_string(b"{}")
    return config, bucket, staged[0][len(f"gs://{BUCKET}/"):]


def _names(bucket) -> list[str]:
    return sorted(b.name for b in bucket.list_blobs(versions=True))


def test_delete_bucket_deletes_only_the_runs_own_objects(cloud, tmp_path, tpuctl_home):
    config, bucket, staged = _bucket_run(cloud, tmp_path)
    theirs = ["corpus/my-own-upload/books.txt", "team/shared-notes/plan.md",
              "other-run/.tpuctl/owner", "other-run/model/config.json"]
    for name in theirs:
        bucket.blob(name).upload_from_string(b"not tpurun's")
    down = invoke("down", "-c", config, "--delete-bucket")
    assert down.exit_code == 0, down.output
    assert _names(bucket) == sorted([*theirs, "corpus/.tpuctl/staged-by-tpuctl"])
    assert staged not in _names(bucket)
    assert f"kept the bucket gs://{BUCKET}" in down.output
    state = (tpuctl_home / "infra/tpurun/terraform.tfstate").read_text()
    assert '"bucket"' in state  # Terraform still holds the bucket: it was not destroyed


def test_delete_bucket_keeps_corpus_objects_another_run_staged_too(cloud, tmp_path):
    from launcher import staging

    config, bucket, staged = _bucket_run(cloud, tmp_path)
    bucket.blob(staging.staged_record("other-run")).upload_from_string(
        json.dumps({"run": "other-run", "objects": [staged]}).encode())
    down = invoke("down", "-c", config, "--delete-bucket")
    assert down.exit_code == 0, down.output
    assert staged in _names(bucket) and not any(n.startswith("tpurun/") for n in _names(bucket))


def test_delete_bucket_refuses_while_another_runs_lock_is_live(cloud, tmp_path):
    config, bucket, _ = _bucket_run(cloud, tmp_path)
    bucket.blob("other-run/.tpuctl/run.lock").upload_from_string(json.dumps(
        {"job": "other-run-1", "beat": time.time(), "stale_after_s": 600}).encode())
    before = _names(bucket)
    result = invoke("down", "-c", config, "--delete-bucket")
    assert result.exit_code != 0
    assert "other-run/.tpuctl/run.lock is live" in str(result.exception)
    assert _names(bucket) == before
    assert cloud.node("tpurun")["state"] == "READY"  # refused before anything was deleted


def test_delete_bucket_deletes_the_bucket_when_only_the_runs_objects_were_there(
        cloud, tmp_path, tpuctl_home):
    config, bucket, _ = _bucket_run(cloud, tmp_path)
    down = invoke("down", "-c", config, "--delete-bucket")
    assert down.exit_code == 0, down.output
    assert _names(bucket) == []
    assert "kept" not in down.output
    state = json.loads((tpuctl_home / "infra/tpurun/terraform.tfstate").read_text())
    assert state["resources"] == []  # destroyed: the bucket with the rest


