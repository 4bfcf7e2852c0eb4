"""Run a plan on workers: submit the detached job, watch it (streaming logs, fail-fast), stop it.

    check_shared_output(executor, plan)
    note = take_run_lock(executor, plan, holder)        # one run at a time per output_dir
    submit(executor, plan, record)                      # record: launcher.records.save_job
    book = LogBook(record, plan.workers)
    outcome = watch(executor, plan, book, sink=print_line, trouble=provider.trouble)
    stop(executor, plan); status(executor, plan)

Everything goes through an executor's `run`/`put`, so local workers and SSH hosts behave the
same. The launcher keeps a copy of every worker's log in the job's record (launcher.records), so
`tpuctl logs`, `stop` and `status` work after the launcher itself went away.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from launcher import job_shell, view
from launcher.executors import WorkerUnreachable, on_workers
from launcher.job_shell import JobState
from launcher.plan import Plan, Worker
from launcher.records import JobRecord
from payload.core import layout
from payload.core.errors import UserError, UserErrors, one_line
from payload.jobs.agent import ABORTED, LIMIT_RC, stopped_words

POLL_S = 0.5
TAIL_LINES = 60  # of which the launcher shows the last 20 the live view would show
# Workers that stopped because a peer failed report it at once; the peer's own exit may reach
# the launcher a poll later. Wait this long for it, so the right worker is named.
ABORT_GRACE_S = 3.0
# A stop reaches every worker within the stop command's grace (launcher.job_shell): a worker
# still running this long after another was stopped is stopped by the launcher too.
STOPPING_GRACE_S = 2 * job_shell.STOP_GRACE_S + 5.0
# How often the provider is asked whether the fleet is still there (an API call for a cloud).
TROUBLE_EVERY_S = 10.0
_ABORTED_RANK = 2


def _worker_module(plan: Plan, module: str, *args: str) -> str:
    """`python -m MODULE ARGS` on a worker, from the payload shipped there (code that lint and
    tests see, rather than a string)."""
    return shlex.join(["env", f"PYTHONPATH={plan.paths[0].payload_dir}",
                       plan.environment.python, "-m", module, *args])


_FILES = "payload.jobs.files"  # write only into an output_dir tpuctl may use; exists; remove
_RUNLOCK = "payload.jobs.runlock"


def check_shared_output(executor, plan: Plan) -> None:
    """Worker 0 writes a marker into output_dir; every worker must see it."""

    marker = layout.own_path(plan.output_dir, f"shared-check-{secrets.token_hex(6)}")
    first = plan.workers[0]
    res = executor.run(first, _worker_module(plan, _FILES, "write", marker, plan.job_id,
                                             plan.output_dir))
    refused = [ln for ln in res.stdout.splitlines() if ln.startswith("error: ")]
    if refused:
        raise UserError(refused[-1].removeprefix("error: "))
    if not res.ok:
        last = (res.stderr or res.stdout).strip().splitlines()
        raise UserError(f"{first.label} cannot write output_dir {plan.output_dir}: "
                        f"{last[-1] if last else 'exit ' + str(res.rc)}")
    try:
        seen = on_workers(plan.workers[1:], lambda w: executor.run(
            w, _worker_module(plan, _FILES, "exists", marker)).stdout.strip())
    finally:
        executor.run(first, _worker_module(plan, _FILES, "remove", marker))
    blind = [w.label for w, s in zip(plan.workers[1:], seen, strict=True) if s != "seen"]
    if blind:
        raise UserError(
            f"output_dir {plan.output_dir} is not shared: {', '.join(blind)} cannot see what "
            f"{first.label} wrote there",
            hint="use gs://BUCKET/PREFIX or a folder mounted on every worker (NFS, gcsfuse)")


def preflight(executor, plan: Plan, config_text: str) -> None:
    """The plan's pre-flight (payload.stages.preflight) on worker 0, before the job: what its
    stages would refuse in the checkpoints found there is the stages' one line, as a UserError,
    with nothing written in output_dir. The config goes into the job's folder on the worker,
    where the job's own copy will go; a refused job's folder is removed again."""
    command = plan.preflight
    if command is None:
        return
    first, paths = plan.workers[0], plan.paths[0]
    made = executor.run(first, f"mkdir -p {shlex.quote(paths.job_dir)}")
    if not made.ok:
        raise UserError(f"{first.label}: cannot make the job folder {paths.job_dir}: "
                        f"{one_line(made.stderr or made.stdout)[-200:]}")
    with tempfile.TemporaryDirectory(prefix="tpuctl-preflight-") as local:
        config_file = os.path.join(local, "config.yaml")
        with open(config_file, "w", encoding="utf-8") as f:
            f.write(config_text)
        executor.put(first, config_file, paths.config)
    res = executor.run(first, command.shell_line(), timeout_s=None)
    if res.ok:
        return
    executor.run(first, f"rm -rf {shlex.quote(paths.job_dir)}")
    refused = [ln.removeprefix("error: ") for ln in res.stderr.splitlines()
               if ln.startswith("error: ")]
    if refused:
        raise UserErrors(refused) if len(refused) > 1 else UserError(refused[0])
    last = (res.stderr or res.stdout).strip().splitlines()
    raise UserError(f"{first.label}: the pre-flight of the checkpoints failed: "
                    f"{last[-1] if last else 'exit ' + str(res.rc)}")


def take_run_lock(executor, plan: Plan, holder: dict, *, dead_job: str | None = None) -> str:
    """Take output_dir's run lock for this job, through worker 0 (payload.jobs.runlock); a note
    when a dead job's lock was taken over, "" otherwise. Held by a live job: a UserError."""
    first = plan.workers[0]
    res = executor.run(first, _worker_module(
        plan, _RUNLOCK, "take", plan.output_dir, json.dumps(holder), dead_job or ""))
    answer = _last_json(res.stdout)
    if "error" in answer:
        raise UserError(answer["error"])
    if not res.ok or "note" not in answer:
        last = (res.stderr or res.stdout).strip().splitlines()
        raise UserError(f"{first.label} cannot take the run lock in {plan.output_dir}: "
                        f"{last[-1] if last else 'exit ' + str(res.rc)}")
    return answer["note"]


