"""Where a run's time and money went: the ledger's events (payload.core.ledger) as buckets.

    report = account(ledger.read(out), nodes=budget.read_nodes(out), usd_per_hour=12.88,
                     chips=4, now=time.time())
    report["wall_s"]                          # the run's wall time
    report["buckets"]["compile"]              # {"seconds": 31.5, "dollars": 0.11}
    report["goodput"], report["goodput_of"]   # 0.62, "billed chip-hours"
    report["disruptions"][0]["steps_redone"]  # steps trained twice after a preemption

Every second of the run's wall time falls in exactly one bucket, so the buckets add up to
`wall_s`; every billed second (billing.json's nodes, from creation to deletion) falls in one
too, so their dollars add up to what the billing record costs at the price given. Pure: no I/O.

The names follow Google's ml-goodput-measurement where they mean the same (`productive` is its
goodput; `tpu_initialization`, `training_prep`, `compile` for its program start-up,
`data_loading`, `checkpoint_save`, `checkpoint_restore`, `wasted_progress_from_disruption`,
`infrastructure_recovery_from_disruption`, `evaluation` for what it files as custom badput,
`other`); that library starts counting at the job's first recorded start, so the rest are
tpuctl's own: `queueing` (a queued request waiting for capacity: no TPU yet, nothing billed),
`provisioning` (capacity granted until the VMs are up), `idle` (a slice up with no job yet),
`environment_setup` (shipping the payload, making the workers' environment, starting the
agents), `data_preparation` (the tokenizer and prepare stages), `export` (export and publish),
`idle_before_teardown` (the slice up after the last job ended). `data_loading` is the time the
training loop waited for its batches: each step event of the chief may carry `input_wait_s`,
the seconds waited since its job's previous step event (or the compile's end), and that much of
the productive time between the two becomes data loading (an engine that cannot measure it
leaves it in `productive`).

How events become time: each event starts a bucket that lasts until the next event (by time),
so a missing end event leaves the bucket of its start running until whatever happened next,
and events that arrive out of order are sorted first. Each worker's events are lined up with
the launcher's clock: a job's events from the workers cannot come before the launcher started
that job nor after it saw the job end, and a host whose clock says otherwise is shifted by the
difference (`skew_s` in the report). Time with nothing of the run in existence (after a
teardown, or after a local job ended) is no part of the wall time. After a preemption, the
steps trained since the last checkpoint were redone: their time is wasted progress, and the
time from the preemption until the new job starts is infrastructure recovery.
"""

from __future__ import annotations

BUCKETS = ("queueing", "provisioning", "idle", "environment_setup", "data_preparation",
           "tpu_initialization", "training_prep", "checkpoint_restore", "compile", "data_loading",
           "productive", "evaluation", "checkpoint_save", "wasted_progress_from_disruption",
           "infrastructure_recovery_from_disruption", "export", "idle_before_teardown",
           "other")
PRODUCTIVE, WASTED, RECOVERY = ("productive", "wasted_progress_from_disruption",
                                "infrastructure_recovery_from_disruption")
DATA_LOADING = "data_loading"
IDLE, IDLE_END = "idle", "idle_before_teardown"

# The bucket an event starts (None: nothing of the run exists from then on).
_STARTS = {
    "requested": "provisioning", "queued": "queueing", "capacity_granted": "provisioning",
    "vms_up": IDLE, "recreated": RECOVERY, "setup_started": "environment_setup",
    "environment_installed": "environment_setup", "job_started": "environment_setup",
    "preempted": RECOVERY, "job_ended": IDLE, "agent_end": IDLE, "torn_down": None,
    "devices_ready": "training_prep", "restore_start": "checkpoint_restore",
    "restore_end": "training_prep", "compile_start": "compile", "compile_end": PRODUCTIVE,
    "step": PRODUCTIVE, "train_end": "other", "stage_end": "other",
}
# An interruption of training: its end goes back to the bucket it interrupted.
_PAIRED = {"eval_start": ("evaluation", "eval_end"),
           "checkpoint_save_start": ("checkpoint_save", "checkpoint_save_end")}
_ENDS = {ending for _, ending in _PAIRED.values()}
_STAGES = {"tokenizer": "data_preparation", "prepare": "data_preparation",
           "train": "tpu_initialization", "export": "export", "publish": "export"}
# While a preempted run recovers, getting a slice and an environment again is recovery.
_RECOVERING = {"requested", "queued", "capacity_granted", "vms_up", "recreated",
               "setup_started", "environment_installed"}
# The launcher's bounds of a job, for lining the workers' clocks up with its own.
_JOB_FIRST, _JOB_LAST = ("job_started",), ("job_ended", "preempted")


