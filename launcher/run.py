"""Run a plan on workers: submit the detached job, watch it (streaming logs, fail-fast), stop it.

    record = save_job(state_dir, plan, config_text)
    submit(executor, plan, record)
    outcome = watch(executor, plan, record.logbook(), sink=print_line)

Everything goes through an executor's `run`/`put`, so local workers and SSH hosts behave the
same. The launcher keeps each job's plan and a copy of every worker's log under the state
folder (TPUCTL_HOME, default ~/.tpuctl) so `tpuctl logs`, `stop` and `status` work after the
launcher itself went away.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from launcher import jobs
from launcher.agent import ABORTED
from launcher.executors import WorkerUnreachable
from launcher.jobs import JobState
from launcher.plan import Plan, Worker
from payload.errors import UserError, one_line

POLL_S = 0.5
TAIL_LINES = 20


def state_dir() -> Path:
    return Path(os.environ.get("TPUCTL_HOME") or Path.home() / ".tpuctl")


@dataclass(frozen=True)
class JobRecord:
    """A job as the launcher machine remembers it."""

    folder: Path

    @property
    def plan_file(self) -> Path:
        return self.folder / "plan.json"

    def log_file(self, worker: int) -> Path:
        return self.folder / "logs" / f"worker-{worker}.log"

    def plan(self) -> Plan:
        return Plan.from_json(self.plan_file.read_text())


def _jobs_dir(base: Path, name: str) -> Path:
    return base / "jobs" / name


def save_job(base: Path, plan: Plan, config_text: str) -> JobRecord:
    folder = _jobs_dir(base, plan.name) / plan.job_id
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(config_text)
    for w in plan.workers:
        (folder / f"agent-{w.index}.json").write_text(json.dumps(plan.agent_plan(w.index)))
    (folder / "plan.json").write_text(plan.to_json())
    (_jobs_dir(base, plan.name) / "current").write_text(plan.job_id)
    return JobRecord(folder)


def current_job(base: Path, name: str, job_id: str | None = None) -> JobRecord:
    jobs_dir = _jobs_dir(base, name)
    if job_id is None:
        pointer = jobs_dir / "current"
        if not pointer.is_file():
            raise UserError(f"no job of run '{name}' started from this machine",
                            hint="start one with `tpuctl train`")
        job_id = pointer.read_text().strip()
    record = JobRecord(jobs_dir / job_id)
    if not record.plan_file.is_file():
        raise UserError(f"no job '{job_id}' of run '{name}' on this machine")
    return record


def on_workers(workers, action: Callable[[Worker], object]) -> list:
    """action on every worker in parallel; results in worker order, the first error raised."""
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(workers)))) as pool:
        return [f.result() for f in [pool.submit(action, w) for w in workers]]


def _python_snippet(plan: Plan, code: str, *args: str) -> str:
    return shlex.join(["env", f"PYTHONPATH={plan.paths.payload_dir}",
                       plan.environment.python, "-c", code, *args])


_WRITE = ("import sys\nfrom payload import storage\n"
          "storage.write_text(sys.argv[1], sys.argv[2])")
_EXISTS = ("import sys\nfrom payload import storage\n"
           "print('seen' if storage.exists(sys.argv[1]) else 'missing')")
_REMOVE = "import sys\nfrom payload import storage\nstorage.remove(sys.argv[1])"


def check_shared_output(executor, plan: Plan) -> None:
    """Worker 0 writes a marker into output_dir; every worker must see it."""
    from payload import storage

    marker = storage.join(plan.output_dir, ".tpuctl", f"shared-check-{secrets.token_hex(6)}")
    first = plan.workers[0]
    res = executor.run(first, _python_snippet(plan, _WRITE, marker, plan.job_id))
    if not res.ok:
        last = (res.stderr or res.stdout).strip().splitlines()
        raise UserError(f"{first.label} cannot write output_dir {plan.output_dir}: "
                        f"{last[-1] if last else 'exit ' + str(res.rc)}")
    try:
        seen = on_workers(plan.workers[1:], lambda w: executor.run(
            w, _python_snippet(plan, _EXISTS, marker)).stdout.strip())
    finally:
        executor.run(first, _python_snippet(plan, _REMOVE, marker))
    blind = [w.label for w, s in zip(plan.workers[1:], seen, strict=True) if s != "seen"]
    if blind:
        raise UserError(
            f"output_dir {plan.output_dir} is not shared: {', '.join(blind)} cannot see what "
            f"{first.label} wrote there",
            hint="use gs://BUCKET/PREFIX or a folder mounted on every worker (NFS, gcsfuse)")


def submit(executor, plan: Plan, record: JobRecord) -> list[int]:
    """Copy the job's files to every worker and start the agent; the process group ids."""

    def start(worker: Worker) -> int:
        made = executor.run(worker, f"mkdir -p {shlex.quote(plan.paths.job_dir)}")
        if not made.ok:
            raise UserError(f"{worker.label}: cannot make the job folder {plan.paths.job_dir}: "
                            f"{one_line(made.stderr or made.stdout)[-200:]}")
        executor.put(worker, str(record.folder / "config.yaml"), plan.paths.config)
        executor.put(worker, str(record.folder / f"agent-{worker.index}.json"),
                     plan.paths.agent_plan)
        res = executor.run(worker, jobs.start_command(plan.paths, plan.environment.python))
        pid = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
        if not res.ok or not pid.isdigit():
            raise UserError(f"{worker.label}: the job did not start: "
                            f"{(res.stderr or res.stdout).strip()[-200:]}")
        return int(pid)

    try:
        return on_workers(plan.workers, start)
    except BaseException:
        # Some workers may have started; alone they would wait for the others forever.
        stop(executor, plan)
        raise


