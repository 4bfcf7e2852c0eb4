"""The strategy plan for each kind of cluster (TPU paths by their plan: no TPU here)."""

import pytest

from payload.config import parse_config
from payload.core.errors import UserError
from payload.training import strategy
from payload.training.strategy import (
    CPU,
    TPU_STEPS_PER_EXECUTION,
    ClusterFacts,
    StrategyKind,
    cluster_facts,
    plan_strategy,
    training_workers,
)
from tests.support.strategies import tf_config, tpu


def gcp_config(accelerator: str = "v4-8", **extra):
    return parse_config(
        {
            "name": "pod-run",
            "output_dir": "gs://bucket/run",
            "cluster": {
                "provider": "gcp",
                "project": "my-project",
                "zone": "us-central2-b",
                "accelerator_type": accelerator,
                "runtime_version": "tpu-ubuntu2204-base",
                **extra,
            },
            "data": {"corpus": ["gs://bucket/text.txt"]},
            "model": {"family": "roberta"},
            "train": {"steps": 10, "batch_size": 8, "learning_rate": 1e-3},
        }
    )




def test_single_host_tpu_uses_the_local_tpu():
    plan = plan_strategy(cluster_facts(tpu(), worker_index=0, num_workers=1, environ={}))
    assert plan.kind is StrategyKind.TPU_HOST and plan.tpu == "local"
    assert plan.runs_training and plan.is_chief and plan.env == {}
    assert plan.steps_per_execution == TPU_STEPS_PER_EXECUTION


def test_single_host_tpu_points_tensorflow_at_the_environments_libtpu(tmp_path):
    """As Google's TF release CI sets it for single-host runs (issue 17, defect 4)."""
    library = "/home/u/.tpuctl/env/k/lib/python3.10/site-packages/libtpu/libtpu.so"
    plan = plan_strategy(cluster_facts(tpu(), worker_index=0, num_workers=1, environ={},
                                       libtpu=library))
    assert plan.env == {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
                        "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": library}
    # Found in the Python that runs the stage, without importing it.
    package = tmp_path / "libtpu"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('not to be imported')\n")
    (package / "libtpu.so").write_bytes(b"")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        facts = cluster_facts(tpu(), worker_index=0, num_workers=1, environ={})
    finally:
        sys.path.remove(str(tmp_path))
    assert facts.libtpu == str(package / "libtpu.so")
    # Not with the stand-in TPU API (tests: no TPU, training falls back to the CPU), nor on a
    # pod slice, whose hosts Google's CI runs through the TPU worker servers.
    stand_in = plan_strategy(cluster_facts(tpu(), worker_index=0, num_workers=1, libtpu=library,
                                           environ={"TPUCTL_TPU_API_ENDPOINT": "http://x"}))
    assert stand_in.env == {}
    pod = plan_strategy(cluster_facts(tpu("v4-32"), worker_index=0, num_workers=4, environ={},
                                      libtpu=library))
    assert pod.env == {"TPU_LOAD_LIBRARY": "0"}


def test_pod_slice_is_driven_from_worker_zero_by_the_tpu_name():
    hardware = tpu("v4-32")
    chief = plan_strategy(cluster_facts(hardware, worker_index=0, num_workers=4, environ={}))
    assert chief.kind is StrategyKind.TPU_POD and chief.tpu == "pod-run"
    assert chief.env == {"TPU_LOAD_LIBRARY": "0"} and chief.runs_training
    for index in (1, 2, 3):
        other = plan_strategy(cluster_facts(hardware, worker_index=index, num_workers=4,
                                            environ={}))
        assert not other.runs_training and other.env == {} and not other.is_chief
    assert training_workers(hardware, 4) == [0]


def test_pod_slice_uses_an_explicit_tpu_name():
    hardware = tpu("v4-32", "my-tpu")
    assert (
        plan_strategy(cluster_facts(hardware, worker_index=0, num_workers=4, environ={})).tpu
        == "my-tpu"
    )


def test_cpu_single_process_uses_the_default_strategy():
    plan = plan_strategy(ClusterFacts(hardware=CPU, num_workers=1))
    assert plan.kind is StrategyKind.CPU and plan.steps_per_execution == 1 and plan.is_chief


def test_cpu_workers_use_multi_worker_mirrored_from_tf_config():
    for index in (0, 1):
        plan = plan_strategy(
            ClusterFacts(
                hardware=CPU, num_workers=2, worker_index=index, tf_config=tf_config(index)
            )
        )
        assert plan.kind is StrategyKind.CPU_MULTI_WORKER and plan.runs_training
        assert plan.is_chief == (index == 0)
    assert training_workers(CPU, 3) == [0, 1, 2]