def aligned(events: list[dict]) -> list[dict]:
    """The events by time, each worker host's events of a job shifted onto the launcher's clock
    where they fall outside the job as the launcher saw it (`skew_s` on each shifted event)."""
    bounds: dict[str, list] = {}
    for e in events:
        if e.get("source") == "launcher" and e.get("job"):
            low, high = bounds.setdefault(e["job"], [None, None])
            if e["event"] in _JOB_FIRST:
                bounds[e["job"]][0] = e["t"] if low is None else min(low, e["t"])
            elif e["event"] in _JOB_LAST:
                bounds[e["job"]][1] = e["t"] if high is None else max(high, e["t"])
    spans: dict[tuple, list] = {}
    for e in events:
        if e.get("source") != "launcher" and e.get("job") in bounds:
            key = (e["job"], e.get("host"))  # a clock is a host's, whoever writes
            span = spans.setdefault(key, [e["t"], e["t"]])
            span[0], span[1] = min(span[0], e["t"]), max(span[1], e["t"])
    shifts = {}
    for key, (first, last) in spans.items():
        low, high = bounds[key[0]]
        shift = 0.0
        if low is not None and first < low:
            shift = low - first
        elif high is not None and last > high:
            shift = high - last
            if low is not None:
                shift = max(shift, low - first)
        if shift:
            shifts[key] = shift
    out = []
    for e in events:
        shift = (shifts.get((e.get("job"), e.get("host")))
                 if e.get("source") != "launcher" else None)
        out.append({**e, "t": e["t"] + shift, "skew_s": shift} if shift else e)
    return sorted(out, key=lambda e: e["t"])


def _segments(events: list[dict], start: float, end: float) -> list[list]:
    """[from, to, bucket or None] covering start..end: each event's bucket until the next."""
    segments, bucket, recovering, resume = [], "other", False, {}
    trained_at: dict = {}  # per job: the last step event (or the compile's end)
    edge = start
    for e in events:
        name = e["event"]
        if e["t"] > edge:
            segments.append([edge, min(e["t"], end), bucket])
            edge = e["t"]
        if name == "step" and e.get("input_wait_s") and e.get("job") in trained_at:
            _carve(segments, trained_at[e.get("job")], e["t"], float(e["input_wait_s"]))
        if name in ("step", "compile_end"):
            trained_at[e.get("job")] = e["t"]
        if name == "preempted":
            recovering = True
        elif name == "job_started":
            recovering = False
        if name in ("job_started", "preempted", "stage_start"):
            resume.clear()  # an interruption left without its end belongs to what ended
        if name in _PAIRED:
            started, ending = _PAIRED[name]
            resume[ending] = bucket if bucket != started else resume.get(ending, PRODUCTIVE)
            bucket = started
        elif name in _ENDS:
            bucket = resume.pop(name, PRODUCTIVE)
        elif recovering and name in _RECOVERING:
            bucket = RECOVERY
        elif name == "stage_start":
            bucket = _STAGES.get(e.get("stage"), "other")
        elif name in _STARTS:
            bucket = _STARTS[name]
    if end > edge:
        segments.append([edge, end, bucket])
    return [s for s in segments if s[1] > s[0]]


def _carve(segments: list[list], since: float, until: float, seconds: float) -> None:
    """`seconds` of the productive time between `since` and `until` become data loading (the
    latest first), in place: the training loop waited that long for its batches then."""
    i = len(segments)
    while seconds > 0 and i > 0:
        i -= 1
        lo, hi, bucket = segments[i]
        if hi <= since:
            break
        a, b = max(lo, since), min(hi, until)
        if bucket != PRODUCTIVE or b <= a:
            continue
        cut = b - min(seconds, b - a)
        seconds -= b - cut
        segments[i:i + 1] = [piece for piece in ([lo, cut, PRODUCTIVE], [cut, b, DATA_LOADING],
                                                 [b, hi, PRODUCTIVE]) if piece[1] > piece[0]]


def _overlap(a: float, b: float, intervals: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in intervals)


def _split(segments: list[list], at: float) -> list[list]:
    out = []
    for seg in segments:
        if seg[0] < at < seg[1]:
            out += [[seg[0], at, seg[2]], [at, seg[1], seg[2]]]
        else:
            out.append(seg)
    return out


def _disruptions(events: list[dict], segments: list[list]) -> tuple[list[list], list[dict]]:
    """Each preemption: the productive time since its job's last checkpoint becomes wasted
    progress; what was lost and how long until training went on again."""
    found = []
    for i, hit in enumerate(events):
        if hit["event"] != "preempted":
            continue
        job = hit.get("job")
        before = [e for e in events[:i] if e.get("job") == job and job is not None]
        saves = [e for e in before if e["event"] == "checkpoint_save_end"]
        steps = [e["step"] for e in before if e["event"] == "step" and e.get("step") is not None]
        boundary = saves[-1]["t"] if saves else (before[0]["t"] if before else hit["t"])
        saved = saves[-1].get("step") if saves else None
        later = events[i + 1:]
        recreated = next((e for e in later if e["event"] == "recreated"), None)
        resumed = (recreated or {}).get("resumed_from_step", hit.get("resumed_from_step"))
        resumed = saved if resumed is None else resumed
        # The recovery record's figure where there is one (it also counts the checkpoint the
        # run resumed from), else the launcher's at the loss; never below a step seen here.
        lost = (recreated or {}).get("lost_at_step", hit.get("lost_at_step"))
        lost = max([s for s in (lost, *steps) if s is not None], default=None)
        redone = max(0, lost - (resumed or 0)) if lost is not None else None
        again = next((e for e in later if e["event"] == "step"
                      and e.get("job") not in (None, job)), None)
        segments = _split(_split(segments, boundary), hit["t"])
        for seg in segments:
            if seg[2] == PRODUCTIVE and boundary <= seg[0] and seg[1] <= hit["t"]:
                seg[2] = WASTED
        found.append({"t": hit["t"], "job": job, "reason": hit.get("reason"),
                      "lost_at_step": lost, "resumed_from_step": resumed,
                      "steps_redone": redone, "wasted_from": boundary,
                      "recovery_s": round(again["t"] - hit["t"], 3) if again else None})
    return segments, found


