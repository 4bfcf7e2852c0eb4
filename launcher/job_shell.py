"""The detached job on a worker, as shell commands: start, poll, stop, count what is left.

    paths = plan.paths[worker.index]                  # each worker's own job folder
    executor.run(worker, start_command(paths, plan.environment.python))
    poll = parse_poll(executor.run(worker, poll_command(paths, offset)).stdout)
    poll.state, poll.rc, poll.lines, poll.stage

A job is the agent (payload.jobs.agent) started with `setsid -f` in its own session and process group
(forked off, so the starting shell never waits for it), stdin from /dev/null and output appended
to a log file, so it outlives the SSH connection (or the laptop) that started it. Its group id,
with what identifies it (payload.jobs.groups), goes to a pid file and its exit code to an rc file.
Closing an SSH channel does not stop a remote process, and the SSH signal request is refused
for root, so `stop_command` signals the recorded process group itself, after checking that it
is still the job's, and never once the job has ended (an exit code and no live process). The
commands are plain strings for `sh`: the same ones run on local workers and over SSH.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from enum import Enum

from launcher.plan import HUB_TOKEN_ENV, JobPaths
from payload.jobs.agent import STOP_NOTE
from payload.jobs.groups import FUNCTIONS, load_group, record_group
from payload.training import progress

POLL_MAX_LINES = 2000
STOPPED_RC = 143  # what a job stopped by `tpuctl stop` (SIGTERM) reports


class JobState(str, Enum):
    NONE = "none"  # never started on this worker
    RUNNING = "running"
    EXITED = "exited"  # finished; see rc
    GONE = "gone"  # its processes vanished without an exit code (SIGKILL, reboot)


@dataclass(frozen=True)
class Poll:
    state: JobState
    rc: int | None
    lines: tuple[str, ...]  # complete new log lines
    partial: str  # an unfinished last line (only delivered once the job ended)
    stage: str


def _q(path: str) -> str:
    return shlex.quote(path)


# The starting shell's variable holding the job's secrets (JSON) when it has any: set by the
# executor (`run(..., secret_env=...)`: in the local process's environment, or as a shell
# assignment inside the script SSH sends on its encrypted channel), never in an argument or a
# file. The shell hands the value to the agent on a pipe and starts it without the variable.
SECRETS_ENV = "TPUCTL_SECRETS"
# Every variable huggingface_hub reads a token from (HF_TOKEN, then the older name).
HUB_TOKEN_NAMES = (HUB_TOKEN_ENV, "HUGGING_FACE_HUB_TOKEN")


def start_command(paths: JobPaths, python: str, *, secrets: bool = False) -> str:
    """Start the agent detached; prints its process group id once it is recorded. With
    `secrets`, the agent's standard input is a pipe carrying $TPUCTL_SECRETS (printf is a shell
    builtin: the value is in no process's arguments), and the agent's environment lacks it."""
    agent = shlex.join(["env", f"PYTHONPATH={paths.payload_dir}", "PYTHONUNBUFFERED=1", python,
                        "-m", "payload.jobs.agent", paths.agent_plan])
    rc_tmp = paths.rc + ".tmp"
    inner = (f"{record_group(paths.pid, paths.job_dir)}; {agent}; "
             f"echo $? > {_q(rc_tmp)} && mv {_q(rc_tmp)} {_q(paths.rc)}")
    # A Hub token in the starting environment (a local worker inherits the user's) stays out
    # of the job: the publish step alone gets it, as a secret, from the agent's memory.
    unset = " ".join(f"-u {name}" for name in (SECRETS_ENV, *HUB_TOKEN_NAMES))
    detach = f"env {unset} nohup setsid -f sh -c {_q(inner)} < /dev/null >> {_q(paths.log)} 2>&1"
    if secrets:
        detach = (f'printf "%s\\n" "${SECRETS_ENV}" | env {unset} nohup setsid -f sh -c '
                  f"{_q(inner)} >> {_q(paths.log)} 2>&1")
    return (
        f"rm -f {_q(paths.pid)} {_q(paths.rc)} && "
        f"{{ {detach}; }} && {'unset ' + SECRETS_ENV + '; ' if secrets else ''}"
        f"i=0; while [ ! -s {_q(paths.pid)} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
        f"cut -d' ' -f1 {_q(paths.pid)}"
    )


def poll_command(paths: JobPaths, line_offset: int, max_lines: int = POLL_MAX_LINES) -> str:
    """First line `STATE RC STAGE`, then up to max_lines log lines after line_offset. A job is
    running while its recorded group, identity checked, has live processes, whatever its rc
    file says: a stage whose agent was killed (the shell then records the agent's exit code)
    still runs until it ends."""
    return (
        f"cd {_q(paths.job_dir)} 2>/dev/null || {{ echo none - -; exit 0; }}; "
        f'if [ -s pid ] && {{ {load_group("pid")}{FUNCTIONS}[ "$(live)" -gt 0 ]; }}; then '
        'state="running -"; '
        # No process left: the job's shell wrote rc before it ended, if it got that far.
        'elif [ -s rc ]; then state="exited $(cat rc)"; '
        'elif [ -s pid ]; then state="gone -"; else state="none -"; fi; '
        # Read after the state: the agent writes its last stage (aborted) before it exits.
        'stage=$(cat stage 2>/dev/null | head -c 40); [ -n "$stage" ] || stage=-; '
        'echo "$state $stage"; '
        f"tail -n +{line_offset + 1} worker.log 2>/dev/null | head -n {max_lines}"
    )


def parse_poll(output: str) -> Poll:
    header, _, body = output.partition("\n")
    words = header.split()
    state = JobState(words[0]) if words and words[0] in JobState._value2member_map_ else (
        JobState.NONE)
    rc = int(words[1]) if len(words) > 1 and words[1].lstrip("-").isdigit() else None
    stage = words[2] if len(words) > 2 and words[2] != "-" else ""
    parts = body.split("\n")
    complete, partial = parts[:-1], parts[-1]
    return Poll(state=state, rc=rc, lines=tuple(complete), partial=partial, stage=stage)


STOP_GRACE_S = 5.0
BY_USER = "`tpuctl stop`"


def stop_command(paths: JobPaths, grace_s: float = STOP_GRACE_S, *, who: str = BY_USER) -> str:
    """SIGTERM the job's process group, SIGKILL what is left after grace_s; prints `stopped N`
    (N = processes still alive afterwards, 0 when all are gone), or `ended RC` for a job that
    has an exit code and no live process. A job with an exit code whose processes live on (its
    agent was killed, its stage was not) is stopped like a running one. A recorded group that
    is not the job's any more (its id taken by another process) is never signalled. `who`
    stops it: written beside the job first, so that the agent's last line names it."""
    tries = max(1, int(grace_s / 0.1))
    rc = _q(paths.rc)
    note = posixpath.join(paths.job_dir, STOP_NOTE)
    return (
        load_group(paths.pid) + FUNCTIONS
        + f'if [ -s {rc} ] && [ "$(live)" -eq 0 ]; then echo "ended $(cat {rc})"; exit 0; fi; '
        'ours || { echo "stopped 0"; exit 0; }; '
        f"printf '%s\\n' {_q(who)} > {_q(note + '.tmp')} && mv {_q(note + '.tmp')} {_q(note)}; "
        'kill -TERM -"$pg" 2>/dev/null; '
        f'i=0; while [ "$(live)" -gt 0 ] && [ $i -lt {tries} ]; do sleep 0.1; i=$((i+1)); done; '
        'if [ "$(live)" -gt 0 ] && ours; then kill -KILL -"$pg" 2>/dev/null; i=0; '
        'while [ "$(live)" -gt 0 ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done; fi; '
        f"[ -s {rc} ] || echo {STOPPED_RC} > {rc}; "
        'echo "stopped $(live)"'
    )


def live_count_command(paths: JobPaths) -> str:
    """How many processes of the job's group are alive (zombies excluded)."""
    return load_group(paths.pid) + FUNCTIONS + "live"


PROGRESS_RECORDS = 20
TAIL_LINES = 40
_TAIL_MARK = "== tail =="


def progress_command(paths: JobPaths) -> str:
    """The log's newest progress records (payload.training.progress), then its last lines."""
    log = _q(paths.log)
    return (f"grep -a {_q('^' + progress.PREFIX)} {log} 2>/dev/null | tail -n {PROGRESS_RECORDS}; "
            f"echo {_q(_TAIL_MARK)}; tail -n {TAIL_LINES} {log} 2>/dev/null")


def parse_progress(output: str) -> tuple[list[dict], list[str]]:
    """(progress records, last lines) from progress_command's output."""
    head, _, tail = output.partition(_TAIL_MARK + "\n")
    found = [progress.parse(line) for line in head.splitlines()]
    return [r for r in found if r is not None], tail.splitlines()
