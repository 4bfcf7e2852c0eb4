"""The run's ledger written and read back (payload.core.ledger), locally and on gs:// (a Cloud
Storage emulator): the chief's steps never wait for a write, a long run leaves a batch per
flush and not an object per event, the reader takes one listing and reads what it lists in
parallel, and what a killed writer or a torn object leaves is read as far as it is whole."""

from __future__ import annotations

import threading

import pytest

from payload.core import ledger, storage
from tests.support.waits import wait_for

BUCKET = "gs://tpuctl-test"


def _steps(pen: ledger.Writer, first: int, last: int, *, checkpoint_every: int) -> None:
    """What the chief notes from step `first` to `last`: each step, a save every so often."""
    for step in range(first, last + 1):
        pen.note("step", step=step)
        if step % checkpoint_every == 0:
            pen.note("checkpoint_save_start", step=step)
            pen.note("checkpoint_save_end", step=step)


def _seen(events: list[dict]) -> list[tuple]:
    return [(e["event"], e["step"]) for e in events]


def test_a_chief_step_never_waits_for_the_ledger(tmp_path, monkeypatch):
    """Writes that take as long as they like (a slow bucket) happen on the writer's thread:
    every note returns while the first write is still stuck, and close() writes them all."""
    stuck, writers = threading.Event(), []
    real = ledger.append

    def slow_append(output_dir, events):
        writers.append(threading.current_thread())
        stuck.wait(30)
        real(output_dir, events)

    monkeypatch.setattr(ledger, "append", slow_append)
    out = str(tmp_path / "out")
    pen = ledger.Writer(out, source=ledger.CHIEF, job="j1", background=True)
    _steps(pen, 1, 300, checkpoint_every=100)
    wait_for(lambda: writers, timeout_s=10, interval_s=0.01)
    assert threading.main_thread() not in writers
    assert ledger.read(out) == []  # nothing is written yet: the first write is stuck
    stuck.set()
    pen.close()
    assert threading.main_thread() not in writers
    assert _seen(ledger.read(out)) == _seen(pen.events)
    assert len(pen.events) == 306


@pytest.mark.usefixtures("gcs_emulator")
def test_a_long_run_on_cloud_storage_leaves_a_batch_per_flush_read_in_parallel(monkeypatch):
    """2000 steps with a checkpoint every 100: the steps go out with the checkpoints' events, so
    the ledger holds at most one object per event that is not a step (and one at close), and
    reading it back is one listing and one read per object, not per event."""
    out = f"{BUCKET}/long"
    pen = ledger.Writer(out, source=ledger.CHIEF, job="j1", background=True)
    _steps(pen, 1, 2000, checkpoint_every=100)
    pen.close()
    objects = storage.listdir(ledger.ledger_dir(out))
    assert 1 <= len(objects) <= 2 * 20 + 1, len(objects)  # 2040 events
    listings, reads = [], []
    monkeypatch.setattr(storage, "listdir", _counting(storage.listdir, listings))
    monkeypatch.setattr(storage, "read_many", _counting(storage.read_many, reads))
    found = ledger.read(out)
    assert _seen(found) == _seen(pen.events)
    assert len(listings) == 1 and len(reads) == 1 and len(reads[0][0]) == len(objects)
    # The launcher's events (written one by one) are read with them, in time order.
    ledger.Writer(out, source=ledger.LAUNCHER, job="j1").note("job_ended")
    assert ledger.read(out)[-1]["event"] == "job_ended"


def _counting(fn, calls: list):
    def counted(*args):
        calls.append(args)
        return fn(*args)

    return counted


@pytest.mark.usefixtures("gcs_emulator")
def test_a_killed_chief_leaves_what_it_flushed_readable():
    """A checkpoint's events go out at once; the steps after it wait for the next batch, so a
    chief killed then loses those steps only (close() would have written them)."""
    out = f"{BUCKET}/killed"
    pen = ledger.Writer(out, source=ledger.CHIEF, job="j1", background=True)
    _steps(pen, 1, 20, checkpoint_every=10)
    wait_for(lambda: any(e["event"] == "checkpoint_save_end" and e["step"] == 20
                         for e in ledger.read(out)), timeout_s=30, interval_s=0.05)
    pen.note("step", step=21)
    pen.note("step", step=22)
    # Killed here: nothing more of this writer reaches the bucket.
    found = ledger.read(out)
    assert _seen(found) == _seen(pen.events[:-2])
    pen.close()
    assert _seen(ledger.read(out)) == _seen(pen.events)


@pytest.mark.usefixtures("gcs_emulator")
def test_torn_empty_foreign_and_vanished_objects_are_skipped(monkeypatch):
    out = f"{BUCKET}/torn"
    folder = ledger.ledger_dir(out)
    whole = [ledger.event("step", source=ledger.CHIEF, job="j1", step=s, t=100.0 + s)
             for s in range(1, 4)]
    ledger.append(out, whole[:2])
    ledger.append(out, whole[2:])
    # An object cut short by whatever wrote it: its whole first line is read, the rest not.
    storage.write_text(storage.join(folder, "chief-00000000000000009-1-0.jsonl"),
                       '{"t": 9.0, "event": "devices_ready", "source": "chief"}\n{"t": 9.5, "ev')
    storage.write_text(storage.join(folder, "chief-00000000000000010-1-1.jsonl"), "")
    storage.write_text(storage.join(folder, "agent-00000000000000011-1-2.jsonl"),
                       '[1, 2]\n{"event": "stage_start"}\n{"t": true, "event": "x"}\n')
    storage.write_text(storage.join(folder, "notes.txt"), '{"t": 1.0, "event": "step"}\n')
    storage.write_text(folder + "/", "")  # a folder placeholder, as TensorFlow's makedirs leaves
    listed = storage.listdir
    gone = storage.join(folder, "chief-00000000000000008-1-9.jsonl")  # deleted after listing
    monkeypatch.setattr(storage, "listdir", lambda path: [*listed(path), gone])
    found = ledger.read(out)
    assert [e["event"] for e in found] == ["devices_ready", "step", "step", "step"]
    assert [e["step"] for e in found[1:]] == [1, 2, 3]


def test_a_writer_far_behind_drops_new_events_and_says_so_once(tmp_path, monkeypatch, capsys):
    stuck = threading.Event()
    real = ledger.append
    monkeypatch.setattr(ledger, "MAX_WAITING", 10)
    monkeypatch.setattr(ledger, "append", lambda out, events: (stuck.wait(30),
                                                               real(out, events)))
    out = str(tmp_path / "out")
    pen = ledger.Writer(out, source=ledger.CHIEF, background=True)
    pen.note("compile_end")  # taken by the thread at once, which then hangs
    wait_for(lambda: not pen._waiting, timeout_s=10, interval_s=0.01)
    for step in range(1, 31):
        pen.note("step", step=step)
    stuck.set()
    pen.close()
    assert capsys.readouterr().err.count("events behind") == 1
    assert [e.get("step") for e in ledger.read(out)] == [None, *range(1, 11)]
    assert len(pen.events) == 31  # the run's own view (its goodput so far) keeps them all
