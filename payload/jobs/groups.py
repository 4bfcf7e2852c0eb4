"""Shell that records a job's process group with its identity, and recognises the group later.

    inner = f"{record_group(paths.pid, paths.job_dir)}; {agent}"   # in the job's new session
    check = load_group(paths.pid) + FUNCTIONS + 'ours && kill -TERM -"$pg"'   # later, anywhere

A process group id is only a number: once the group is gone, the kernel gives it to the next
process that asks, an unrelated one included. So the pid file keeps, with the group id, the
leader's start time (field 22 of /proc/PID/stat, clock ticks after boot), the boot id and the
job's tag, and a recorded group is the job's only if the machine has not rebooted since and the
process with that id started at that time. When the leader is gone but members live on (the id
stays taken while they do), a member is the job's if it carries the tag in its environment
(TPUCTL_JOB, which everything the job starts inherits). Plain POSIX sh and /proc: the same on
every Linux worker.
"""

from __future__ import annotations

import shlex

BOOT_ID = "/proc/sys/kernel/random/boot_id"
TAG_ENV = "TPUCTL_JOB"

# `started PID`: the start time of a process; the name (field 2) may hold spaces and brackets,
# so cut after its closing bracket, where field 3 begins.
# `ours`: whether $pg (with $start, $boot, $tag from load_group) is still the recorded group.
# `live`: how many of its processes are alive (zombies excluded: PID 1 may reap them late).
# Their own variables start with _g: a function's variables are the caller's in sh.
FUNCTIONS = (
    'started() { sed "s/.*) //" "/proc/$1/stat" 2>/dev/null | cut -d" " -f20; }; '
    f'tagged() {{ tr "\\000" "\\n" < "/proc/$1/environ" 2>/dev/null | '
    f'grep -qxF "{TAG_ENV}=$tag"; }}; '
    'ours() { [ -n "$pg" ] && [ -n "$tag" ] && '
    f'[ "$(cat {BOOT_ID} 2>/dev/null)" = "$boot" ] || return 1; '
    'if [ -e "/proc/$pg" ]; then [ "$(started "$pg")" = "$start" ]; return; fi; '
    'for _gp in $(pgrep -g "$pg" 2>/dev/null); do tagged "$_gp" && return 0; done; return 1; }; '
    'live() { _gn=0; if ours; then for _gp in $(pgrep -g "$pg" 2>/dev/null); do '
    '_gs=$(sed "s/.*) //" "/proc/$_gp/stat" 2>/dev/null | cut -d" " -f1); '
    '[ -n "$_gs" ] && [ "$_gs" != Z ] && _gn=$((_gn+1)); done; fi; echo $_gn; }; '
)


def record_group(pid_file: str, tag: str) -> str:
    """Shell for the job's session leader: tag the environment, then write `PGID START BOOT
    TAG` to pid_file (whole, by rename)."""
    pid, tmp = shlex.quote(pid_file), shlex.quote(pid_file + ".tmp")
    return (f"{FUNCTIONS}tag={shlex.quote(tag)}; export {TAG_ENV}=\"$tag\"; "
            f'echo "$$ $(started $$) $(cat {BOOT_ID}) $tag" > {tmp} && mv {tmp} {pid}')


def load_group(pid_file: str, *, word: str | None = None) -> str:
    """Shell that reads a pid file into $pg $start $boot $tag ($pg empty when there is none);
    `word` names the file with a shell word instead (such as "$f" in a loop)."""
    pid = word or shlex.quote(pid_file)
    return (f"pg= start= boot= tag=; [ -r {pid} ] && read pg start boot tag < {pid}; "
            'case "$pg" in *[!0-9]*) pg=;; esac; ')
