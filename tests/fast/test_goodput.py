"""The goodput ledger's arithmetic on crafted ledgers: the buckets add up to the wall time and the
billing, whatever a killed writer, a skewed host clock or a lost end event left behind; and
`tpuctl goodput` prints it (payload.core.ledger, payload.cloud.goodput, launcher.goodput)."""

from __future__ import annotations

import json
import random

import pytest

from payload.cloud import goodput
from payload.core import ledger
from tests.support.configs import tiny_config
from tests.support.runners import assert_user_error, tpuctl

RATE = 3.6  # USD per node-hour: a dollar per 1000 s


def _e(t, name, source="launcher", job="j1", **fields) -> dict:
    host = "launcher-host" if source == "launcher" else "worker-host"
    return {"t": float(t), "event": name, "source": source, "job": job, "host": host,
            "slice": 0, **fields}


def preempted_run() -> tuple[list[dict], list[dict]]:
    """A queued gcp run preempted at step 22 after a checkpoint of step 10, recreated, resumed
    and torn down; and its billing record's nodes."""
    events = [
        _e(0, "requested", job=None), _e(5, "queued", job=None),
        _e(50, "capacity_granted", job=None), _e(80, "vms_up", job=None),
        _e(100, "setup_started"), _e(130, "environment_installed"), _e(140, "job_started"),
        _e(141, "stage_start", "agent", stage="train"), _e(150, "devices_ready", "chief"),
        _e(155, "compile_start", "chief", step=0), _e(175, "compile_end", "chief", step=1),
        _e(176, "step", "chief", step=1), _e(200, "step", "chief", step=10),
        _e(200.5, "checkpoint_save_start", "chief", step=10),
        _e(205, "checkpoint_save_end", "chief", step=10),
        _e(230, "step", "chief", step=20),
        _e(240, "preempted", reason="TPU tpurun is PREEMPTED", lost_at_step=22),
        _e(300, "recreated", new_job="j2", lost_at_step=22, resumed_from_step=10),
        _e(310, "setup_started", job="j2"), _e(320, "job_started", job="j2"),
        _e(321, "stage_start", "agent", job="j2", stage="train"),
        _e(330, "restore_start", "chief", job="j2"), _e(335, "restore_end", "chief", job="j2"),
        _e(336, "compile_start", "chief", job="j2"), _e(340, "compile_end", "chief", job="j2"),
        _e(341, "step", "chief", job="j2", step=11), _e(350, "eval_start", "chief", job="j2"),
        _e(360, "eval_end", "chief", job="j2"), _e(400, "step", "chief", job="j2", step=40),
        _e(400.5, "train_end", "chief", job="j2"),
        _e(401, "stage_end", "agent", job="j2", stage="train"),
        _e(402, "agent_end", "agent", job="j2"), _e(405, "job_ended", job="j2"),
        _e(500, "torn_down", job=None),
    ]
    nodes = [{"uid": "1", "created": 50.0, "deleted": 245.0},
             {"uid": "2", "created": 290.0, "deleted": 498.0}]
    return events, nodes


def _seconds(report) -> dict:
    return {name: b["seconds"] for name, b in report["buckets"].items()}


def _adds_up(report, nodes=None) -> None:
    total = sum(b["seconds"] for b in report["buckets"].values())
    assert total == pytest.approx(report["wall_s"], rel=0.01)
    if nodes:
        billed = sum(n["deleted"] - n["created"] for n in nodes) * RATE / 3600
        assert sum(b["dollars"] for b in report["buckets"].values()) == pytest.approx(
            billed, rel=0.01)
        assert report["billed"]["dollars"] == pytest.approx(billed, rel=0.01)