def account(events: list[dict], *, nodes: list[dict] = (), usd_per_hour: float | None = None,
            chips: int | None = None, now: float | None = None,
            until: float | None = None) -> dict:
    """The report: wall time and dollars per bucket, goodput, disruptions (module docstring).
    `nodes`: billing.json's, each {"created", "deleted"}; `usd_per_hour`: one node's price
    (None: no dollars); `now`: where a node still billing is counted to; `until`: count the
    last event's bucket on to here (a run in progress, seen from inside)."""
    events = aligned([e for e in events if isinstance(e.get("t"), int | float)])
    created = [float(n["created"]) for n in nodes if n.get("created") is not None]
    open_ = any(n.get("deleted") is None for n in nodes)
    if not events and not created:
        return _empty(usd_per_hour)
    times = [e["t"] for e in events]
    start = min(times + created)
    end = max(times + [float(n["deleted"]) for n in nodes if n.get("deleted") is not None]
              + ([now] if open_ and now is not None else [])
              + ([until] if until is not None else []))
    billed = [(float(n["created"]), float(n["deleted"]) if n.get("deleted") is not None else end)
              for n in nodes if n.get("created") is not None]
    segments = _segments(events, start, end)
    last_job = max((e["t"] for e in events if e["event"] == "job_started"), default=None)
    kept = []
    for seg in segments:
        if seg[2] in (IDLE, None):
            # Idle or gone: it counts only while a node bills (local workers cost nothing idle).
            if seg[2] == IDLE and last_job is not None and seg[0] >= last_job:
                seg[2] = IDLE_END
            elif seg[2] is None:
                seg[2] = "other"
            for lo, hi in billed:
                a, b = max(seg[0], lo), min(seg[1], hi)
                if b > a:
                    kept.append([a, b, seg[2]])
        else:
            kept.append(seg)
    kept, disruptions = _disruptions(events, kept)
    rate = usd_per_hour
    seconds = dict.fromkeys(BUCKETS, 0.0)
    node_s = dict.fromkeys(BUCKETS, 0.0)
    for a, b, bucket in kept:
        seconds[bucket] += b - a
        node_s[bucket] += _overlap(a, b, billed)
    for d in disruptions:
        wasted = [s for s in kept if s[2] == WASTED and d["wasted_from"] <= s[0] and s[1] <= d["t"]]
        d["wasted_s"] = round(sum(b - a for a, b, _ in wasted), 3)
        d["wasted_dollars"] = (None if rate is None else round(
            sum(_overlap(a, b, billed) for a, b, _ in wasted) * rate / 3600, 4))
        del d["wasted_from"]
    wall = sum(seconds.values())
    billed_s = sum(node_s.values())
    buckets = {name: {"seconds": round(seconds[name], 3),
                      "dollars": None if rate is None else round(node_s[name] * rate / 3600, 4)}
               for name in BUCKETS}
    if billed_s > 0:
        goodput, of = node_s[PRODUCTIVE] / billed_s, "billed chip-hours"
    else:
        goodput, of = (seconds[PRODUCTIVE] / wall if wall else None), "wall time"
    steps = [e["step"] for e in events if e["event"] == "step" and e.get("step") is not None]
    skews = sorted({round(e["skew_s"], 3) for e in events if e.get("skew_s")})
    return {
        "wall_s": round(wall, 3), "start": start, "end": end, "buckets": buckets,
        "goodput": None if goodput is None else round(goodput, 4), "goodput_of": of,
        "billed": ({"hours": round(billed_s / 3600, 6),
                    "chip_hours": round(billed_s / 3600 * chips, 6) if chips else None,
                    "dollars": None if rate is None else round(billed_s * rate / 3600, 4),
                    "usd_per_hour": rate, "still_billing": open_} if billed else None),
        "disruptions": disruptions, "last_step": max(steps, default=None),
        "events": len(events), "skew_s": skews,
    }


def _empty(usd_per_hour: float | None) -> dict:
    return {"wall_s": 0.0, "start": None, "end": None,
            "buckets": {name: {"seconds": 0.0, "dollars": None if usd_per_hour is None else 0.0}
                        for name in BUCKETS},
            "goodput": None, "goodput_of": "wall time", "billed": None, "disruptions": [],
            "last_step": None, "events": 0, "skew_s": []}

