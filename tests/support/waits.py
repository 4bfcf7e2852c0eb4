"""Waiting for something with a deadline.

    wait_for(lambda: path.exists(), timeout_s=30)
    when_worker0_logs(tpuctl_home, "run", "step 2/", preempt)   # act from a thread
"""

from __future__ import annotations

import threading
import time


def wait_for(predicate, timeout_s: float = 30.0, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {predicate}")


def when_worker0_logs(tpuctl_home, run: str, text: str, action) -> threading.Thread:
    """Call `action` (a preemption, say) once worker 0's log of the run's job has `text`, from a
    thread of its own, started here: the test's command runs meanwhile."""

    def wait_then_act():
        wait_for(lambda: text in "".join(
            p.read_text() for p in tpuctl_home.glob(f"jobs/{run}/*/logs/worker-0.log")),
            timeout_s=90, interval_s=0.05)
        action()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread
