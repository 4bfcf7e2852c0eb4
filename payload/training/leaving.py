"""How the processes of a multi-process training run end: together, once, for every engine.

    leave_together(trainer.coordination(), is_chief=plan.is_chief)   # returns when alone

Left to itself, a process's framework teardown talks to the chief's coordination service
(heartbeats, a shutdown call): a worker still tearing down after the chief left retries it for
minutes, idle (TensorFlow logs `StartAbort UNAVAILABLE`); a chief still there after a worker left
logs "The tasks have crashed"; JAX's distributed runtime waits on peers that may be gone. So:
a barrier through that service (every checkpoint, metric and log line is written by then;
nothing of the run is owed to anyone after it), then every process leaves at once without the
teardown. The chief hosts the service, so it goes last: each other process, back from the
barrier, posts a key there and leaves; the chief leaves once every key is in (a moment later,
for the service's last replies to reach them). A time alone (the chief sleeping a second or
three) was not enough on a busy host: a worker came back from the barrier after the chief had
gone.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Protocol

END_MEETING = "tpuctl-train-end"
# The chief waits this long at most for the other processes' keys: one that died after the
# barrier (nothing of the run is owed by then) does not keep it.
LEFT_WAIT_S = 60.0
# After the last key: the service's reply to that process's post is on its way.
CHIEF_LINGER_S = 1.0


class Coordination(Protocol):
    """What a run's coordination service gives its processes (each engine's own: the trainer's
    coordination())."""

    index: int  # this process, 0 the chief
    count: int  # the run's processes

    def meet(self, name: str) -> None:
        """Return when every process reached `name`."""

    def post(self, key: str) -> None:
        """Set `key` in the service."""

    def wait_for(self, key: str, timeout_s: float) -> bool:
        """Whether `key` was set within `timeout_s`."""


def left_key(index: int) -> str:
    return f"tpuctl-left/{index}"


def leave_together(coordination: Coordination | None, *, is_chief: bool) -> None:
    """Meet the others at the end, then end this process at once, the chief last; with no
    coordination (one training process), return."""
    if coordination is None:
        return
    coordination.meet(END_MEETING)
    if is_chief:
        deadline = time.monotonic() + LEFT_WAIT_S
        late = [index for index in range(coordination.count) if index != coordination.index
                and not coordination.wait_for(left_key(index),
                                              max(0.0, deadline - time.monotonic()))]
        if late:
            logging.warning("process(es) %s did not say they left within %g s: leaving "
                            "without them", ", ".join(map(str, late)), LEFT_WAIT_S)
        time.sleep(CHIEF_LINGER_S)
    else:
        try:
            coordination.post(left_key(coordination.index))
        except Exception as exc:  # the run is whole: the chief stops waiting for it
            logging.warning("could not tell the chief this process leaves (%s)", exc)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
