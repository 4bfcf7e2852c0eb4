"""No worker idles after training: every worker's train process ends within seconds of the last
step, the chief last, in a fresh run and in a resumed one (real processes,
MultiWorkerMirroredStrategy)."""

import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

pytest.importorskip("tensorflow")

from payload.training import strategy
from tests.support.configs import write_training_config
from tests.support.runners import free_ports, payload_env
from tests.support.runs import prepared_run, stage_command

# A behaviour bound, not a benchmark: before the train stage ended its workers together, one
# waited 20 s to 2 minutes here (its input iterator torn down, gRPC retrying a departed chief).
EXIT_WITHIN_S = 15.0
# Worker 1 is held this long right after its last step, as a busy host or a slow teardown
# would hold it: the chief must not leave it behind talking to nobody.
HELD_S = 4.0
FINISHED = re.compile(r"finished at step (\d+); weights sha256 (\w+)")


def _train_two_workers(config, *args: str) -> list[dict]:
    """Both workers' train stages, worker 1 held for HELD_S after its last step; per worker:
    its lines with when they came, when it ended."""
    hosts = [f"localhost:{port}" for port in free_ports(2)]
    seen = [{"lines": [], "ended": None, "rc": None} for _ in range(2)]
    procs = [subprocess.Popen(
        stage_command("train", config, "--worker-index", str(i), "--num-workers", "2", *args),
        env=payload_env(TF_CONFIG=strategy.tf_config(hosts, i)), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for i in range(2)]

    def read(proc, into, hold):
        for line in proc.stdout:
            into["lines"].append((time.monotonic(), line.rstrip("\n")))
            if hold and FINISHED.search(line):
                os.kill(proc.pid, signal.SIGSTOP)
                time.sleep(HELD_S)
                os.kill(proc.pid, signal.SIGCONT)
        into["rc"] = proc.wait()
        into["ended"] = time.monotonic()

    readers = [threading.Thread(target=read, args=(p, s, i == 1))
               for i, (p, s) in enumerate(zip(procs, seen, strict=True))]
    for reader in readers:
        reader.start()
    try:
        for reader in readers:
            reader.join(timeout=400)
    finally:
        for proc in procs:
            proc.kill()
    return seen


def _check_ended_together(seen: list[dict], steps: int) -> None:
    log = "\n".join(line for s in seen for _, line in s["lines"])
    assert [s["rc"] for s in seen] == [0, 0], log[-4000:]
    finished = [next((t, m) for t, line in s["lines"] if (m := FINISHED.search(line)))
                for s in seen]
    assert {m.group(1) for _, m in finished} == {str(steps)}
    assert finished[0][1].group(2) == finished[1][1].group(2)  # replicas in sync
    last_step = max(t for t, _ in finished)
    for index, s in enumerate(seen):
        lingered = s["ended"] - last_step
        assert lingered < EXIT_WITHIN_S, f"worker {index} ended {lingered:.1f}s after training"
    # The chief hosts the coordination service the others talk to as they leave: it goes last,
    # even though worker 1 was held up.
    assert seen[0]["ended"] >= seen[1]["ended"], "the chief left before worker 1"


def test_every_worker_ends_within_seconds_of_the_last_step(tmp_path):
    out = prepared_run(tmp_path, "roberta")
    config = write_training_config(out, "roberta", steps=20, checkpoint_every=10, eval_every=10)
    _check_ended_together(_train_two_workers(config), 20)  # the same weights on both, too
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["strategy"] == "cpu-multi-worker"
    assert (out / "checkpoints" / "ckpt-20.index").exists()
    # A resumed run (it left worker 0 waiting a minute) and a longer schedule.
    longer = write_training_config(out, "roberta", steps=40, checkpoint_every=10, eval_every=10)
    _check_ended_together(_train_two_workers(longer, "--resume"), 40)
