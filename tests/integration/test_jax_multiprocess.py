"""The JAX engine's multi-host path, for real: two worker processes (one CPU device each, gloo
collectives, a coordinator on a local port) compute the same 20 steps as one process over two
CPU devices, fed the same global batches."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("optax")

from tests.support.jax import JAX_WORKER, worker_env
from tests.support.runners import free_ports

STEPS = 20


def start_workers(out: Path, *, num_processes: int, devices_each: int, extra=()) -> list:
    port = free_ports(1)[0]
    return [subprocess.Popen(
        [sys.executable, str(JAX_WORKER), "--out", str(out), "--steps", str(STEPS),
         "--process-id", str(i), "--num-processes", str(num_processes), "--port", str(port),
         *extra],
        env=worker_env(devices_each), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(num_processes)]


def results(*runs: tuple[Path, list]) -> list[dict]:
    """Wait for runs started together (the layouts run side by side: most of a worker's time
    is starting up), then each run's result."""
    procs = [p for _, group in runs for p in group]
    try:
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, output in zip(procs, outputs, strict=True):
        assert p.returncode == 0, output[-3000:]
    found = []
    for out, _ in runs:
        with np.load(out / "result.npz") as result:
            found.append(dict(result))
    return found


def assert_same_run(multi: dict, single: dict) -> None:
    assert int(single["step"]) == int(multi["step"]) == STEPS
    assert single["losses"].shape == (STEPS,)
    assert single["losses"][-1] < single["losses"][0]  # it trained, with dropout on
    np.testing.assert_allclose(multi["losses"], single["losses"], rtol=0, atol=1e-5)
    weights = [k for k in single if k.startswith("w:")]
    assert weights and set(weights) == {k for k in multi if k.startswith("w:")}
    for name in weights:
        np.testing.assert_allclose(multi[name], single[name], rtol=0, atol=1e-5, err_msg=name)


def test_two_processes_compute_what_one_process_over_two_devices_computes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    single, multi = results(
        (one, start_workers(one, num_processes=1, devices_each=2)),
        (two, start_workers(two, num_processes=2, devices_each=1)))
    assert int(single["sharded"]) == int(multi["sharded"]) == 0  # data parallel: replicated
    assert_same_run(multi, single)


# Two more runs of several processes: past the default suite's budget on a shared machine.
@pytest.mark.slow
def test_fsdp_across_two_processes_computes_what_data_parallel_computes(tmp_path):
    one, fsdp = tmp_path / "one", tmp_path / "fsdp"
    replicated, sharded = results(
        (one, start_workers(one, num_processes=1, devices_each=2)),
        (fsdp, start_workers(fsdp, num_processes=2, devices_each=1, extra=("--fsdp", "2"))))
    assert int(sharded["sharded"]) > 0  # the weights really were split between the processes
    assert_same_run(sharded, replicated)


@pytest.mark.slow  # waits out gloo's 30 s
def test_a_process_that_reaches_the_first_step_late_is_waited_for(tmp_path):
    """On CPU the first collective sets up gloo's context, which gives up after 30 s without
    the other process (a slower compile on a busy machine): the processes meet first
    (payload.engines.jax.distributed.meet)."""
    late = tmp_path / "late"
    (result,) = results((late, start_workers(late, num_processes=2, devices_each=1,
                                             extra=("--late", "40"))))
    assert int(result["step"]) == STEPS and result["losses"][-1] < result["losses"][0]
