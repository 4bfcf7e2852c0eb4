"""The job on one worker: run this worker's part of every step, meeting the others in between.

    python -m launcher.agent .tpuctl/jobs/demo-20261121-010203/agent.json

The launcher starts this detached (launcher.jobs) and only watches; the steps advance here, so
a job keeps going when the launcher's connection drops. Between steps every worker writes its
exit code under the plan's barrier folder (in output_dir, which all workers see) and waits for
the others; a failed peer ends the wait with an error. Standard library only (plus
payload.storage for gs://), since it runs with whatever Python the worker has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.2
# The stage a worker reports when it stopped because another worker failed.
ABORTED = "aborted"


def _storage():
    from payload import storage

    return storage


def _mark(barrier_dir: str, step: str, worker: int, rc: int) -> None:
    storage = _storage()
    storage.write_text(storage.join(barrier_dir, step, f"worker-{worker}"), str(rc))


def _wait_for(barrier_dir: str, step: str, workers: list[int]) -> int | None:
    """Block until every worker of the step reported; the first failing one, or None."""
    storage = _storage()
    poll_s = 1.0 if storage.is_gcs(barrier_dir) else POLL_S
    pending = set(workers)
    while True:
        for worker in sorted(pending):
            path = storage.join(barrier_dir, step, f"worker-{worker}")
            if storage.exists(path):
                if storage.read_text(path).strip() != "0":
                    return worker
                pending.discard(worker)
        if not pending:
            return None
        time.sleep(poll_s)


def _copy_log(log: str, log_copy: str) -> None:
    """Keep output_dir/logs/worker-N.log up to date with this worker's log."""
    try:
        storage = _storage()
        storage.write_bytes(log_copy, Path(log).read_bytes())
    except Exception as exc:  # the run matters more than its log copy
        print(f"tpuctl: could not copy the log to {log_copy}: {exc}", flush=True)


def run(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    job_dir = Path(plan_path).parent
    me = plan["worker"]
    for step in plan["steps"]:
        (job_dir / "stage").write_text(step["name"])
        command = step["command"]
        if command is not None:
            print(f"== tpuctl: {step['name']} on worker-{me} ==", flush=True)
            env = {**os.environ, **command["env"]}
            started = time.monotonic()
            rc = subprocess.call(command["argv"], env=env, stdin=subprocess.DEVNULL)
            took = time.monotonic() - started
            _mark(plan["barrier_dir"], step["name"], me, rc)
            if rc != 0:
                print(f"== tpuctl: {step['name']} failed on worker-{me} (exit {rc}) ==",
                      flush=True)
                _copy_log(plan["log"], plan["log_copy"])
                return rc if rc > 0 else 128 - rc
            print(f"== tpuctl: {step['name']} done on worker-{me} in {took:.1f}s ==", flush=True)
        failed = _wait_for(plan["barrier_dir"], step["name"], step["workers"])
        _copy_log(plan["log"], plan["log_copy"])
        if failed is not None:
            (job_dir / "stage").write_text(ABORTED)
            print(f"== tpuctl: stopping, {step['name']} failed on worker-{failed} ==", flush=True)
            return 3
    (job_dir / "stage").write_text("done")
    print(f"== tpuctl: worker-{me} finished ==", flush=True)
    _copy_log(plan["log"], plan["log_copy"])
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
