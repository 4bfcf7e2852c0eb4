"""A stop is a stop: a job that `tpuctl stop` ended is reported stopped (exit status 0), not
failed, by the launcher watching it, by `tpuctl stop` itself and by the record `tpuctl jobs`
reads. The workers here are stand-ins answering the launcher's shell commands."""

import re
from pathlib import Path
from types import SimpleNamespace

from launcher import job_control
from launcher.cli import render
from launcher.executors import Result
from launcher.records import JobRecord
from payload.jobs.agent import ABORTED, stop_line
from tests.support.launch_plans import plan

WORDS = "stopped by `tpuctl stop` at step 40 (checkpoint of step 40)"
STOPPED = (143, "train", ["step 40 loss 3.1", stop_line(WORDS)])


class EndedWorkers:
    """Workers whose jobs have ended as given, per worker (exit code, stage, log lines); a
    stop command finds them ended, unless `stopping` says it finds them running."""

    def __init__(self, ended: dict, stopping: bool = False):
        self.ended, self.stopping, self.stops = ended, stopping, []

    def run(self, worker, command, timeout_s=None, **kw):
        rc, stage, lines = self.ended[worker.index]
        if "kill -TERM" in command:
            self.stops.append(worker.index)
            return Result(0, "stopped 0\n" if self.stopping else f"ended {rc}\n", "")
        if "== tail ==" in command:  # job_shell.progress_command
            return Result(0, "== tail ==\n" + "".join(f"{ln}\n" for ln in lines), "")
        if "payload.jobs.runlock release" in command:
            return Result(0, "", "")
        offset = int(re.search(r"tail -n \+(\d+) worker\.log", command).group(1)) - 1
        return Result(0, f"exited {rc} {stage}\n" + "".join(f"{ln}\n" for ln in lines[offset:]),
                      "")


def _watch(tmp_path: Path, workers: EndedWorkers):
    the_plan = plan(2)
    book = job_control.LogBook(JobRecord(tmp_path / "job"), the_plan.workers)
    try:
        return job_control.watch(workers, the_plan, book, sink=lambda worker, line: None)
    finally:
        book.close()


def test_a_watched_job_that_was_stopped_ended_stopped_not_failed(tmp_path):
    # Worker 1 ended because its peer was stopped (aborted): part of the stop, no failure.
    workers = EndedWorkers({0: STOPPED, 1: (3, ABORTED, ["== tpuctl: stopping, ... =="])})
    outcome = _watch(tmp_path, workers)
    assert outcome.stopped and not outcome.ok and outcome.failed_worker is None
    assert outcome.reason == WORDS
    assert workers.stops == []  # nothing for the launcher to stop: it had ended


def test_a_worker_that_failed_beside_a_stop_is_still_a_failure(tmp_path):
    workers = EndedWorkers({0: STOPPED, 1: (1, "train", ["Traceback ...", "ValueError: boom"])})
    outcome = _watch(tmp_path, workers)
    assert not outcome.stopped and outcome.failed_worker == 1
    assert outcome.reason == "worker-1 failed in train (exit 1)"


def test_the_stopped_job_exits_0_and_says_how_to_continue(tmp_path, capsys):
    job = SimpleNamespace(plan=plan(2), provider=SimpleNamespace(billing=lambda: None))
    outcome = job_control.Outcome(ok=False, stopped=True, reason=WORDS)
    render.report(outcome, job, Path("run.yaml"))  # no typer.Exit(1)
    out = capsys.readouterr().out
    assert out.strip() == (f"job unit-1: {WORDS}; `tpuctl train -c run.yaml --resume` "
                           "continues from it")


def test_stop_names_the_checkpoint_resume_takes(tmp_path):
    the_plan = plan(2)
    stopped = job_control.stop_and_say(EndedWorkers({0: STOPPED, 1: STOPPED}, stopping=True),
                                       the_plan)
    assert stopped.stopped and not stopped.already_ended and stopped.words == WORDS
    assert render.stopped_line("unit-1", stopped.words, Path("run.yaml"), everywhere=True) == (
        f"job unit-1 stopped on every worker: {WORDS}; `tpuctl train -c run.yaml --resume` "
        "continues from it")
    # Stopped before any checkpoint: no command to continue from one.
    early = "stopped by `tpuctl stop` at step 3 (no checkpoint yet)"
    assert render.stopped_line("unit-1", early, Path("run.yaml")) == f"job unit-1: {early}"


def test_stop_on_a_job_that_had_ended_stops_nothing(tmp_path):
    ended = EndedWorkers({0: (0, "export", ["done"]), 1: (0, "train", ["done"])})
    stopped = job_control.stop_and_say(ended, plan(2))
    assert stopped.stopped and stopped.already_ended and stopped.words is None


def test_status_rows_of_a_stopped_job_read_as_stopped():
    row = {"state": job_control.STOPPED, "rc": None, "stage": "train"}
    assert job_control.ended_stopped([row, {"state": "exited", "rc": 3, "stage": ABORTED}])
    assert not job_control.ended_stopped([row, {"state": "exited", "rc": 1, "stage": "train"}])
    assert not job_control.ended_stopped([{"state": "exited", "rc": 0, "stage": "export"}] * 2)
