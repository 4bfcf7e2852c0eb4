"""Preemptions a run survived, as output_dir/recoveries.json: when, why, which step was lost.

    entry = record(output_dir, reason="TPU demo is PREEMPTED", old_job="demo-1",
                   new_job="demo-2", lost_at_step=1234)
    entry["summary"]          # "lost at step 1234, resuming from the checkpoint of step 1200"
    history(output_dir)       # every recovery so far

Written by the launcher (`train --auto-resume`), which sees output_dir as the workers do
(gs://, or a shared folder).
"""

from __future__ import annotations

import json
import time

from payload.core import layout, storage

FILE = layout.RECOVERIES


def _path(output_dir: str) -> str:
    return storage.join(output_dir, FILE)


def history(output_dir: str) -> list[dict]:
    path = _path(output_dir)
    return json.loads(storage.read_text(path)) if storage.exists(path) else []


def newest_checkpoint_step(output_dir: str) -> int | None:
    """The step of the newest checkpoint, whichever engine wrote it, or None."""
    from payload.training.checkpoints import newest_step

    return newest_step(output_dir)


def has_checkpoint(output_dir: str) -> bool:
    return newest_checkpoint_step(output_dir) is not None


def record(output_dir: str, *, reason: str, old_job: str, new_job: str,
           lost_at_step: int | None) -> dict:
    resumed_from = newest_checkpoint_step(output_dir)
    if lost_at_step is not None and resumed_from is not None:
        # The step comes from the launcher's copy of the chief's log, which can trail the
        # worker by a record when the machines go: the checkpoint proves the run got that far.
        lost_at_step = max(lost_at_step, resumed_from)
    if resumed_from is None:
        summary = "no checkpoint yet: training starts again from step 0"
    else:
        lost = f"lost at step {lost_at_step}, " if lost_at_step is not None else ""
        summary = f"{lost}resuming from the checkpoint of step {resumed_from}"
    entry = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reason": reason,
             "old_job": old_job, "new_job": new_job, "lost_at_step": lost_at_step,
             "resumed_from_step": resumed_from, "summary": summary}
    storage.write_text(_path(output_dir), json.dumps([*history(output_dir), entry], indent=1))
    return entry
