"""The TensorFlow engine's distribution: the tf.distribute strategy a StrategyPlan describes.

    strategy = build_strategy(plan)     # payload.training.strategy.plan_strategy's plan

The plan (who trains, with which environment) is payload.training.strategy's, free of any
framework; this module is where TensorFlow makes it real.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from payload.core.errors import UserError
from payload.training.strategy import StrategyKind, StrategyPlan, tpu_devices_present

SERVER_WAIT_S = 300.0


def wait_for_servers(tpu: str, timeout_s: float = SERVER_WAIT_S) -> None:
    """A pod slice's driver starts with its hosts' TPU servers: wait until each one listens."""
    import socket
    import time

    endpoints = [e.removeprefix("grpc://") for e in tpu.split(",")]
    deadline = time.monotonic() + timeout_s
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=2):
                    break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise UserError(f"the TPU server at {endpoint} did not start within "
                                    f"{timeout_s:.0f}s ({exc})",
                                    hint="see that worker's log in output_dir/logs") from None
                time.sleep(1.0)


def build_strategy(plan: StrategyPlan):
    """Make the tf.distribute strategy the plan describes (TensorFlow is imported here)."""
    for key, value in plan.env.items():
        os.environ[key] = value
    import tensorflow as tf

    if plan.kind in (StrategyKind.TPU_HOST, StrategyKind.TPU_POD):
        if plan.stand_in and not tpu_devices_present():
            # The TPU API is a stand-in (tests): these workers have no TPU by design, and
            # reaching for the slice's servers would only wait for them.
            print("tpuctl: no TPU here and the TPU API is a stand-in: training on the CPU",
                  flush=True)
            return tf.distribute.get_strategy()
        if plan.tpu and plan.tpu.startswith("grpc://"):
            wait_for_servers(plan.tpu)
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=plan.tpu)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except Exception as exc:  # TensorFlow raises several kinds here
            if plan.stand_in:
                # The TPU API is a stand-in (tests): these workers have no TPU by design.
                print("tpuctl: no TPU here and the TPU API is a stand-in: training on the CPU",
                      flush=True)
                return tf.distribute.get_strategy()
            raise UserError(f"no TPU found on this worker ({type(exc).__name__}: "
                            f"{' '.join(str(exc).split())[:200]})",
                            hint="check the TPU with `tpuctl status`; tpuctl never falls back "
                            "to the CPU on a TPU VM") from None
        return tf.distribute.TPUStrategy(resolver)
    if plan.kind is StrategyKind.CPU_MULTI_WORKER:
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


# How long a worker done with training waits for the others to be done too
# (payload.training.leaving, through WorkerCoordination).
END_BARRIER_S = 300.0


@dataclass(frozen=True)
class WorkerCoordination:
    """The coordination service of MultiWorkerMirroredStrategy's workers, hosted by the chief
    (payload.training.leaving.Coordination)."""

    index: int
    count: int

    def meet(self, name: str) -> None:
        from tensorflow.python.eager import context

        context.context().wait_at_barrier(name, int(END_BARRIER_S * 1000))

    def post(self, key: str) -> None:
        from tensorflow.python.eager import context

        context.context().set_config_key_value(key, "1")

    def wait_for(self, key: str, timeout_s: float) -> bool:
        import tensorflow as tf
        from tensorflow.python.eager import context

        try:
            context.context().get_config_key_value(key, max(1, int(timeout_s * 1000)))
        except tf.errors.OpError:  # its time passed, or the service lost that worker
            return False
        return True