def release_run_lock(executor, plan: Plan) -> None:
    """Let output_dir's run lock go if this job still holds it (best effort: a lock left behind
    stops beating and is taken over later)."""
    with contextlib.suppress(WorkerUnreachable):
        executor.run(plan.workers[0], _worker_module(plan, _RUNLOCK, "release", plan.output_dir,
                                                     plan.job_id), timeout_s=60)


def _last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def submit(executor, plan: Plan, record: JobRecord,
           secrets: dict[str, str] | None = None) -> list[int]:
    """Copy the job's files to every worker and start the agent; the process group ids.
    `secrets` (name -> value) reach only the agents of workers whose commands name them, in
    memory (launcher.job_shell.start_command); they are in no file, argument or record."""

    def start(worker: Worker) -> int:
        paths = plan.paths[worker.index]
        names = plan.secret_names(worker.index)
        handed = {name: (secrets or {}).get(name, "") for name in names}
        made = executor.run(worker, f"mkdir -p {shlex.quote(paths.job_dir)}")
        if not made.ok:
            raise UserError(f"{worker.label}: cannot make the job folder {paths.job_dir}: "
                            f"{one_line(made.stderr or made.stdout)[-200:]}")
        executor.put(worker, str(record.config_file), paths.config)
        executor.put(worker, str(record.agent_file(worker.index)), paths.agent_plan)
        command = job_shell.start_command(paths, plan.environment.python, secrets=bool(names))
        if names:
            res = executor.run(worker, command,
                               secret_env={job_shell.SECRETS_ENV: json.dumps(handed)})
        else:
            res = executor.run(worker, command)
        pid = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
        if not res.ok or not pid.isdigit():
            raise UserError(f"{worker.label}: the job did not start: "
                            f"{(res.stderr or res.stdout).strip()[-200:]}")
        return int(pid)

    try:
        return on_workers(plan.workers, start)
    except BaseException:
        # Some workers may have started; alone they would wait for the others forever.
        stop(executor, plan, who="the launcher (the job did not start on every worker)")
        raise


