"""Never the wrong process, never a second run on one output_dir: process identity, per-worker
job folders, set-up locks, coordination ports, the run lock and the local log copies, with real
local worker processes and stand-in stages."""

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from launcher import ship
from payload.core import storage
from payload.jobs import runlock

# -- 1. process identity -------------------------------------------------------------------


# -- 2. per-worker folders and set-up locks ------------------------------------------------


# -- 4. coordination ports ----------------------------------------------------------------


# -- 5. the run lock -----------------------------------------------------------------------


def test_two_launchers_writing_the_same_wheel_each_get_it_whole(tmp_path):
    # Two runs started together keep the same wheel in the same place (seen: one crashed with
    # FileNotFoundError when the other had renamed their shared temporary file first).
    data = os.urandom(1 << 20)
    for attempt in range(20):
        out = tmp_path / str(attempt)
        start = threading.Barrier(4)

        def write(_, start=start, out=out):
            start.wait()
            return ship.write_wheel(out, data)

        with ThreadPoolExecutor(4) as pool:
            paths = list(pool.map(write, range(4)))
        assert len(set(paths)) == 1 and paths[0].read_bytes() == data
        assert [p.name for p in paths[0].parent.iterdir()] == [paths[0].name]


def test_run_lock_take_beat_release(tmp_path):
    out = str(tmp_path / "out")
    now = [1000.0]
    holder = {"job": "a", "from": "me@here:/x.yaml", "stale_after_s": 10}
    assert runlock.take(out, holder, clock=lambda: now[0]) == ""
    assert runlock.take(out, holder, clock=lambda: now[0]) == ""  # already its own
    from payload.core.errors import UserError

    with pytest.raises(UserError, match=r"in use by job a \(started from me@here:/x.yaml; "
                                        r"last heartbeat 5 s ago\)"):
        now[0] += 5
        runlock.take(out, {**holder, "job": "b"}, clock=lambda: now[0])
    assert runlock.beat(out, "a", clock=lambda: now[0]) and not runlock.beat(out, "b")
    now[0] += 11
    note = runlock.take(out, {**holder, "job": "b"}, clock=lambda: now[0])
    assert "from job a" in note and "no heartbeat for 11 s" in note
    assert not runlock.beat(out, "a") and not runlock.release(out, "a")
    assert runlock.release(out, "b") and not os.path.exists(runlock.lock_path(out))


def test_create_exclusive_has_one_winner_locally(tmp_path):
    path = str(tmp_path / "lock")
    together = threading.Barrier(8)
    wins = []

    def race(i):
        together.wait()
        wins.append(storage.create_exclusive(path, f"writer {i}".encode()))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]
    held = Path(path).read_bytes()
    assert storage.create_exclusive(path, b"new", replacing=b"not what it holds") is False
    assert Path(path).read_bytes() == held, "a failed replace puts the old file back"
    assert storage.create_exclusive(path, b"new", replacing=held) is True
    assert Path(path).read_bytes() == b"new"
    assert storage.create_exclusive(path, b"newer", replacing=held) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock"], "no temporary files left"


# -- 6. local log copies -------------------------------------------------------------------


# -- 8 (a crash, not a bad input). ---------------------------------------------------------


# -- 9. what reaches the terminal ----------------------------------------------------------


# -- 10. secrets ---------------------------------------------------------------------------


# -- 11. a job that lost its agent or its lock; a stop that says where it stopped --------------


# -- 12. limits bind the whole job ---------------------------------------------------------


