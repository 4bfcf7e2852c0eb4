"""Training's one voice: the chief speaks for training, every worker only for itself.

    speak_for_training(is_chief=plan.is_chief)    # once per run, before the first line
    log("model FLOPs per step 1.2e+12")           # the chief's line
    log("worker 1: this host serves the TPU runtime", own=True)   # every worker's own

The loop, the stage and the engines' trainers say their lines through `log`, so a multi-worker
run's log reads as one run, not N copies of it.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("payload.training")


def log(message: str, *, own: bool = False) -> None:
    """A line of training's one voice, the chief's; `own=True`: one every worker says itself."""
    logger.info(message, extra={"own": own})


def _own_lines_only(record: logging.LogRecord) -> bool:
    return getattr(record, "own", True)


def speak_for_training(*, is_chief: bool) -> None:
    """The chief says every line; the others only their own. (Set for every run: the logger
    outlives it, and this process may have been another worker before.)"""
    if is_chief:
        logger.removeFilter(_own_lines_only)
    elif _own_lines_only not in logger.filters:
        logger.addFilter(_own_lines_only)