class LogBook:
    """The launcher's copy of every worker's log, and the line each one is at.

    The copies only grow: lines already in a copy (from an earlier `train` or `logs`) are
    streamed again but not written twice, so a re-attach that finds the workers gone leaves
    what was saved."""

    def __init__(self, record: JobRecord, workers):
        self._files = {}
        self._kept: dict[int, int] = {}  # lines already in each copy
        self._seen: dict[int, int] = {}  # lines streamed so far
        self.offsets: dict[int, int] = {}
        for w in workers:
            path = record.log_file(w.index)
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a+b") as existing:
                existing.seek(0)
                self._kept[w.index] = sum(chunk.count(b"\n") for chunk in
                                          iter(lambda f=existing: f.read(1 << 20), b""))
            self._files[w.index] = path.open("a", encoding="utf-8")
            self._seen[w.index] = 0
            self.offsets[w.index] = 0
        self.tails: dict[int, list[str]] = {w.index: [] for w in workers}

    def add(self, worker: int, line: str) -> None:
        if self._seen[worker] >= self._kept[worker]:
            self._files[worker].write(line + "\n")
            self._files[worker].flush()
        self._seen[worker] += 1
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
    lost_fleet: bool = False  # the provider says the machines were taken away (preempted)
    # Stopped (`tpuctl stop`, or the launcher), with no worker failing: not a failure. The
    # reason is then the stopped job's last words (payload.jobs.agent.stop_words).
    stopped: bool = False


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
            res = executor.run(worker, job_shell.poll_command(plan.paths[worker.index],
                                                              book.offsets[worker.index]),
                               timeout_s=60)
        except WorkerUnreachable as exc:
            seen.error = str(exc)
            return
        poll = job_shell.parse_poll(res.stdout)
        lines = list(poll.lines)
        finished = poll.state in (JobState.EXITED, JobState.GONE)
        if finished and len(lines) < job_shell.POLL_MAX_LINES and poll.partial:
            lines.append(poll.partial)
        for line in lines:
            book.add(worker.index, line)
            sink(worker.index, line)
        book.offsets[worker.index] += len(lines)
        seen.state, seen.rc, seen.stage = poll.state, poll.rc, poll.stage
        if len(poll.lines) >= job_shell.POLL_MAX_LINES:
            continue  # more to read right away
        if finished or poll.state is JobState.NONE or not follow:
            seen.drained = True
            return
        halt.wait(POLL_S)


def _was_stopped(s: _Seen) -> bool:
    return s.state is JobState.EXITED and s.rc == job_shell.STOPPED_RC


def _failure(plan: Plan, seen: dict[int, _Seen]) -> tuple[int, int, str] | None:
    """(rank, worker, reason) of the worker that failed first in spirit: an own failure (rank 0)
    beats an unreachable worker (1) and a peer-abort (2). A stopped worker has not failed, and
    neither has one that ended because a peer was stopped (its abort)."""
    stopping = any(_was_stopped(s) for s in seen.values())
    found = []
    for w in plan.workers:
        s = seen[w.index]
        if s.error:
            found.append((1, w.index, s.error))
        elif s.state is JobState.GONE:
            found.append((0, w.index, f"{w.label}'s job vanished during {s.stage or 'start'} "
                          "(killed?)"))
        elif s.state is JobState.EXITED and s.rc == LIMIT_RC:
            found.append((0, w.index, f"{w.label}: the run's limit (train.max_hours / "
                          f"max_cost) ended the job during {s.stage or 'start'}"))
        elif _was_stopped(s) or (stopping and s.stage == ABORTED):
            continue
        elif s.state is JobState.EXITED and s.rc not in (0, None):
            rank = _ABORTED_RANK if s.stage == ABORTED else 0
            found.append((rank, w.index, f"{w.label} failed in {s.stage or 'start'} "
                          f"(exit {s.rc})"))
    return min(found) if found else None


def _stopped(plan: Plan, seen: dict[int, _Seen], book: LogBook) -> Outcome | None:
    """A job that ended stopped (and failed nowhere): its last words, from the first worker
    whose log says them (worker 0's name the step and the checkpoint `--resume` takes)."""
    stopped = [w for w in plan.workers if _was_stopped(seen[w.index])]
    if not stopped:
        return None
    for w in plan.workers:
        words = last_stop_words(book.tails[w.index])
        if words:
            return Outcome(ok=False, stopped=True, reason=words)
    first = stopped[0]
    return Outcome(ok=False, stopped=True,
                   reason=f"stopped during {seen[first.index].stage or 'start'}")