def test_a_preempted_run_is_bucketed_to_the_second_and_the_cent():
    events, nodes = preempted_run()
    report = goodput.account(events, nodes=nodes, usd_per_hour=RATE, chips=4)
    _adds_up(report, nodes)
    seconds = _seconds(report)
    assert seconds["queueing"] == 45 and report["buckets"]["queueing"]["dollars"] == 0
    assert seconds["provisioning"] == 35 and seconds["idle"] == 20
    assert seconds["compile"] == 20 + 4 and seconds["checkpoint_save"] == 4.5
    assert seconds["checkpoint_restore"] == 5 and seconds["evaluation"] == 10
    # Steps 11..22 of the first job were lost: from the checkpoint's end to the preemption.
    assert seconds["wasted_progress_from_disruption"] == 35
    assert seconds["infrastructure_recovery_from_disruption"] == 80
    assert seconds["productive"] == (200.5 - 175) + (350 - 340) + (400.5 - 360)
    # After the last job: the slice bills until its node is deleted, not until the ledger ends.
    assert seconds["idle_before_teardown"] == 498 - 402
    [hit] = report["disruptions"]
    assert (hit["lost_at_step"], hit["resumed_from_step"], hit["steps_redone"]) == (22, 10, 12)
    assert hit["wasted_s"] == 35 and hit["wasted_dollars"] == pytest.approx(35 * RATE / 3600)
    assert hit["recovery_s"] == 341 - 240
    billed_s = 195 + 208
    assert report["goodput_of"] == "billed chip-hours"
    assert report["goodput"] == pytest.approx(seconds["productive"] / billed_s, abs=1e-4)
    assert report["billed"]["chip_hours"] == pytest.approx(billed_s / 3600 * 4, rel=1e-4)


def test_events_out_of_order_give_the_same_report():
    events, nodes = preempted_run()
    shuffled = events[:]
    random.Random(7).shuffle(shuffled)
    assert goodput.account(shuffled, nodes=nodes, usd_per_hour=RATE) == goodput.account(
        events, nodes=nodes, usd_per_hour=RATE)


@pytest.mark.parametrize("skew", [-1000.0, 1000.0])
def test_a_worker_clock_off_by_minutes_is_lined_up_with_the_launchers(skew):
    events, nodes = preempted_run()
    skewed = [{**e, "t": e["t"] + skew} if e["source"] != "launcher" else e for e in events]
    straight = goodput.account(events, nodes=nodes, usd_per_hour=RATE)
    report = goodput.account(skewed, nodes=nodes, usd_per_hour=RATE)
    _adds_up(report, nodes)
    assert report["skew_s"], report
    # Lined up on each job's bounds as the launcher saw them: no worker event outside its job,
    # and every bucket within the launcher's lag behind the workers (10 s to notice the
    # preemption, 3 s the end) of the true timeline, where it was minutes off before.
    lined = goodput.aligned(skewed)
    for job, first, last in (("j1", 140, 240), ("j2", 320, 405)):
        times = [e["t"] for e in lined if e["job"] == job and e["source"] != "launcher"]
        assert first <= min(times) and max(times) <= last, job
    for name, seconds in _seconds(straight).items():
        assert _seconds(report)[name] == pytest.approx(seconds, abs=13), name
    assert report["disruptions"][0]["steps_redone"] == 12


def test_a_missing_end_event_runs_its_bucket_until_the_next_event():
    """A checkpoint being saved when the machines went: no end event, the save lasts until the
    preemption, and no training after it is counted as productive."""
    events, nodes = preempted_run()
    cut = [*events, _e(232, "checkpoint_save_start", "chief", step=20)]
    report = goodput.account(cut, nodes=nodes, usd_per_hour=RATE)
    _adds_up(report, nodes)
    seconds = _seconds(report)
    assert seconds["checkpoint_save"] == pytest.approx((240 - 232) + (205 - 200.5))
    assert seconds["wasted_progress_from_disruption"] == 232 - 205
    # The new job's first evaluation ends where it began, not in the save left open before.
    assert seconds["evaluation"] == 10


def test_a_truncated_last_line_from_a_killed_writer_is_skipped(tmp_path):
    out = str(tmp_path / "out")
    pen = ledger.Writer(out, source=ledger.CHIEF, job="j1")
    pen.note("devices_ready")
    pen.note("step", step=1)
    path = tmp_path / "out" / ".tpuctl" / "ledger" / "chief.jsonl"
    with open(path, "a") as f:
        f.write('{"t": 12.5, "event": "step", "sou')  # the writer died here
    found = ledger.read(out)
    assert [e["event"] for e in found] == ["devices_ready", "step"]
    pen.note("step", step=2)  # a later writer appends after the torn line: it is read
    assert [e.get("step") for e in ledger.read(out)] == [None, 1, 2]


