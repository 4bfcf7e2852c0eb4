"""How the processes of a multi-process training run end: together, once, for every engine.

    leave_together(trainer.leave_barrier(), is_chief=plan.is_chief)   # returns when alone

Left to itself, a process's framework teardown talks to the chief's coordination service
(heartbeats, a shutdown call): a worker still tearing down after the chief left retries it for
minutes, idle (TensorFlow logs `StartAbort UNAVAILABLE`); a chief still there after a worker left
logs "The tasks have crashed"; JAX's distributed runtime waits on peers that may be gone. So:
a barrier through that service (every checkpoint, metric and log line is written by then;
nothing of the run is owed to anyone after it), then every process leaves at once without the
teardown, the chief a moment after the others.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

# The chief hosts the coordination service: it stays this long after the last barrier so the
# others hear that the barrier passed before it goes (1 s was too little on a busy host: a
# worker returned from the barrier 2.9 s after the chief had left).
CHIEF_LINGER_S = 3.0


def leave_together(barrier: Callable[[], None] | None, *, is_chief: bool) -> None:
    """Meet the others at `barrier` (the engine's: its trainer's leave_barrier()), then end this
    process at once; with no barrier (one training process), return."""
    if barrier is None:
        return
    barrier()
    if is_chief:
        time.sleep(CHIEF_LINGER_S)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