class LogBook:
    """The launcher's copy of every worker's log, and the line each one is at."""

    def __init__(self, record: JobRecord, workers, *, from_start: bool):
        self._files = {}
        self.offsets: dict[int, int] = {}
        for w in workers:
            path = record.log_file(w.index)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._files[w.index] = path.open("w" if from_start else "a", encoding="utf-8")
            self.offsets[w.index] = 0
        self.tails: dict[int, list[str]] = {w.index: [] for w in workers}

    def add(self, worker: int, line: str) -> None:
        self._files[worker].write(line + "\n")
        self._files[worker].flush()
        tail = self.tails[worker]
        tail.append(line)
        del tail[:-TAIL_LINES]

    def close(self) -> None:
        for f in self._files.values():
            f.close()


@dataclass
class Outcome:
    ok: bool
    detached: bool = False
    failed_worker: int | None = None
    reason: str = ""
    tail: list[str] = field(default_factory=list)


@dataclass
class _Seen:
    state: JobState = JobState.NONE
    rc: int | None = None
    stage: str = ""
    error: str = ""
    drained: bool = False


def _follow_worker(executor, plan: Plan, worker: Worker, book: LogBook, sink, seen: _Seen,
                   halt: threading.Event, follow: bool) -> None:
    while not halt.is_set():
        try:
            res = executor.run(worker, jobs.poll_command(plan.paths, book.offsets[worker.index]),
                               timeout_s=60)
        except WorkerUnreachable as exc:
            seen.error = str(exc)
            return
        poll = jobs.parse_poll(res.stdout)
        lines = list(poll.lines)
        finished = poll.state in (JobState.EXITED, JobState.GONE)
        if finished and len(lines) < jobs.POLL_MAX_LINES and poll.partial:
            lines.append(poll.partial)
        for line in lines:
            book.add(worker.index, line)
            sink(worker.index, line)
        book.offsets[worker.index] += len(lines)
        seen.state, seen.rc, seen.stage = poll.state, poll.rc, poll.stage
        if len(poll.lines) >= jobs.POLL_MAX_LINES:
            continue  # more to read right away
        if finished or poll.state is JobState.NONE or not follow:
            seen.drained = True
            return
        halt.wait(POLL_S)