@pytest.mark.parametrize(
    ("tf_conf", "message"),
    [
        (None, "need TF_CONFIG"),
        ("{not json", "not valid JSON"),
        (tf_config(0, workers=3), "lists 3 workers"),
    ],
)
def test_cpu_workers_without_a_usable_tf_config_are_refused(tf_conf, message):
    with pytest.raises(UserError, match=message):
        plan_strategy(ClusterFacts(hardware=CPU, num_workers=2, tf_config=tf_conf))


def test_worker_index_out_of_range_is_refused():
    with pytest.raises(UserError, match="--worker-index 2"):
        plan_strategy(ClusterFacts(hardware=CPU, num_workers=2, worker_index=2))


def test_pod_hosts_other_than_worker_zero_do_not_train(caplog):
    import logging

    from payload.stages.train import run_train

    caplog.set_level(logging.INFO)
    run_train(gcp_config("v4-32"), worker_index=2, num_workers=4,
              hardware=tpu("v4-32"))  # no data, no TPU: returns
    assert "worker 0 drives training" in caplog.text


def test_pod_driver_reaches_the_hosts_servers_listed_by_the_launcher():
    hardware = tpu("v4-32")
    servers = strategy.tpu_workers(["10.0.0.2:8470", "10.0.0.3:8470"])
    assert servers == "grpc://10.0.0.2:8470,grpc://10.0.0.3:8470"
    chief = plan_strategy(cluster_facts(hardware, worker_index=0, num_workers=2,
                                        environ={strategy.TPU_WORKERS_ENV: servers}))
    assert chief.tpu == servers and chief.env == {"TPU_LOAD_LIBRARY": "0"}


def test_a_pod_driver_waits_for_its_servers_then_says_which_one_is_missing(monkeypatch):
    import socket

    from payload.engines.tensorflow import distribute

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    alive = f"127.0.0.1:{listening.getsockname()[1]}"
    distribute.wait_for_servers(f"grpc://{alive}", timeout_s=5)
    with pytest.raises(UserError, match=f"127.0.0.1:{dead_port} did not start"):
        distribute.wait_for_servers(f"grpc://{alive},grpc://127.0.0.1:{dead_port}", timeout_s=1)
    listening.close()


def jax_facts(hardware=CPU, *, index: int = 0, workers: int = 2, **environ) -> ClusterFacts:
    return cluster_facts(hardware, worker_index=index, num_workers=workers, engine="jax",
                         environ=environ)


def test_every_jax_host_trains_and_process_zero_is_the_chief():
    coordinator = {strategy.JAX_COORDINATOR_ENV: "10.0.0.2:8476"}
    for hardware in (CPU, tpu("v4-32")):
        plans = [plan_strategy(jax_facts(hardware, index=i, workers=4, **coordinator))
                 for i in range(4)]
        assert all(p.runs_training and p.coordinator == "10.0.0.2:8476" for p in plans)
        assert [p.is_chief for p in plans] == [True, False, False, False]
        assert [p.process_id for p in plans] == [0, 1, 2, 3] and plans[0].num_processes == 4
        assert training_workers(hardware, 4, "jax") == [0, 1, 2, 3]
        assert not strategy.serves_tpu_runtime(hardware, 4, "jax")
    assert strategy.serves_tpu_runtime(tpu("v4-32"), 4, "tensorflow")
    alone = plan_strategy(jax_facts(workers=1))
    assert alone.kind is StrategyKind.CPU and alone.coordinator is None and alone.env == {}


def test_jax_workers_without_their_coordinator_are_refused():
    with pytest.raises(UserError, match="TPUCTL_JAX_COORDINATOR"):
        plan_strategy(jax_facts(workers=2))


def test_jax_keeps_tensorflow_off_the_tpu_and_runs_on_the_cpu_with_the_stand_in():
    real = plan_strategy(jax_facts(tpu(), workers=1))
    # No pluggable-device library for TensorFlow either (payload.core.engines: tensorflow_env_on_tpu).
    no_plugin = {"NEXT_PLUGGABLE_DEVICE_USE_C_API": "", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": ""}
    assert real.env == {"TPU_LOAD_LIBRARY": "0", **no_plugin}
    assert real.steps_per_execution == TPU_STEPS_PER_EXECUTION
    stand_in = plan_strategy(jax_facts(tpu(), workers=1,
                                       TPUCTL_TPU_API_ENDPOINT="http://127.0.0.1:1"))
    assert stand_in.env == {"TPU_LOAD_LIBRARY": "0", **no_plugin, "JAX_PLATFORMS": "cpu"}
