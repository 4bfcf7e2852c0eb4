"""The job on one worker: run this worker's part of every step, meeting the others in between.

    python -m payload.jobs.agent .tpuctl/jobs/demo-20261121-010203/agent.json

The launcher starts this detached (launcher.job_shell) and only watches; the steps advance here, so
a job keeps going when the launcher's connection drops. Between steps every worker writes its
exit code under the plan's barrier folder (in output_dir, which all workers see) and waits for
the others; a failed peer ends the wait with an error. Worker 0 keeps output_dir's run lock
(payload.jobs.runlock) beating while the job runs and lets it go when the job ends, however it
ends short of SIGKILL, and ends the job if another run takes the lock over. Every worker holds
the job to train.max_hours / max_cost from its first step to its last, and its stages die
with it (PR_SET_PDEATHSIG). Before training, a worker that listens for the others checks that
its coordination port is free. Standard library only (plus payload.core.storage for gs://, and
payload's budget, progress and checkpoint readers), since it runs with whatever Python the worker
has.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from payload.core.layout import worker_label

POLL_S = 0.2
STOP_GRACE_S = 10.0
ABORT_RC = 3
ABORT_MARK = "abort"
DONE = "done"
# The stage a worker reports when it stopped because another worker failed.
ABORTED = "aborted"
# What the stop command writes into the job's folder before it signals the job: who stops it.
STOP_NOTE = "stopping"
# A job ended by its limit (train.max_hours / max_cost) reports this exit code.
LIMIT_RC = 4
# The steps that end a run properly at its limit: the training loop stops there by itself
# (checkpoint), then export and publish follow. The agent gives them this long past the limit
# before it ends them; every other step (tokenizer, prepare, a hung one) ends at the limit.
FINISHING_STEPS = ("train", "export", "publish")
FINISH_GRACE_S = 1800.0
# Secrets handed over at start on standard input (launcher.job_shell.start_command), kept in this
# process's memory only: each goes into the environment of the commands that name it.
_secrets: dict[str, str] = {}


def _storage():
    from payload.core import storage

    return storage


def _marker(barrier_dir: str, step: str, worker: int) -> str:
    return _storage().join(barrier_dir, step, worker_label(worker))


def _mark(barrier_dir: str, step: str, worker: int, rc: int | str) -> None:
    _storage().write_text(_marker(barrier_dir, step, worker), str(rc))


def _reported(barrier_dir: str, step: str, worker: int) -> str | None:
    """What a worker reported for a step ("0" for success), or None if nothing yet."""
    storage, path = _storage(), _marker(barrier_dir, step, worker)
    return storage.read_text(path).strip() if storage.exists(path) else None


class Peers:
    """What this worker knows of the others: failures they reported, and whether they live.

    Each agent bumps a counter file every few seconds; a peer whose counter has not moved for
    `stale_after_s` (by this worker's own clock, so hosts' clocks need not agree) is taken for
    dead. This is what ends a job when a host dies while no launcher is watching.
    """

    def __init__(self, barrier_dir: str, me: int, workers: list[int], stale_after_s: float,
                 lock: RunLock | None = None, limit: Limit | None = None):
        self._storage = _storage()
        self.barrier_dir = barrier_dir
        self.me = me
        self.stale_after_s = stale_after_s
        self.lock = lock
        self.limit = limit
        self.over_limit: str | None = None  # set once the limit has ended the job
        now = time.monotonic()
        self._seen = {w: ("", now) for w in workers if w != me}
        self._beats = 0

    def _alive_path(self, worker: int) -> str:
        return self._storage.join(self.barrier_dir, "alive", worker_label(worker))

    def beat(self) -> None:
        if self._beats >= 0:
            self._beats += 1
            self._storage.write_text(self._alive_path(self.me), str(self._beats))

    def finish(self) -> None:
        """This worker is done: the others must not wait for its heartbeat any more."""
        self._beats = -1
        self._storage.write_text(self._alive_path(self.me), DONE)

    def trouble(self, step: str) -> str | None:
        """Why this worker should stop: a peer failed this step, or stopped beating, or the
        run lock this worker held was taken over (another run now writes to output_dir)."""
        storage = self._storage
        if self.lock is not None and self.lock.lost:
            return self.lock.lost
        self.over_limit = self.limit.trouble() if self.limit is not None else None
        if self.over_limit:
            return self.over_limit
        for worker in self._seen:
            if _reported(self.barrier_dir, step, worker) not in (None, "0"):
                return f"{step} failed on {worker_label(worker)}"
        now = time.monotonic()
        for worker, (value, since) in self._seen.items():
            path = self._alive_path(worker)
            current = storage.read_text(path) if storage.exists(path) else ""
            if current == DONE:
                continue
            if current != value:
                self._seen[worker] = (current, now)
            elif now - since > self.stale_after_s:
                return (f"{worker_label(worker)} stopped answering (no heartbeat for "
                        f"{now - since:.0f}s)")
        return None


class Limit:
    """The run's time and cost limits (payload.cloud.budget), held over the whole job: `trouble`
    says why the step running now must end (None while within them, or with no limit)."""

    def __init__(self, spec: dict | None, output_dir: str, started: float):
        self.budget = None
        if spec:
            from payload.cloud.budget import Budget

            self.budget = Budget(output_dir=output_dir, max_hours=spec["max_hours"],
                                 max_cost=spec["max_cost"], usd_per_hour=spec["usd_per_hour"],
                                 started=started, slices=spec.get("slices", 1))
        self.step = ""

    def trouble(self) -> str | None:
        if self.budget is None:
            return None
        grace = FINISH_GRACE_S if self.step in FINISHING_STEPS else 0.0
        try:
            over = self.budget.exceeded(time.time() - grace)
        except Exception as exc:  # an unreadable billing record is not worth ending the job over
            print(f"tpuctl: cannot check the run's limits: {exc}", flush=True)
            return None
        if over and grace:
            return f"{over}, {grace / 60:.0f} min before {self.step} ended"
        return over


class RunLock:
    """Worker 0's hold on output_dir's run lock: beats with the others' heartbeat, released
    once at the end (a beat never brings a released lock back)."""

    def __init__(self, output_dir: str, job: str):
        from payload.jobs import runlock

        self._runlock = runlock
        self.output_dir = output_dir
        self.job = job
        self._guard = threading.Lock()
        self._held = True
        self.lost: str | None = None  # why the job must end, once the lock is not its own

    def beat(self) -> None:
        with self._guard:
            if self._held and not self._runlock.beat(self.output_dir, self.job):
                self._held = False
                self.lost = (f"the run lock of {self.output_dir} is not this job's any more "
                             "(another run took it over)")
                print(f"tpuctl: {self.lost}", flush=True)

    def release(self) -> None:
        with self._guard:
            if self._held:
                self._held = False
                self._runlock.release(self.output_dir, self.job)


def _keep_beating(peers: Peers, lock: RunLock | None, every_s: float) -> None:
    while True:
        for beating in (peers, lock):
            if beating is None:
                continue
            try:
                beating.beat()
            except Exception as exc:  # a missed beat is not worth ending the job over
                print(f"tpuctl: heartbeat failed: {exc}", flush=True)
        time.sleep(every_s)


def port_in_use(port: int) -> bool:
    """Whether another process listens on `port` here, on any address of either family (as
    TensorFlow's server binds it: every address, IPv4 and IPv6). gRPC binds with SO_REUSEPORT,
    so a second server on the same port would not fail by itself: it would quietly share the
    port with someone else's job. A host without IPv6 has no IPv6 listener to find."""
    probes = [(socket.AF_INET, "")]
    if socket.has_ipv6:
        probes.append((socket.AF_INET6, "::"))
    for family, anywhere in probes:
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # the family is not there (IPv6 switched off)
            continue
        with probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # this family alone: IPv4 was the probe before
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind((anywhere, port))
            except OSError as exc:
                # Taken; or, for IPv4, not bindable at all, which is as good as taken.
                if exc.errno == errno.EADDRINUSE or family == socket.AF_INET:
                    return True
    return False


def bound_to_agent(argv: list[str]) -> list[str]:
    """`argv`, run so that the kernel sends it SIGTERM when this agent dies, however it dies
    (SIGKILL, the OOM killer): a stage must never train on alone, unwatched, holding nothing
    (the run lock goes stale and the next run takes output_dir). util-linux's setpriv sets
    PR_SET_PDEATHSIG, which exec keeps; without it the stop command still finds the stage
    through the job's process group."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


def _end(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after a grace period."""
    proc.terminate()
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Service:
    """What a step runs in the background on this worker while it lasts (a pod slice's TPU
    worker server): started before the step, stopped after it; dying early fails the step."""

    def __init__(self, spec: dict | None):
        self.proc = (subprocess.Popen(bound_to_agent(spec["argv"]),
                                      env={**os.environ, **spec["env"]},
                                      stdin=subprocess.DEVNULL) if spec else None)

    def trouble(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"the step's server on this worker exited (exit {self.proc.returncode})"
        return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _end(self.proc)


def _run_stage(argv: list[str], env: dict, peers: Peers, step: str, check_s: float,
               service: Service):
    """Run a stage; stop it early if a peer fails or dies. (exit code, trouble or None)"""
    proc = subprocess.Popen(bound_to_agent(argv), env=env, stdin=subprocess.DEVNULL)
    while True:
        try:
            return proc.wait(timeout=check_s), None
        except subprocess.TimeoutExpired:
            pass
        except Stopped:
            # The whole group got SIGTERM: the stage ends first (one that has not within
            # STOP_WAIT_S is killed, as the stop command would kill it a moment later), so that
            # the agent's word on the stop is the log's last line, and the checkpoint it names
            # is the newest one there will be: what --resume takes.
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        reason = service.trouble() or peers.trouble(step)
        if reason:
            _end(proc)
            return proc.returncode, reason


def _wait_for(peers: Peers, step: str, workers: list[int], check_s: float,
              service: Service) -> str | None:
    """Block until every worker of the step reported success; else why not."""
    pending = set(workers) - {peers.me}
    while True:
        for worker in sorted(pending):
            result = _reported(peers.barrier_dir, step, worker)
            if result is not None:
                if result != "0":
                    return f"{step} failed on {worker_label(worker)}"
                pending.discard(worker)
        if not pending:
            return None
        reason = service.trouble() or peers.trouble(step)
        if reason:
            return reason
        time.sleep(check_s)


def _copy_log(log: str, log_copy: str) -> None:
    """Keep output_dir/logs/worker-N.log up to date with this worker's log."""
    try:
        storage = _storage()
        storage.write_bytes(log_copy, Path(log).read_bytes())
    except Exception as exc:  # the run matters more than its log copy
        print(f"tpuctl: could not copy the log to {log_copy}: {exc}", flush=True)


def _abort(job_dir: Path, plan: dict, step: str, reason: str, *,
           over_limit: bool = False) -> int:
    if not over_limit:  # the limit ends every worker in its own step: that one is kept
        (job_dir / "stage").write_text(ABORTED)
    # Tell the others too, so a chain of waiting workers ends at once.
    _mark(plan["barrier_dir"], step, plan["worker"], ABORT_MARK)
    print(f"== tpuctl: stopping, {reason} ==", flush=True)
    _copy_log(plan["log"], plan["log_copy"])
    return LIMIT_RC if over_limit else ABORT_RC


def _run_step(step: dict, plan: dict, job_dir: Path, peers: Peers, check_s: float,
              service: Service) -> int | None:
    """This worker's part of one step, then the wait for the others: None to go on, else the
    job's exit code."""
    name, me, barrier_dir = step["name"], plan["worker"], plan["barrier_dir"]
    command = step["command"]
    port = plan.get("coordination_port")
    if command is not None and name == "train" and port and port_in_use(port):
        print(f"== tpuctl: {worker_label(me)} cannot train: its coordination port {port} is in "
              "use on this host (another job or program listens there); run again to pick "
              "other ports ==", flush=True)
        _mark(barrier_dir, name, me, 1)
        _copy_log(plan["log"], plan["log_copy"])
        return 1
    if command is not None:
        print(f"== tpuctl: {name} on {worker_label(me)} ==", flush=True)
        _note(plan, "stage_start", stage=name)
        started = time.monotonic()
        env = {**os.environ, **command["env"],
               **{k: _secrets[k] for k in command.get("secrets", ()) if _secrets.get(k)}}
        rc, reason = _run_stage(command["argv"], env, peers, name, check_s, service)
        _note(plan, "stage_end", stage=name, rc=rc, reason=reason)
        if reason:
            return _abort(job_dir, plan, name, reason, over_limit=bool(peers.over_limit))
        _mark(barrier_dir, name, me, rc)
        if rc != 0:
            print(f"== tpuctl: {name} failed on {worker_label(me)} (exit {rc}) ==", flush=True)
            _copy_log(plan["log"], plan["log_copy"])
            return rc if rc > 0 else 128 - rc
        took = time.monotonic() - started
        print(f"== tpuctl: {name} done on {worker_label(me)} in {took:.1f}s ==", flush=True)
    reason = _wait_for(peers, name, step["workers"], check_s, service)
    _copy_log(plan["log"], plan["log_copy"])
    if reason:
        return _abort(job_dir, plan, name, reason, over_limit=bool(peers.over_limit))
    return None


_ledgers: dict = {}


def _note(plan: dict, name: str, **fields) -> None:
    """An event in the run's ledger (payload.core.ledger), from worker 0's agent only: stage
    starts and ends, the job's end, a self-delete."""
    if plan.get("worker") != 0 or not plan.get("output_dir"):
        return
    from payload.core import ledger

    key = plan.get("job_id")
    if key not in _ledgers:
        _ledgers[key] = ledger.Writer(plan["output_dir"], source=ledger.AGENT, job=key)
    _ledgers[key].note(name, **fields)


class Stopped(BaseException):
    """SIGTERM reached the agent (the stop command signals the job's whole group)."""


# How long the agent waits for a signalled stage before it speaks (the stop command waits
# longer, STOP_GRACE_S in launcher.job_shell, before SIGKILL).
STOP_WAIT_S = 3.0


def _terminated(signum, frame):
    raise Stopped()


STOP_LOG_TAIL = 4 << 20  # bytes of the log read for the step a stopped job reached


# A stopped job's last line: `== tpuctl: WORDS ==`, WORDS starting with STOPPED_BY (stop_words).
_SAYS, _SAID = "== tpuctl: ", " =="
STOPPED_BY = "stopped by "
NO_CHECKPOINT = "(no checkpoint yet)"


def stop_line(words: str) -> str:
    """The log line a stopped job ends with; `stopped_words` reads it back (the launcher)."""
    return f"{_SAYS}{words}{_SAID}"


def stopped_words(line: str) -> str | None:
    """The words of a stop line (stop_line), None for any other line.

    >>> stopped_words("== tpuctl: stopped by `tpuctl stop` at step 4 (checkpoint of step 4) ==")
    'stopped by `tpuctl stop` at step 4 (checkpoint of step 4)'
    >>> stopped_words("== tpuctl: train on worker-0 ==") is None
    True
    """
    if line.startswith(_SAYS + STOPPED_BY) and line.endswith(_SAID):
        return line[len(_SAYS):-len(_SAID)]
    return None


def names_checkpoint(words: str) -> bool:
    """Whether a stopped job's words (stop_words) name a checkpoint for `--resume` to take.

    >>> names_checkpoint("stopped by `tpuctl stop` at step 9 (checkpoint of step 8)")
    True
    >>> names_checkpoint("stopped by `tpuctl stop` at step 2 (no checkpoint yet)")
    False
    >>> names_checkpoint("stopped by the launcher (worker-1 failed) during prepare")
    False
    """
    return words.endswith(")") and not words.endswith(NO_CHECKPOINT)


def stop_words(job_dir: Path, plan: dict, stage: str) -> str:
    """What a stopped job says last: who stopped it (the stop command's note), and in training
    at which step (the newest progress record in this worker's log: worker 0 has them) and from
    which checkpoint it resumes."""
    from payload.training import progress

    note = job_dir / STOP_NOTE
    who = note.read_text().strip() if note.is_file() else ""
    words = f"{STOPPED_BY}{who or 'SIGTERM'}"
    if stage != "train":
        return f"{words} during {stage or 'start'}"
    step = None
    try:
        with open(plan["log"], "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - STOP_LOG_TAIL))  # the newest records
            for raw in log:
                record = progress.parse(raw.decode("utf-8", "replace").rstrip("\n"))
                if record and record.get("kind") in ("start", "train") and "step" in record:
                    step = record["step"]
    except OSError:
        pass
    words += f" at step {step}" if step is not None else " during train"
    try:
        from payload.core.engines import newest_checkpoint

        newest = newest_checkpoint(plan["output_dir"])
    except Exception:  # a stop must not fail over a checkpoint it cannot read
        newest = None
    if newest is None:
        return f"{words} {NO_CHECKPOINT}"
    spec, saved = newest
    return words + f" ({spec.checkpoint_words(saved)})"


def run(plan_path: str) -> int:
    plan = json.loads(Path(plan_path).read_text())
    if plan.get("secrets_on_stdin"):
        _secrets.update(json.loads(sys.stdin.readline() or "{}"))
    # `tpuctl stop` sends SIGTERM to the whole group: end through `finally`, lock released.
    signal.signal(signal.SIGTERM, _terminated)
    lock = RunLock(plan["output_dir"], plan["job_id"]) if plan.get("holds_run_lock") else None
    job_dir = Path(plan_path).parent
    rc = None
    try:
        rc = _walk(plan, job_dir, lock)
        return rc
    except Stopped:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough: say so, then end
        stage_file = job_dir / "stage"  # left as it is: the stage the job was stopped in
        stage = stage_file.read_text().strip() if stage_file.is_file() else ""
        print(stop_line(stop_words(job_dir, plan, stage)), flush=True)
        _copy_log(plan["log"], plan["log_copy"])
        rc = 128 + signal.SIGTERM
        return rc
    finally:
        _note(plan, "agent_end", rc=rc)
        if lock is not None:
            try:
                lock.release()
            except Exception as exc:  # it stops beating: it goes stale, then is taken over
                print(f"tpuctl: could not release the run lock: {exc}", flush=True)
        if plan.get("delete_when_done"):
            _delete_own_tpu(plan)


def _delete_own_tpu(plan: dict) -> None:
    """`train --down`: the job ended (done, failed, stopped or at a limit), so worker 0 deletes
    its TPU itself, whether or not a launcher is still watching."""
    from payload.cloud import self_delete

    try:
        print(f"== tpuctl: {self_delete.delete_own(plan['delete_when_done'])} ==", flush=True)
        _note(plan, "torn_down", by="train --down")
    except Exception as exc:  # the launcher's `down` (or the user's) is the fallback
        # Loud: nobody may be watching, and the TPU bills until someone runs `tpuctl down`.
        print(f"== tpuctl: THE TPU IS STILL UP AND BILLING: its self-delete failed ({exc}); "
              "run `tpuctl down` ==", flush=True)
    _copy_log(plan["log"], plan["log_copy"])


def _walk(plan: dict, job_dir: Path, lock: RunLock | None) -> int:
    me = plan["worker"]
    barrier_dir = plan["barrier_dir"]
    check_s = 2.0 if _storage().is_gcs(barrier_dir) else POLL_S
    from payload.cloud.budget import JOB_STARTED_ENV

    started = time.time()
    # Every stage counts the limits from the job's start too (the training loop's own stop).
    os.environ[JOB_STARTED_ENV] = repr(started)
    from payload.core.ledger import JOB_ENV

    os.environ[JOB_ENV] = plan.get("job_id") or ""  # the job the chief's ledger events belong to
    limit = Limit(plan.get("limits"), plan["output_dir"], started)
    peers = Peers(barrier_dir, me, plan["all_workers"], plan["stale_after_s"], lock, limit)
    threading.Thread(target=_keep_beating, args=(peers, lock, plan["heartbeat_s"]),
                     daemon=True).start()
    for step in plan["steps"]:
        name = step["name"]
        (job_dir / "stage").write_text(name)
        limit.step = name
        over = limit.trouble()  # set-up or the step before may have used it all
        if over:
            return _abort(job_dir, plan, name, over, over_limit=True)
        service = Service(step.get("service"))
        try:
            rc = _run_step(step, plan, job_dir, peers, check_s, service)
        finally:
            service.stop()
        if rc is not None:
            return rc
    (job_dir / "stage").write_text(DONE)
    peers.finish()
    print(f"== tpuctl: {worker_label(me)} finished ==", flush=True)
    _copy_log(plan["log"], plan["log_copy"])
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))
