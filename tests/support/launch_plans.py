"""Configs and plans the launcher's plan tests share (tests/fast and tests/integration)."""

from __future__ import annotations

from launcher.plan import (
    Worker,
    build_plan,
)
from launcher.worker_python import plan_environment
from payload.config import parse_config
from payload.training.strategy import CPU

RAW = {
    "name": "unit",
    "output_dir": "/shared/out",
    "data": {"corpus": "/shared/c.txt"},
    "tokenizer": {"kind": "bpe", "vocab_size": 300},
    "model": {"family": "gpt2"},
    "train": {"steps": 4, "batch_size": 4, "learning_rate": 1e-3},
}


def config(**over):
    return parse_config({**RAW, **over})


def workers(n):
    return tuple(Worker(index=i, host=f"10.0.0.{i + 2}", address=f"10.0.0.{i + 2}",
                        coordination_port=29477) for i in range(n))


ENV = plan_environment(python="/opt/py/bin/python", wheelhouse_digest=None,
                       requirements=("tensorflow==2.20.0", "tf-keras==2.20.1"), tpu=False)


GCP = {"provider": "gcp", "project": "my-project", "zone": "us-central2-b", "accelerator_type": "v4-32",
       "runtime_version": "tpu-ubuntu2204-base"}


def plan(n=2, hardware=CPU, cfg=None, **kw):
    if cfg is None:
        cfg = config(cluster=GCP) if hardware is not CPU else config()
    return build_plan(cfg, workers(n), job_id="unit-1", payload_digest="abc",
                      environment=ENV, hardware=hardware, **kw)
