"""The gce run config the gce tests share (tests/fast and tests/integration)."""

from __future__ import annotations


def gce_raw(name: str = "iron", *, train: dict | None = None, **cluster) -> dict:
    return {
        "name": name,
        "cluster": {"provider": "gce", "project": "my-project", "zone": "us-central1-c",
                    "machine_type": "tpu7x-standard-4t", "topology": "2x2x1", **cluster},
        "data": {"corpus": "gs://b/c.txt"}, "model": {"family": "gpt2"},
        "train": {"steps": 10, "batch_size": 16, "learning_rate": 1e-3, "engine": "jax",
                  **(train or {})},
    }
