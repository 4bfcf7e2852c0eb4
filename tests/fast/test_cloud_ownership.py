"""tpuctl deletes or claims in the cloud only what it can show it made (issue 16, points 1-3):
a TPU of the run's name made by hand survives a failed `up`, `down`, `status`, a recovery and
`train --down`; objects in the bucket that are not the run's survive `down --delete-bucket`.

The TPU API is testbed/fakes/tpu_api.py, driven by the real google-cloud-tpu client; `up` and
`down` run real terraform on the twin module (its TPU is created and deleted by name through
that API, as google_tpu_v2_vm does); Cloud Storage is the in-memory emulator. No worker is
reached over SSH here: a node's workers are addresses with published host keys.
"""

from __future__ import annotations

import pytest

from testbed.fakes.tpu_api import FakeTpuApi, Worker
from tests.support.cloud import storage_server, use_cloud_stand_ins
from tests.support.cloud_owned import (
    COPIED_LABEL,
    HOST_KEY,
    config_file,
    invoke,
    make_by_hand,
)


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










# -- 1. a failed `up` ---------------------------------------------------------------------------


# -- 2. down, status, recovery, train --down ----------------------------------------------------


def test_status_does_not_take_a_hand_made_node_for_the_runs(cloud, tmp_path):
    make_by_hand(cloud, labels=COPIED_LABEL)
    status = invoke("status", "-c", config_file(tmp_path))
    assert status.exit_code == 0, status.output
    assert "none of this run's in us-central2-b" in status.output
    assert "was not made by tpuctl" in status.output
    assert "/h" not in status.output  # no price: it is not the run's to bill


# -- 3. down --delete-bucket ---------------------------------------------------------------------


def test_bucket_plan_takes_only_the_runs_own_objects():
    from launcher.providers.gcp_owned import bucket_plan

    names = ["tpurun/.tpuctl/owner", "tpurun/model/config.json", "tpurun2/.tpuctl/owner",
             "corpus/aa/a.txt", "corpus/bb/b.txt", "corpus/cc/mine-too.txt",
             "corpus/my-own-upload/books.txt", "corpus/.tpuctl/staged/tpurun.json",
             "corpus/.tpuctl/staged-by-tpuctl", "tpurun.txt"]
    plan = bucket_plan(names, {}, run="tpurun", output_prefix="tpurun",
                       staged=["corpus/aa/a.txt", "corpus/cc/mine-too.txt", "tpurun.txt"],
                       staged_by_others=["corpus/cc/mine-too.txt"])
    assert plan.refusal is None
    assert plan.delete == ("corpus/.tpuctl/staged/tpurun.json", "corpus/aa/a.txt",
                           "tpurun/.tpuctl/owner", "tpurun/model/config.json")
    # Without its owner marker the prefix is not shown to be the run's: kept.
    unmarked = bucket_plan(["tpurun/model/config.json"], {}, run="tpurun",
                           output_prefix="tpurun", staged=[], staged_by_others=[])
    assert unmarked.delete == () and unmarked.kept == ("tpurun/model/config.json",)


@pytest.mark.parametrize(("lock", "refused"), [
    ({"job": "x", "beat": 1000.0, "stale_after_s": 120}, True),
    ({"job": "x", "beat": 800.0, "stale_after_s": 120}, False),  # no heartbeat for 200 s
    ({"unreadable": True}, True),
])
def test_bucket_plan_refuses_while_a_lock_is_live(lock, refused):
    from launcher.providers.gcp_owned import bucket_plan

    plan = bucket_plan(["other/.tpuctl/run.lock", "tpurun/.tpuctl/owner"],
                       {"other/.tpuctl/run.lock": lock}, run="tpurun", output_prefix="tpurun",
                       staged=[], staged_by_others=[], now=1000.0)
    assert (plan.refusal is not None) == refused
    assert plan.delete == (() if refused else ("tpurun/.tpuctl/owner",))


def test_the_tpu_is_found_in_the_state_of_infra_and_of_the_twin():
    from launcher.terraform import is_tpu_address

    assert is_tpu_address("module.tpu_vm[0].google_tpu_v2_vm.main")  # infra/
    assert is_tpu_address("terraform_data.tpu_vm[0]")  # tests/terraform_twin/
    assert not is_tpu_address("module.bucket[0].google_storage_bucket.main")
    assert not is_tpu_address("terraform_data.ssh_firewall")
