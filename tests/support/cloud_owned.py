"""The made-by-hand resources and configs the cloud ownership tests share (tests/fast and
tests/e2e).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from launcher.cli import app
from testbed.fakes.tpu_api import FakeTpuApi

runner = CliRunner()

PROJECT, ZONE, FALLBACK = "test-project", "us-central2-b", "us-central2-a"


def host_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    public = Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return public.decode().split()[1]


HOST_KEY = host_key()


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
