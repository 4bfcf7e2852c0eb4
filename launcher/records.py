"""Jobs as the launcher machine remembers them, under the state folder (TPUCTL_HOME, default
~/.tpuctl): what was planned, how its workers were reached, and a copy of every worker's log.

    record = save_job(state_dir(), plan, config_text, reach=provider.reach(fleet))
    record = current_job(state_dir(), "demo")        # the newest job of run "demo"
    record.plan(), record.reach(), record.log_file(0)
    record.save_outcome("finished", "")               # how it ended, when the launcher saw it
    [r.job_id for r in run_jobs(state_dir(), "demo")]   # every job of the run, oldest first

A record stands alone: `tpuctl logs`, `stop`, `status` and `ssh` reopen a job from it (the
provider rebuilds its connection from `reach`), never from what the config says now, so a config
edited after the job started cannot send a command to other machines.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from launcher.plan import Plan
from payload.core import layout
from payload.core.errors import UserError

PLAN = layout.JOB_PLAN
REACH = layout.JOB_REACH
CONFIG = layout.CONFIG
CURRENT = layout.CURRENT_JOB
OUTCOME = layout.JOB_OUTCOME
# The launcher process following the job to its end right now (train, logs), while it does.
WATCHER = layout.JOB_WATCHER


class NoJob(UserError):
    """The run has no job recorded on this machine."""


def state_dir() -> Path:
    path = layout.state_dir()
    if path.exists() and not path.is_dir():
        raise UserError(f"the state folder {path} (TPUCTL_HOME) is a file, not a folder",
                        hint="point TPUCTL_HOME at a folder, or move that file away")
    return path


@dataclass(frozen=True)
class JobRecord:
    """One job's folder on the launcher machine."""

    folder: Path

    @property
    def job_id(self) -> str:
        return self.folder.name

    @property
    def plan_file(self) -> Path:
        return self.folder / PLAN

    @property
    def config_file(self) -> Path:
        return self.folder / CONFIG

    def agent_file(self, worker: int) -> Path:
        return self.folder / f"agent-{worker}.json"

    def log_file(self, worker: int) -> Path:
        return self.folder / layout.LOGS_DIR / layout.worker_log(worker)

    def plan(self) -> Plan:
        try:
            return Plan.from_json(self.plan_file.read_text())
        except (KeyError, TypeError, ValueError, AttributeError):
            raise UserError(f"job {self.job_id} was recorded by another version of tpuctl and "
                            "its plan cannot be read here",
                            hint="start a new job with `tpuctl train`") from None

    @property
    def started(self) -> float:
        """When the job was recorded (its plan is written once, as it starts), epoch seconds."""
        return self.plan_file.stat().st_mtime

    def model_family(self) -> str | None:
        """The model family of the job's config, as recorded."""
        import yaml

        try:
            return (yaml.safe_load(self.config_file.read_text()) or {})["model"]["family"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save_outcome(self, state: str, detail: str) -> None:
        """How the job ended as the launcher saw it: `finished`, `failed` or `stopped`."""
        (self.folder / OUTCOME).write_text(json.dumps({"state": state, "detail": detail}))

    def outcome(self) -> dict | None:
        try:
            return json.loads((self.folder / OUTCOME).read_text())
        except (OSError, ValueError):
            return None

    @contextlib.contextmanager
    def watching(self):
        """Record this process as the one following the job (removed when it stops), so that
        `tpuctl jobs` can tell a watched job from one nobody followed to its end."""
        path = self.folder / WATCHER
        path.write_text(json.dumps(_this_process()))
        try:
            yield
        finally:
            path.unlink(missing_ok=True)

    def watcher(self) -> int | None:
        """The pid of the launcher process following the job now, if it still runs (the same
        process: a recycled pid or another host's process is not taken for it)."""
        try:
            recorded = json.loads((self.folder / WATCHER).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(recorded, dict) or not isinstance(recorded.get("pid"), int):
            return None
        pid = recorded["pid"]
        if recorded != _this_process(pid):
            return None
        return pid

    def reach(self) -> dict:
        """How the job's workers were reached: the provider's own record of them."""
        path = self.folder / REACH
        if not path.is_file():
            raise UserError(f"job {self.job_id} was started by an older tpuctl and does not "
                            "record how to reach its workers",
                            hint="start a new job with `tpuctl train`")
        return json.loads(path.read_text())


def _this_process(pid: int | None = None) -> dict | None:
    """What identifies a process of this host: its pid, the host, and its start time where the
    system says it (Linux); None when no such process runs."""
    import socket

    pid = os.getpid() if pid is None else pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists, as another user's
    try:
        # Field 22 of /proc/PID/stat, after the command name in parentheses.
        started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = None
    return {"pid": pid, "host": socket.gethostname(), "started": started}


def jobs_dir(base: Path, name: str) -> Path:
    return base / layout.JOBS_DIR / name


def save_job(base: Path, plan: Plan, config_text: str, reach: dict) -> JobRecord:
    """Write a new job's record and make it the run's current job."""
    record = JobRecord(jobs_dir(base, plan.name) / plan.job_id)
    (record.folder / layout.LOGS_DIR).mkdir(parents=True, exist_ok=True)
    record.config_file.write_text(config_text)
    for w in plan.workers:
        record.agent_file(w.index).write_text(json.dumps(plan.agent_plan(w.index)))
    (record.folder / REACH).write_text(json.dumps(reach, indent=1))
    record.plan_file.write_text(plan.to_json())
    (jobs_dir(base, plan.name) / CURRENT).write_text(plan.job_id)
    return record


def current_job(base: Path, name: str, job_id: str | None = None) -> JobRecord:
    """The job `job_id` of run `name`, or the run's newest job."""
    folder = jobs_dir(base, name)
    if job_id is None:
        pointer = folder / CURRENT
        if not pointer.is_file():
            raise NoJob(f"no job of run '{name}' started from this machine",
                            hint="start one with `tpuctl train`")
        job_id = pointer.read_text().strip()
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise UserError(f"--job {job_id!r} is not a job id", hint="ids look like NAME-YYYYMMDD-"
                        "HHMMSS-XXXX; `tpuctl jobs` lists the run's")
    record = JobRecord(folder / job_id)
    if not record.plan_file.is_file():
        raise UserError(f"no job '{job_id}' of run '{name}' on this machine")
    return record


def run_jobs(base: Path, name: str) -> list[JobRecord]:
    """Every job of run `name` recorded on this machine, oldest first."""
    folder = jobs_dir(base, name)
    found = [JobRecord(f) for f in folder.iterdir()
             if f.is_dir() and (f / PLAN).is_file()] if folder.is_dir() else []
    return sorted(found, key=lambda r: (r.started, r.job_id))