def test_a_ledger_that_cannot_be_written_never_ends_the_run(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    pen = ledger.Writer(str(blocker), source=ledger.CHIEF)
    pen.note("step", step=1)
    pen.note("step", step=2)
    assert capsys.readouterr().err.count("cannot write the run's ledger") == 1
    assert len(pen.events) == 2


def test_a_local_run_has_no_dollars_and_no_idle_after_its_job():
    events = [_e(0, "setup_started"), _e(3, "environment_installed"), _e(4, "job_started"),
              _e(5, "stage_start", "agent", stage="tokenizer"),
              _e(7, "stage_end", "agent", stage="tokenizer"),
              _e(7.5, "stage_start", "agent", stage="train"), _e(9, "devices_ready", "chief"),
              _e(10, "compile_start", "chief"), _e(14, "compile_end", "chief"),
              _e(14, "step", "chief", step=1), _e(20, "step", "chief", step=4),
              _e(20, "checkpoint_save_start", "chief"), _e(21, "checkpoint_save_end", "chief"),
              _e(21.5, "train_end", "chief"), _e(22, "stage_end", "agent", stage="train"),
              _e(23, "agent_end", "agent"), _e(24, "job_ended"),
              _e(90, "setup_started", job="j2")]  # the next job, an hour of nothing later
    report = goodput.account(events[:-1])
    _adds_up(report)
    assert report["wall_s"] == 23 and report["billed"] is None
    assert all(b["dollars"] is None for b in report["buckets"].values())
    assert _seconds(report)["data_preparation"] == 2
    assert report["goodput_of"] == "wall time"
    later = goodput.account(events)
    assert later["wall_s"] == 23  # the hour between the jobs existed for nobody


def test_an_empty_ledger_is_an_empty_report():
    report = goodput.account([])
    assert report["wall_s"] == 0 and set(report["buckets"]) == set(goodput.BUCKETS)


def test_the_goodput_command_prints_one_json_object(tmp_path):
    out = tmp_path / "out"
    config = tiny_config(tmp_path / "run", output_dir=str(out),
                         cluster={"provider": "local", "workers": 2})
    events, _ = preempted_run()
    ledger.append(str(out), [e for e in events if e["source"] == "launcher"])
    ledger.append(str(out), [e for e in events if e["source"] == "chief"])
    ledger.append(str(out), [e for e in events if e["source"] == "agent"])
    result = tpuctl("goodput", "-c", config, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["run"] == "t" and report["price"] is None
    _adds_up(report)
    assert report["buckets"]["compile"] == {"seconds": 24.0, "dollars": None}
    text = tpuctl("goodput", "-c", config)
    assert text.returncode == 0 and text.stdout.startswith("goodput: ")
    assert "preempted at step 22: 12 steps redone from the checkpoint of step 10" in text.stdout


def test_goodput_without_a_ledger_is_one_line(tmp_path):
    config = tiny_config(tmp_path / "run", output_dir=str(tmp_path / "out"),
                         cluster={"provider": "local", "workers": 2})
    assert_user_error(tpuctl("goodput", "-c", config), "no ledger of run t")
    assert not (tmp_path / "out").exists()


def test_input_waits_are_data_loading_not_productive():
    """Each step event's input_wait_s (seconds waited for batches since the job's previous step
    event or the compile's end) moves that much of the productive time between them to
    data_loading, never more than there was, and never time of an evaluation between them."""
    events, nodes = preempted_run()
    waits = {(None, 1): 0.5, (None, 10): 4.0, (None, 20): 99.0, ("j2", 40): 6.0}
    waited = [{**e, "input_wait_s": waits[(None if e["job"] == "j1" else e["job"], e["step"])]}
              if e["event"] == "step" and e["source"] == "chief" and
              (None if e["job"] == "j1" else e["job"], e["step"]) in waits else e
              for e in events]
    report = goodput.account(waited, nodes=nodes, usd_per_hour=RATE, chips=4)
    _adds_up(report, nodes)
    seconds, before = _seconds(report), _seconds(goodput.account(events, nodes=nodes,
                                                                 usd_per_hour=RATE))
    # Between the step events 10 and 20 were 25.5 s of productive time (the save between them
    # is not): 99 s of waiting is capped there, the latest first (205..230, then 200..200.5).
    assert seconds["data_loading"] == 0.5 + 4 + 25.5 + 6
    assert seconds["evaluation"] == before["evaluation"] == 10
    assert seconds["checkpoint_save"] == before["checkpoint_save"] == 4.5
    assert seconds["productive"] == before["productive"] - (0.5 + 4 + 0.5 + 6)
    # The first job's waits after its last save were wasted progress, now data loading.
    assert seconds["wasted_progress_from_disruption"] == 35 - 25
    assert sum(seconds.values()) == pytest.approx(sum(before.values()))


class _WaitingTrainer:
    """A trainer whose steps wait 0.25 s each for their batches (input_wait_s), or cannot say."""

    def __init__(self, measures: bool):
        self.input_wait_s = 0.0 if measures else None

    def train_chunk(self, num_steps):
        if self.input_wait_s is not None:
            self.input_wait_s += 0.25 * num_steps
        return float(num_steps), -1


class _Marks:
    def __init__(self):
        self.marks = []

    def mark(self, name, *, step=None, **fields):
        self.marks.append({"event": name, "step": step, **fields})


@pytest.mark.parametrize("measures", [True, False])
def test_the_loop_notes_its_input_waits_on_each_step_event(measures):
    from payload.training.loop import TrainingLoop, ledger_steps

    trainer, sink = _WaitingTrainer(measures), _Marks()
    loop = TrainingLoop(trainer, steps=25, steps_per_execution=4)
    loop.add_hook(ledger_steps(sink, trainer, every=10, compiled_ahead=True))
    loop.end_chunks_at(10)
    assert loop.run(0) == 25
    steps = [m for m in sink.marks if m["event"] == "step"]
    assert [m["step"] for m in steps] == [1, 10, 20, 25]
    if measures:
        assert [m["input_wait_s"] for m in steps] == [0.25, 9 * 0.25, 10 * 0.25, 5 * 0.25]
    else:
        assert not any("input_wait_s" in m for m in steps)


def test_a_long_run_read_back_from_its_files_is_bucketed_exactly(tmp_path):
    """100,000 steps reported every 100 (1,000 step events), an evaluation and a checkpoint
    every 1,000, written in batches as the chief's thread writes them, beside the launcher's
    and the agent's files and a line torn by an earlier killed chief: every event is read back
    and each bucket holds exactly its seconds."""
    out = str(tmp_path / "out")
    launcher = [_e(0, "setup_started"), _e(10, "environment_installed"), _e(20, "job_started")]
    agent = [_e(21, "stage_start", "agent", stage="train")]
    chief = [_e(30, "devices_ready", "chief"), _e(40, "compile_start", "chief", step=0),
             _e(100, "compile_end", "chief", step=0)]
    t = 100.0
    for report in range(1, 1001):
        t += 100.0  # 100 steps at a second each, of which 2 s waiting for batches
        chief.append(_e(t, "step", "chief", step=report * 100, input_wait_s=2.0))
        if report % 10 == 0:
            chief += [_e(t, "eval_start", "chief", step=report * 100),
                      _e(t + 3, "eval_end", "chief", step=report * 100),
                      _e(t + 3, "checkpoint_save_start", "chief", step=report * 100),
                      _e(t + 8, "checkpoint_save_end", "chief", step=report * 100)]
            t += 8
    chief.append(_e(t, "train_end", "chief", step=100_000))
    agent += [_e(t + 1, "stage_end", "agent", stage="train"), _e(t + 2, "agent_end", "agent")]
    launcher.append(_e(t + 3, "job_ended"))
    ledger.append(out, launcher)
    ledger.append(out, agent)
    for i in range(0, len(chief), 37):
        ledger.append(out, chief[i:i + 37])
        if i == 37 * 10:  # an earlier chief killed mid-line: the next batch starts afresh
            with open(tmp_path / "out" / ".tpuctl" / "ledger" / "chief.jsonl", "a") as f:
                f.write('{"t": 5000.0, "event": "step", "so')
    found = ledger.read(out)
    assert len(found) == len(launcher) + len(agent) + len(chief)
    assert [e["t"] for e in found] == sorted(e["t"] for e in found)
    report = goodput.account(found)
    _adds_up(report)
    seconds = _seconds(report)
    assert report["wall_s"] == t + 2 and report["last_step"] == 100_000  # to the agent's end
    assert seconds["data_loading"] == pytest.approx(2_000)
    assert seconds["productive"] == pytest.approx(100_000 - 2_000)
    assert seconds["evaluation"] == pytest.approx(300) and seconds["compile"] == 60
    assert seconds["checkpoint_save"] == pytest.approx(500)
    assert report["goodput"] == pytest.approx(98_000 / (t + 2), abs=1e-4)
