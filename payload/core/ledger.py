"""The run's event ledger: what happened when, from the request for a slice to its teardown.

    writer = Writer(out, source="chief", job="demo-20261201-101010-ab12", background=True)
    writer.note("checkpoint_save_start", step=50)
    writer.note("checkpoint_save_end", step=50)
    writer.close()             # what is still queued is written (a background writer)
    events = read(out)         # every event every writer left, oldest first; bad lines skipped

Three kinds of writer append to output_dir/.tpuctl/ledger/: the launcher (`launcher`: the
request, queueing, capacity, VMs up, environment set-up, job start and end, preemption,
recreation, teardown), worker 0's job agent (`agent`: each stage's start and end, the job's
end, a self-delete) and the training chief (`chief`: the trainer built, checkpoint restore and
save, compiling, evaluations, the first and every logged step, the end of training). Each event
is one flat JSON object: `t` (epoch seconds by the writer's clock), `event`, `source`, `job`,
`step`, `slice`, `host`, and its own fields. payload.cloud.goodput turns them into buckets.

Why this shape: nothing in the ledger is ever rewritten, so a process killed at any moment
loses at most what it had not yet written and never what it wrote before.
- A local (or shared-mount) output_dir: each source appends whole lines to its own file,
  SOURCE.jsonl, with one write(2) per batch of events on a file opened O_APPEND. A writer
  killed mid-line leaves a truncated last line, which `read` skips.
- gs://: an object cannot be appended to. Rewriting one ledger object per batch would copy
  the whole history every time and let two writers (the launcher and the chief) overwrite each
  other's events in a read-modify-write race. So each batch is an object of its own,
  SOURCE-MICROS-PID-SEQ.jsonl (one event a line), written once; an upload is visible only once
  complete, so a reader sees a whole batch or none, and no writer ever touches another's.
The launcher and the agent write each event as it happens (a few per job). The chief writes
from a thread of its own (`background=True`): a step never waits for the ledger, however slow
the bucket. What it notes is queued; the thread writes everything queued as one batch as soon
as anything but a step is noted (a compile, a checkpoint, an evaluation, the end of training)
and at least every FLUSH_EVERY_S, and `close()` writes the rest. A long run thus leaves a few
hundred objects, not one per logged step: one listing and parallel reads
(payload.core.storage.read_many) read them back. What a killed chief loses: the events it
noted in the last moments (a batch still being uploaded) and the step events noted since the
last batch (up to FLUSH_EVERY_S of them; the launcher notes the step a preemption lost from
the progress log anyway).
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
import threading
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
SUFFIX = ".jsonl"
# The chief's writer thread (Writer(background=True)): a batch at least this often while events
# wait, and at most this many waiting (beyond it, new events are dropped and said once).
FLUSH_EVERY_S = 300.0
MAX_WAITING = 10_000
# The only events that wait for the next batch: every other one is written at once.
BATCHED = frozenset({"step"})


def ledger_dir(output_dir: str) -> str:
    return layout.own_path(output_dir, layout.LEDGER_DIR)


def event(name: str, *, source: str, job: str | None = None, step: int | None = None,
          slice_index: int = 0, t: float | None = None, **fields) -> dict:
    """One event as the ledger keeps it."""
    return {"t": time.time() if t is None else t, "event": name, "source": source, "job": job,
            "step": step, "slice": slice_index, "host": socket.gethostname(), **fields}


_sequence = itertools.count()


def append(output_dir: str, events: list[dict]) -> None:
    """Add a batch of events of one source to the ledger: whole lines appended to SOURCE.jsonl
    in one write locally, one object holding them on gs:// (the module's docstring says why)."""
    if not events:
        return
    folder = ledger_dir(output_dir)
    text = "".join(json.dumps(item) + "\n" for item in events)
    if storage.is_gcs(output_dir):
        first = events[0]
        name = (f"{first['source']}-{int(first['t'] * 1e6):017d}-{os.getpid()}-"
                f"{next(_sequence)}{SUFFIX}")
        storage.write_text(storage.join(folder, name), text)
        return
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, events[0]["source"] + SUFFIX)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, storage.file_mode())
    try:
        size = os.fstat(fd).st_size
        # A writer killed mid-line left no newline: this one starts on a line of its own, so
        # only the torn event is lost, never the next.
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        os.write(fd, (("\n" if torn else "") + text).encode("utf-8"))
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
    the hosts' clocks up). Empty when there is none. One listing, then every file or object
    read in parallel on gs://; a line that is not a whole event, or an object gone between the
    listing and its read, is skipped."""
    paths = [p for p in storage.listdir(ledger_dir(output_dir)) if p.endswith(SUFFIX)]
    found: list[dict] = []
    for data in storage.read_many(paths):
        if data is not None:
            found += parse_lines(data.decode("utf-8", "replace"))
    return sorted(found, key=lambda e: e["t"])


class Writer:
    """One source's pen. `hold=True` keeps events in memory until `release()` (the launcher
    before the run lock is taken: nothing may be written to output_dir before then);
    `background=True` writes from a thread of its own, in batches (the chief: the module's
    docstring), until `close()`; `events` is everything noted, for a reader in the same process
    (the chief's goodput so far)."""

    def __init__(self, output_dir: str | None, *, source: str, job: str | None = None,
                 slice_index: int = 0, hold: bool = False, background: bool = False):
        self.output_dir, self.source, self.job = output_dir, source, job
        self.slice_index = slice_index
        self.held = hold
        self.pending: list[dict] = []
        self.events: list[dict] = []
        self.broken = output_dir is None
        self.background = background and not self.broken
        self._waiting: list[dict] = []
        self._oldest = 0.0  # when the oldest waiting event was queued (monotonic)
        self._urgent = self._closing = False
        self._dropped = 0
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def note(self, name: str, *, step: int | None = None, t: float | None = None,
             **fields) -> dict:
        item = event(name, source=self.source, job=self.job, step=step,
                     slice_index=self.slice_index, t=t, **fields)
        self.events.append(item)
        if self.held:
            self.pending.append(item)
        else:
            self._send([item])
        return item

    def release(self) -> None:
        """Write what was held, and every later event at once."""
        self.held = False
        pending, self.pending = self.pending, []
        self._send(pending)

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued (a background writer: wait for its thread up to `timeout_s`,
        then say what is not written); later events are written at once."""
        thread, self.background = self._thread, False
        if thread is None:
            return
        with self._wake:
            self._closing = True
            self._wake.notify()
        thread.join(timeout_s)
        if thread.is_alive():
            with self._wake:
                left = len(self._waiting)
            print(f"tpuctl: {left} events of the run's ledger not written in {timeout_s:.0f} s "
                  f"to {ledger_dir(self.output_dir)}; the run goes on without them",
                  file=sys.stderr, flush=True)

    def _send(self, items: list[dict]) -> None:
        if not self.background:
            self._write(items)
            return
        if not items:
            return
        with self._wake:
            room = MAX_WAITING - len(self._waiting)
            if room < len(items):
                if not self._dropped:
                    print(f"tpuctl: the run's ledger in {ledger_dir(self.output_dir)} is "
                          f"{MAX_WAITING} events behind; later ones are dropped until it "
                          "catches up", file=sys.stderr, flush=True)
                self._dropped += len(items) - max(room, 0)
                items = items[:max(room, 0)]
            if items and not self._waiting:
                self._oldest = time.monotonic()
            self._waiting += items
            if any(item["event"] not in BATCHED for item in items):
                self._urgent = True
            self._wake.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, daemon=True,
                                                name=f"ledger-{self.source}")
                self._thread.start()

    def _due(self) -> bool:
        return self._closing or self._urgent or bool(
            self._waiting and time.monotonic() - self._oldest >= FLUSH_EVERY_S)

    def _drain(self) -> None:
        """The background thread: write what waits, in one batch, whenever it is due."""
        while True:
            with self._wake:
                while not self._due():
                    self._wake.wait(None if not self._waiting else max(
                        0.0, FLUSH_EVERY_S - (time.monotonic() - self._oldest)))
                batch, self._waiting, self._urgent = self._waiting, [], False
                closing = self._closing
            self._write(batch)
            if closing:
                with self._wake:
                    if not self._waiting:
                        return

    def _write(self, items: list[dict]) -> None:
        if self.broken or not items:
            return
        try:
            append(self.output_dir, items)
        except Exception as exc:  # the run matters more than its ledger
            self.broken = True
            print(f"tpuctl: cannot write the run's ledger in {ledger_dir(self.output_dir)} "
                  f"({exc}); the run goes on without it", file=sys.stderr, flush=True)
