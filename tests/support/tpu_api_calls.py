"""Calls to the fake TPU API the stand-in's tests share (tests/fast and tests/integration)."""

from __future__ import annotations

ZONE = "us-central2-b"


PARENT = f"projects/demo/locations/{ZONE}"


BASE = "tpu-ubuntu2204-base"


def create(client, node_id: str, accelerator: str = "v4-8", **node):
    node = {"accelerator_type": accelerator, "runtime_version": BASE, **node}
    return client.create_node(parent=PARENT, node_id=node_id, node=node)


def name(node_id: str) -> str:
    return f"{PARENT}/nodes/{node_id}"