def last_stop_words(lines: list[str]) -> str | None:
    """The words of the last stop line among a log's lines (payload.jobs.agent.stop_line)."""
    return next(filter(None, map(stopped_words, reversed(lines))), None)


def _failed(book: LogBook, rank: int, index: int, reason: str) -> Outcome:
    return Outcome(ok=False, failed_worker=index, reason=reason, tail=list(book.tails[index]))


def watch(executor, plan: Plan, book: LogBook, sink: Callable[[int, str], None], *,
          follow: bool = True, fail_fast: bool = True,
          trouble: Callable[[], str | None] = lambda: None) -> Outcome:
    """Stream every worker's log until the job ends. On a failure, or when `trouble` (the
    provider's) says the fleet cannot go on, stop the job everywhere."""
    seen = {w.index: _Seen() for w in plan.workers}
    halt = threading.Event()
    threads = [threading.Thread(target=_follow_worker, daemon=True,
                                args=(executor, plan, w, book, sink, seen[w.index], halt, follow))
               for w in plan.workers]
    for t in threads:
        t.start()
    aborted_since, stopped_since, stopped_rest, failure = None, None, False, None
    next_trouble_check = time.monotonic() + TROUBLE_EVERY_S
    try:
        while True:
            if all(not t.is_alive() for t in threads):
                break
            failure = _failure(plan, seen) if fail_fast else None
            if failure is not None and failure[0] >= _ABORTED_RANK:
                aborted_since = aborted_since or time.monotonic()
                if time.monotonic() - aborted_since < ABORT_GRACE_S:
                    failure = None  # give the worker that failed first time to say so
            if failure is not None:
                break
            if fail_fast and not stopped_rest and any(map(_was_stopped, seen.values())):
                stopped_since = stopped_since or time.monotonic()
                if time.monotonic() - stopped_since > STOPPING_GRACE_S:
                    # Stopped on some workers only (a SIGTERM by hand?): the rest cannot go on.
                    stopped_rest = True
                    stop(executor, plan, who="the launcher (the job was stopped on " + ", ".join(
                        w.label for w in plan.workers if _was_stopped(seen[w.index])) + ")")
            if follow and time.monotonic() >= next_trouble_check:
                next_trouble_check = time.monotonic() + TROUBLE_EVERY_S
                reason = trouble()
                if reason:
                    halt.set()
                    stop(executor, plan, who=f"the launcher ({reason})")
                    return Outcome(ok=False, reason=reason, lost_fleet=True)
            time.sleep(0.1)
    except KeyboardInterrupt:
        halt.set()
        return Outcome(ok=False, detached=True)
    if failure is not None:
        halt.set()
        # A worker that fails or stops answering may be a machine taken away: ask first.
        lost = trouble() if follow else None
        if lost:
            stop(executor, plan, who=f"the launcher ({lost})")
            return Outcome(ok=False, reason=lost, lost_fleet=True)
        stop(executor, plan, who=f"the launcher ({failure[2]})")
        for t in threads:
            t.join(timeout=5)
        # What the workers printed while being stopped (not from one that stopped answering:
        # asking it again would only wait out the retries once more).
        drain = threading.Event()
        on_workers([w for w in plan.workers if not seen[w.index].error], lambda w:
                   _follow_worker(executor, plan, w, book, sink, _Seen(), drain, False))
        return _failed(book, *failure)
    for t in threads:
        t.join()
    failure = _failure(plan, seen)
    if failure is not None:
        lost = trouble() if follow else None  # every worker's job gone at once: taken away?
        if lost:
            return Outcome(ok=False, reason=lost, lost_fleet=True)
        return _failed(book, *failure)
    stopped = _stopped(plan, seen, book)
    if stopped is not None:
        return stopped
    running = [w.label for w in plan.workers if seen[w.index].state is JobState.RUNNING]
    if running:  # not following: a snapshot of a job still going
        return Outcome(ok=True, reason=f"still running on {', '.join(running)}")
    if all(seen[w.index].state is JobState.NONE for w in plan.workers):
        return Outcome(ok=False, reason="the job never started on any worker")
    return Outcome(ok=True)


STOPPED = "stopped"
ENDED = "already ended"


