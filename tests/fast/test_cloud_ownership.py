"""tpuctl deletes or claims in the cloud only what it can show it made (issue 16, points 1-3):
a TPU of the run's name made by hand survives a failed `up`, `down`, `status`, a recovery and
`train --down`; objects in the bucket that are not the run's survive `down --delete-bucket`.

The TPU API is testbed/fakes/tpu_api.py, driven by the real google-cloud-tpu client; `up` and
`down` run real terraform on the twin module (its TPU is created and deleted by name through
that API, as google_tpu_v2_vm does); Cloud Storage is the in-memory emulator. No worker is
reached over SSH here: a node's workers are addresses with published host keys.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from launcher.cli import app
from testbed.fakes.tpu_api import FakeTpuApi, Worker
from tests.support.cloud import storage_server, use_cloud_stand_ins

runner = CliRunner()
PROJECT, ZONE, FALLBACK = "test-project", "us-central2-b", "us-central2-a"


def _host_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return public.decode().split()[1]


HOST_KEY = _host_key()


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


def config_file(folder: Path, **cluster) -> Path:
    raw = {
        "name": "tpurun",
        "cluster": {"provider": "gcp", "project": PROJECT, "zone": ZONE,
                    "accelerator_type": "v4-16", "ssh_source_ranges": ["10.0.0.0/8"],
                    "user": "root", **cluster},
        "data": {"corpus": "gs://some-corpus/texts.txt", "seq_len": 32},
        "tokenizer": {"kind": "bpe", "vocab_size": 300},
        "model": {"family": "gpt2", "hidden_size": 32, "num_layers": 1, "num_heads": 2,
                  "intermediate_size": 64},
        "train": {"steps": 4, "batch_size": 8, "learning_rate": 1e-3},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tpuctl.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def make_by_hand(api: FakeTpuApi, zone: str = ZONE, labels: dict | None = None) -> str:
    """A node named like the run, made outside tpuctl (the console, gcloud): its unique id."""
    node = api.client().create_node(
        parent=f"projects/{PROJECT}/locations/{zone}", node_id="tpurun",
        node={"accelerator_type": "v4-16", "runtime_version": "tpu-ubuntu2204-base",
              "labels": labels or {}}).result()
    return str(node.id)


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


COPIED_LABEL = {"tpuctl-run": "tpurun"}


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
