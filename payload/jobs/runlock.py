"""One run at a time per output_dir: a lock file with a heartbeat, so a dead job's lock expires.

    note = take("gs://b/run", {"job": "demo-...", "from": "me@laptop:/w/tpuctl.yaml",
                               "stale_after_s": 120.0})       # raises UserError when held
    beat("gs://b/run", "demo-..."); release("gs://b/run", "demo-...")

The lock is `output_dir/.tpuctl/run.lock`, a small JSON record: the job, its run, where it was
started from, and a heartbeat (a counter and the time of the last beat by the beating worker's
clock). The launcher takes it through worker 0, which sees output_dir as the job will; worker
0's agent (payload.jobs.agent) keeps it beating while the job runs and removes it when the job ends,
so the lock does not depend on the launcher staying up. Both creating it and taking over a
stale one are single atomic steps (payload.core.storage.create_exclusive), so of two runs started
together exactly one gets it. A lock whose heartbeat is older than its own `stale_after_s`
(the job died without cleaning up), or whose job the launcher has just seen ended, is taken
over with a message. Standard library only, plus payload.core.storage: it runs on the workers.

    python -m payload.jobs.runlock take OUTPUT_DIR HOLDER_JSON [DEAD_JOB]   # prints {"note": ...}
    python -m payload.jobs.runlock release OUTPUT_DIR JOB
"""

from __future__ import annotations

import json
import sys
import time

from payload.core import layout

LOCK = layout.RUN_LOCK
DEFAULT_STALE_S = 120.0


def _storage():
    from payload.core import storage

    return storage


def lock_path(output_dir: str) -> str:
    return layout.own_path(output_dir, LOCK)


def _read(path: str) -> tuple[bytes, dict] | None:
    """The lock's bytes and what they say ({} when unreadable), or None when there is none."""
    storage = _storage()
    try:
        if not storage.exists(path):
            return None
        raw = storage.read_bytes(path)
    except FileNotFoundError:
        return None
    except Exception as exc:  # gone between the two looks (gs:// NotFound), or unreadable
        if type(exc).__name__ == "NotFound":
            return None
        raise
    try:
        info = json.loads(raw)
    except ValueError:
        info = {}
    return raw, info if isinstance(info, dict) else {}


def _encode(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True).encode()


def take(output_dir: str, holder: dict, *, dead_job: str | None = None,
         clock=time.time) -> str:
    """Take the lock for `holder["job"]`: "" when it was free (or already this job's), a note
    when a stale or dead job's lock was taken over. A live job's lock: a UserError naming it."""
    from payload.core.errors import UserError

    storage, path = _storage(), lock_path(output_dir)
    for _ in range(5):
        mine = _encode({**holder, "beat": clock(), "beats": 0})
        if storage.create_exclusive(path, mine):
            return ""
        seen = _read(path)
        if seen is None:
            continue  # let go in between: try again
        raw, info = seen
        job = info.get("job")
        if job == holder["job"]:
            return ""
        if not job:
            raise UserError(f"output_dir {output_dir} has a run lock tpuctl cannot read "
                            f"({path})", hint="if no run is using output_dir, delete that file")
        age = clock() - float(info.get("beat", 0))
        if dead_job and job == dead_job:
            why = "it is not running any more"
        elif age > float(info.get("stale_after_s", DEFAULT_STALE_S)):
            why = f"no heartbeat for {age:.0f} s"
        else:
            raise UserError(
                f"output_dir {output_dir} is in use by job {job} (started from "
                f"{info.get('from', 'an unknown place')}; last heartbeat {max(age, 0):.0f} s "
                "ago)", hint="wait for it to end, or end it with `tpuctl stop`; one run at a "
                "time per output_dir")
        if storage.create_exclusive(path, mine, replacing=raw):
            return (f"took over the run lock of {output_dir} from job {job} (started from "
                    f"{info.get('from', 'an unknown place')}; {why})")
    raise UserError(f"the run lock of output_dir {output_dir} keeps changing hands",
                    hint="another run is starting on it; wait for it, then try again")


def beat(output_dir: str, job: str, *, clock=time.time) -> bool:
    """One heartbeat of `job`'s lock; False when the lock is not the job's any more."""
    path = lock_path(output_dir)
    seen = _read(path)
    if seen is None or seen[1].get("job") != job:
        return False
    raw, info = seen
    info["beat"], info["beats"] = clock(), int(info.get("beats", 0)) + 1
    # Only over the very lock just read: another run may have taken it over in between.
    return _storage().create_exclusive(path, _encode(info), replacing=raw)


def release(output_dir: str, job: str) -> bool:
    """Remove the lock if `job` holds it; whether it did."""
    path = lock_path(output_dir)
    seen = _read(path)
    if seen is None or seen[1].get("job") != job:
        return False
    # Only the very lock just read: one another run took over in between stays.
    return _storage().remove_if(path, seen[0])


def main(argv: list[str]) -> int:
    """take OUTPUT_DIR HOLDER_JSON [DEAD_JOB] | release OUTPUT_DIR JOB; prints one JSON line."""
    from payload.core.errors import UserError, one_line

    command, output_dir, *rest = argv
    try:
        if command == "take":
            note = take(output_dir, json.loads(rest[0]), dead_job=(rest[1:] or [""])[0] or None)
            print(json.dumps({"note": note}))
        elif command == "release":
            print(json.dumps({"released": release(output_dir, rest[0])}))
        else:
            raise SystemExit(f"unknown command {command!r}")
    except UserError as exc:
        print(json.dumps({"error": one_line(str(exc))}))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