def stop(executor, plan: Plan, *, who: str = job_shell.BY_USER,
         on_result: Callable[[int, str], None] = lambda worker, result: None) -> dict[int, str]:
    """Stop the job's process group on every worker (a worker's job that has ended, exit code
    and no process left, is left alone); what each one reported, also to `on_result` as each
    worker answers. Then let the run lock go."""

    def stop_one(worker: Worker) -> str:
        try:
            res = executor.run(worker, job_shell.stop_command(plan.paths[worker.index], who=who),
                               timeout_s=60)
        except WorkerUnreachable as exc:
            result = f"unreachable ({exc})"
        else:
            out = res.stdout.strip().split()
            if out[-2:] == ["stopped", "0"]:
                result = STOPPED
            elif len(out) >= 2 and out[-2] == "ended":
                result = f"{ENDED} (exit {out[-1]})"
            else:
                result = f"still running: {res.stdout!r}"
        on_result(worker.index, result)
        return result

    results = dict(zip((w.index for w in plan.workers), on_workers(plan.workers, stop_one),
                       strict=True))
    if stopped_everywhere(results):
        release_run_lock(executor, plan)
    return results


def stopped_everywhere(results: dict[int, str]) -> bool:
    return all(r == STOPPED or r.startswith(ENDED) for r in results.values())


@dataclass(frozen=True)
class Stop:
    """What a stop did: each worker's result (stop) and the stopped job's last words in worker
    0's log (payload.jobs.agent.stop_words: who, at which step, which checkpoint)."""

    results: dict[int, str]
    words: str | None = None

    @property
    def stopped(self) -> bool:
        """Nothing of the job is left running."""
        return stopped_everywhere(self.results)

    @property
    def already_ended(self) -> bool:
        """The job had ended on every worker before: nothing was stopped."""
        return all(r.startswith(ENDED) for r in self.results.values())


def stop_and_say(executor, plan: Plan, *,
                 on_result: Callable[[int, str], None] = lambda worker, result: None) -> Stop:
    """`stop`, then the words worker 0's job ended with, when it was stopped just now."""
    results = stop(executor, plan, on_result=on_result)
    first = plan.workers[0]
    words = None
    if results.get(first.index) == STOPPED:
        try:
            res = executor.run(first, job_shell.progress_command(plan.paths[first.index]),
                               timeout_s=60)
        except WorkerUnreachable:
            pass
        else:
            words = last_stop_words(job_shell.parse_progress(res.stdout)[1])
    return Stop(results, words)


def ended_stopped(rows: list[dict]) -> bool:
    """Whether status rows (status) are those of a job that ended stopped: stopped on some
    worker, and on the others finished or ended because of it (aborted)."""
    return any(r["state"] == STOPPED for r in rows) and all(
        r["state"] == STOPPED or (r["state"] == JobState.EXITED.value
                                  and (r["rc"] == 0 or r["stage"] == ABORTED)) for r in rows)


def live_processes(executor, plan: Plan) -> dict[int, int]:
    """Processes of the job alive on each worker (zombies excluded)."""
    counts = on_workers(plan.workers, lambda w: int(
        executor.run(w, job_shell.live_count_command(plan.paths[w.index])).stdout.strip() or 0))
    return dict(zip((w.index for w in plan.workers), counts, strict=True))


def status(executor, plan: Plan) -> list[dict]:
    """Per worker: job state, stage, newest step, exit code and the last log line."""

    def one(worker: Worker) -> dict:
        try:
            paths = plan.paths[worker.index]
            res = executor.run(worker, job_shell.poll_command(paths, 10**9))
            progress = executor.run(worker, job_shell.progress_command(paths)).stdout
            step, last = view.step_and_last(*job_shell.parse_progress(progress))
        except WorkerUnreachable as exc:
            return {"worker": worker.label, "host": worker.host, "state": "unreachable",
                    "stage": "", "step": "", "rc": None, "last": str(exc)}
        poll = job_shell.parse_poll(res.stdout)
        if poll.state is JobState.EXITED and poll.rc == job_shell.STOPPED_RC:
            # Not a crash: the agent's last line says who stopped it, at which step and
            # checkpoint (payload.jobs.agent.stop_words).
            return {"worker": worker.label, "host": worker.host, "state": STOPPED,
                    "stage": poll.stage, "step": step, "rc": None, "last": last}
        return {"worker": worker.label, "host": worker.host, "state": poll.state.value,
                "stage": poll.stage, "step": step, "rc": poll.rc, "last": last}

    return on_workers(plan.workers, one)