def _failure(plan: Plan, seen: dict[int, _Seen]) -> tuple[int, str] | None:
    """The worker that failed first in spirit: an own failure beats a peer-abort."""
    found = []
    for w in plan.workers:
        s = seen[w.index]
        if s.error:
            found.append((1, w.index, s.error))
        elif s.state is JobState.GONE:
            found.append((0, w.index, f"{w.label}'s job vanished during {s.stage or 'start'} "
                          "(killed?)"))
        elif s.state is JobState.EXITED and s.rc == jobs.STOPPED_RC:
            found.append((3, w.index, f"{w.label}'s job was stopped (tpuctl stop) during "
                          f"{s.stage or 'start'}"))
        elif s.state is JobState.EXITED and s.rc not in (0, None):
            rank = 2 if s.stage == ABORTED else 0
            found.append((rank, w.index, f"{w.label} failed in {s.stage or 'start'} "
                          f"(exit {s.rc})"))
    if not found:
        return None
    _, index, reason = min(found)
    return index, reason


def _failed(book: LogBook, index: int, reason: str) -> Outcome:
    return Outcome(ok=False, failed_worker=index, reason=reason, tail=list(book.tails[index]))


def watch(executor, plan: Plan, book: LogBook, sink: Callable[[int, str], None], *,
          follow: bool = True, fail_fast: bool = True) -> Outcome:
    """Stream every worker's log until the job ends. On a failure, stop the job everywhere."""
    seen = {w.index: _Seen() for w in plan.workers}
    halt = threading.Event()
    threads = [threading.Thread(target=_follow_worker, daemon=True,
                                args=(executor, plan, w, book, sink, seen[w.index], halt, follow))
               for w in plan.workers]
    for t in threads:
        t.start()
    try:
        while True:
            failure = _failure(plan, seen) if fail_fast else None
            if failure or all(not t.is_alive() for t in threads):
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        halt.set()
        return Outcome(ok=False, detached=True)
    if failure is not None:
        halt.set()
        stop(executor, plan)
        for t in threads:
            t.join(timeout=5)
        # What the workers printed while being stopped.
        drain = threading.Event()
        on_workers(plan.workers, lambda w: _follow_worker(
            executor, plan, w, book, sink, _Seen(), drain, False))
        return _failed(book, *failure)
    for t in threads:
        t.join()
    failure = _failure(plan, seen)
    if failure is not None:
        return _failed(book, *failure)
    running = [w.label for w in plan.workers if seen[w.index].state is JobState.RUNNING]
    if running:  # not following: a snapshot of a job still going
        return Outcome(ok=True, reason=f"still running on {', '.join(running)}")
    if all(seen[w.index].state is JobState.NONE for w in plan.workers):
        return Outcome(ok=False, reason="the job never started on any worker")
    return Outcome(ok=True)


def stop(executor, plan: Plan) -> dict[int, str]:
    """Stop the job's process group on every worker; what each one reported."""

    def stop_one(worker: Worker) -> str:
        try:
            res = executor.run(worker, jobs.stop_command(plan.paths), timeout_s=60)
        except WorkerUnreachable as exc:
            return f"unreachable ({exc})"
        out = res.stdout.strip().split()
        return "stopped" if out[-2:] == ["stopped", "0"] else f"still running: {res.stdout!r}"

    return dict(zip((w.index for w in plan.workers), on_workers(plan.workers, stop_one),
                    strict=True))


def live_processes(executor, plan: Plan) -> dict[int, int]:
    """Processes of the job alive on each worker (zombies excluded)."""
    counts = on_workers(plan.workers, lambda w: int(
        executor.run(w, jobs.live_count_command(plan.paths)).stdout.strip() or 0))
    return dict(zip((w.index for w in plan.workers), counts, strict=True))


def status(executor, plan: Plan) -> list[dict]:
    """Per worker: job state, stage, newest step, exit code and the last log line."""

    def one(worker: Worker) -> dict:
        try:
            res = executor.run(worker, jobs.poll_command(plan.paths, 10**9))
            step, last = jobs.parse_progress(
                executor.run(worker, jobs.progress_command(plan.paths)).stdout)
        except WorkerUnreachable as exc:
            return {"worker": worker.label, "host": worker.host, "state": "unreachable",
                    "stage": "", "step": "", "rc": None, "last": str(exc)}
        poll = jobs.parse_poll(res.stdout)
        return {"worker": worker.label, "host": worker.host, "state": poll.state.value,
                "stage": poll.stage, "step": step, "rc": poll.rc, "last": last}

    return on_workers(plan.workers, one)
