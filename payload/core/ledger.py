"""The run's event ledger: what happened when, from the request for a slice to its teardown.

    writer = Writer(out, source="chief", job="demo-20261201-101010-ab12")
    writer.note("checkpoint_save_start", step=50)
    writer.note("checkpoint_save_end", step=50)
    events = read(out)         # every event every writer left, oldest first; bad lines skipped

Three kinds of writer append to output_dir/.tpuctl/ledger/: the launcher (`launcher`: the
request, queueing, capacity, VMs up, environment set-up, job start and end, preemption,
recreation, teardown), worker 0's job agent (`agent`: each stage's start and end, the job's
end, a self-delete) and the training chief (`chief`: the trainer built, checkpoint restore and
save, compiling, evaluations, the first and every logged step, the end of training). Each event
is one flat JSON object: `t` (epoch seconds by the writer's clock), `event`, `source`, `job`,
`step`, `slice`, `host`, and its own fields. payload.cloud.goodput turns them into buckets.

Why this shape: nothing in the ledger is ever rewritten, so a process killed at any moment
loses at most the event it was writing and never the ones before it.
- A local (or shared-mount) output_dir: each source appends whole lines to its own file,
  SOURCE.jsonl, with one write(2) per event on a file opened O_APPEND. A writer killed mid-line
  leaves a truncated last line, which `read` skips.
- gs://: an object cannot be appended to. Rewriting one ledger object per event would copy
  the whole history every time and let two writers (the launcher and the chief) overwrite each
  other's events in a read-modify-write race. So each event is an object of its own,
  SOURCE-MICROS-PID-SEQ.json, written once; an upload is visible only once complete, so a
  reader sees whole events or none, and no writer ever touches another's. A run writes a
  few per logged step and per checkpoint (hundreds to a few thousand objects for a long run:
  one listing and parallel reads, payload.core.storage.read_many).
Either way the ledger lives with the outputs, not on the workers: it is readable after the
slice is gone, by `tpuctl goodput` from any machine that can read output_dir.

A ledger write never ends a run: a failure is said once on stderr and the run goes on.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import time

from payload.core import layout, storage

# Who writes which events (payload.cloud.goodput reads them by these names).
LAUNCHER, AGENT, CHIEF = "launcher", "agent", "chief"
SOURCES = (LAUNCHER, AGENT, CHIEF)
EVENTS = {
    LAUNCHER: ("requested", "queued", "capacity_granted", "vms_up", "setup_started",
               "environment_installed", "job_started", "preempted", "recreated", "job_ended",
               "torn_down"),
    AGENT: ("stage_start", "stage_end", "agent_end", "torn_down"),
    CHIEF: ("devices_ready", "restore_start", "restore_end", "compile_start", "compile_end",
            "step", "eval_start", "eval_end", "checkpoint_save_start", "checkpoint_save_end",
            "train_end"),
}
# What the agent hands every stage: the job the events belong to.
JOB_ENV = "TPUCTL_JOB_ID"
LOCAL_SUFFIX, OBJECT_SUFFIX = ".jsonl", ".json"


def ledger_dir(output_dir: str) -> str:
    return layout.own_path(output_dir, layout.LEDGER_DIR)


def event(name: str, *, source: str, job: str | None = None, step: int | None = None,
          slice_index: int = 0, t: float | None = None, **fields) -> dict:
    """One event as the ledger keeps it."""
    return {"t": time.time() if t is None else t, "event": name, "source": source, "job": job,
            "step": step, "slice": slice_index, "host": socket.gethostname(), **fields}


_sequence = itertools.count()


def append(output_dir: str, events: list[dict]) -> None:
    """Add events of one source to the ledger: whole lines appended to SOURCE.jsonl locally,
    one object per event on gs:// (the module's docstring says why)."""
    if not events:
        return
    folder = ledger_dir(output_dir)
    if storage.is_gcs(output_dir):
        for item in events:
            name = (f"{item['source']}-{int(item['t'] * 1e6):017d}-{os.getpid()}-"
                    f"{next(_sequence)}{OBJECT_SUFFIX}")
            storage.write_text(storage.join(folder, name), json.dumps(item))
        return
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, events[0]["source"] + LOCAL_SUFFIX)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, storage.file_mode())
    try:
        size = os.fstat(fd).st_size
        # A writer killed mid-line left no newline: this one starts on a line of its own, so
        # only the torn event is lost, never the next.
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        for i, item in enumerate(events):
            os.write(fd, ("\n" if torn and i == 0 else "").encode() + (
                json.dumps(item) + "\n").encode("utf-8"))
    finally:
        os.close(fd)


def parse_lines(text: str) -> list[dict]:
    """The events in a SOURCE.jsonl file's text: a line that is not a whole event (the last
    one of a writer killed while writing it) is skipped."""
    found = []
    for raw in text.splitlines():
        item = _parsed(raw)
        if item is not None:
            found.append(item)
    return found


def _parsed(raw: str) -> dict | None:
    try:
        item = json.loads(raw)
    except ValueError:
        return None
    if (not isinstance(item, dict) or not isinstance(item.get("event"), str)
            or not isinstance(item.get("t"), int | float) or isinstance(item.get("t"), bool)):
        return None
    return item


def read(output_dir: str) -> list[dict]:
    """Every event in the ledger, by time (each writer's own clock; payload.cloud.goodput lines
    the hosts' clocks up). Empty when there is none."""
    folder = ledger_dir(output_dir)
    paths = storage.listdir(folder)
    found: list[dict] = []
    for path, data in zip(paths, storage.read_many(paths), strict=True):
        if data is None:
            continue
        text = data.decode("utf-8", "replace")
        if path.endswith(LOCAL_SUFFIX):
            found += parse_lines(text)
        elif path.endswith(OBJECT_SUFFIX):
            item = _parsed(text)
            if item is not None:
                found.append(item)
    return sorted(found, key=lambda e: e["t"])


class Writer:
    """One source's pen. `hold=True` keeps events in memory until `release()` (the launcher
    before the run lock is taken: nothing may be written to output_dir before then); `events`
    is everything noted, for a reader in the same process (the chief's goodput so far)."""

    def __init__(self, output_dir: str | None, *, source: str, job: str | None = None,
                 slice_index: int = 0, hold: bool = False):
        self.output_dir, self.source, self.job = output_dir, source, job
        self.slice_index = slice_index
        self.held = hold
        self.pending: list[dict] = []
        self.events: list[dict] = []
        self.broken = output_dir is None

    def note(self, name: str, *, step: int | None = None, t: float | None = None,
             **fields) -> dict:
        item = event(name, source=self.source, job=self.job, step=step,
                     slice_index=self.slice_index, t=t, **fields)
        self.events.append(item)
        if self.held:
            self.pending.append(item)
        else:
            self._write([item])
        return item

    def release(self) -> None:
        """Write what was held, and every later event at once."""
        self.held = False
        pending, self.pending = self.pending, []
        self._write(pending)

    def _write(self, items: list[dict]) -> None:
        if self.broken or not items:
            return
        try:
            append(self.output_dir, items)
        except Exception as exc:  # the run matters more than its ledger
            self.broken = True
            print(f"tpuctl: cannot write the run's ledger in {ledger_dir(self.output_dir)} "
                  f"({exc}); the run goes on without it", file=sys.stderr, flush=True)
