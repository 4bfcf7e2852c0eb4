"""The detached job on a worker, as shell commands: start, poll, stop, count what is left.

    executor.run(worker, start_command(plan.paths, plan.environment.python))
    poll = parse_poll(executor.run(worker, poll_command(plan.paths, offset)).stdout)
    poll.state, poll.rc, poll.lines, poll.stage

A job is the agent (launcher.agent) started with `setsid -f` in its own session and process group
(forked off, so the starting shell never waits for it), stdin from /dev/null and output appended
to a log file, so it outlives the SSH connection (or the laptop) that started it. Its group id
goes to a pid file and its exit code to an rc file. Closing an SSH channel does not stop a
remote process, and the SSH signal request is refused for root, so `stop_command` signals the
recorded process group itself. The commands are plain strings for `sh`: the same ones run on
local workers and over SSH.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from enum import Enum

from launcher.plan import JobPaths

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


def start_command(paths: JobPaths, python: str) -> str:
    """Start the agent detached; prints its process group id once it is recorded."""
    agent = shlex.join(["env", f"PYTHONPATH={paths.payload_dir}", "PYTHONUNBUFFERED=1", python,
                        "-m", "launcher.agent", paths.agent_plan])
    rc_tmp = paths.rc + ".tmp"
    inner = (f"echo $$ > {_q(paths.pid)}; {agent}; "
             f"echo $? > {_q(rc_tmp)} && mv {_q(rc_tmp)} {_q(paths.rc)}")
    return (
        f"rm -f {_q(paths.pid)} {_q(paths.rc)} && "
        f"{{ nohup setsid -f sh -c {_q(inner)} < /dev/null >> {_q(paths.log)} 2>&1; }} && "
        f"i=0; while [ ! -s {_q(paths.pid)} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
        f"cat {_q(paths.pid)}"
    )


# Members of process group $pg that are not zombies: PID 1 here reaps orphans late, so a
# killed process can linger as a zombie that holds nothing.
_LIVE_MEMBERS = (
    'live() { n=0; for p in $(pgrep -g "$pg" 2>/dev/null); do '
    's=$(sed "s/.*) //" /proc/$p/stat 2>/dev/null | cut -d" " -f1); '
    '[ -n "$s" ] && [ "$s" != Z ] && n=$((n+1)); done; echo $n; }; '
)


def poll_command(paths: JobPaths, line_offset: int, max_lines: int = POLL_MAX_LINES) -> str:
    """First line `STATE RC STAGE`, then up to max_lines log lines after line_offset."""
    return (
        f"cd {_q(paths.job_dir)} 2>/dev/null || {{ echo none - -; exit 0; }}; "
        'stage=$(cat stage 2>/dev/null | head -c 40); [ -n "$stage" ] || stage=-; '
        'if [ -s rc ]; then echo "exited $(cat rc) $stage"; '
        'elif [ -s pid ] && pg=$(cat pid) && '
        f'{{ {_LIVE_MEMBERS}[ "$(live)" -gt 0 ]; }}; then echo "running - $stage"; '
        # The job may have finished between the first look at rc and counting its processes.
        'elif [ -s rc ]; then echo "exited $(cat rc) $stage"; '
        'elif [ -s pid ]; then echo "gone - $stage"; else echo "none - $stage"; fi; '
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


def _job_group(paths: JobPaths, no_job: str) -> str:
    """Shell that reads the job's process group into $pg and defines `live`; prints `no_job`
    and exits when the job has no recorded group."""
    return (f"pg=$(cat {_q(paths.pid)} 2>/dev/null); "
            f'case "$pg" in ""|*[!0-9]*) echo {_q(no_job)}; exit 0;; esac; '
            f"{_LIVE_MEMBERS}")


def stop_command(paths: JobPaths, grace_s: float = 5.0) -> str:
    """SIGTERM the job's process group, SIGKILL what is left after grace_s; prints `stopped N`
    (N = processes still alive afterwards, 0 when all are gone)."""
    tries = max(1, int(grace_s / 0.1))
    return (
        _job_group(paths, "stopped 0")
        + 'kill -TERM -"$pg" 2>/dev/null; '
        f'i=0; while [ "$(live)" -gt 0 ] && [ $i -lt {tries} ]; do sleep 0.1; i=$((i+1)); done; '
        'if [ "$(live)" -gt 0 ]; then kill -KILL -"$pg" 2>/dev/null; i=0; '
        'while [ "$(live)" -gt 0 ] && [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done; fi; '
        f"[ -s {_q(paths.rc)} ] || echo {STOPPED_RC} > {_q(paths.rc)}; "
        'echo "stopped $(live)"'
    )


def live_count_command(paths: JobPaths) -> str:
    """How many processes of the job's group are alive (zombies excluded)."""
    return _job_group(paths, "0") + "live"


def progress_command(paths: JobPaths) -> str:
    """`step=N` (the newest training step the log mentions, or empty), then the last line."""
    log = _q(paths.log)
    return (f"printf 'step=%s\\n' \"$(grep -oE 'step[ =:]+[0-9]+' {log} 2>/dev/null | tail -n 1 | "
            f"grep -oE '[0-9]+$')\"; tail -n 1 {log} 2>/dev/null")


def parse_progress(output: str) -> tuple[str, str]:
    """(step, last line) from progress_command's output."""
    first, _, last = output.partition("\n")
    return first.removeprefix("step=").strip(), last.strip()
