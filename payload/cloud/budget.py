"""A hard stop on time and money: `train.max_hours` and `train.max_cost`, counted as billed.

    budget = Budget.for_run(config)       # None when the run sets no limit
    budget.exceeded()                     # "train.max_cost $50.00 reached ($50.12 so far)" or None
    record_node(output_dir, uid="123", zone="us-central2-b", created=1700000000.0)

What counts is what the TPU bills: from each node's creation to its deletion, recoveries
included and queue waiting excluded. The launcher records every node a run used in
output_dir/.tpuctl/billing.json (`record_node`, `record_deleted`); the training chief reads it,
so the limit holds with no launcher watching. Without a record (local and ssh runs) the time is
the time since the job started (JOB_STARTED_ENV, which each worker's agent sets; the stage's own
start when run by hand). Cost is that time at the price table's rate for the run's accelerator,
zone and provisioning (payload.cloud.prices). With several slices (cluster.slices: N) the record
lists every slice's node and the price is all N slices': the hours are the record's node-hours
over N, so an hour of N slices is one hour at N times one slice's price. The limit binds the whole job: the training loop stops
at it with a checkpoint (then export), and the agent (payload.jobs.agent) ends any stage that
runs past it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from payload.cloud import prices
from payload.core import layout, storage

BILLING = (layout.OWN_DIR, layout.BILLING)
REREAD_S = 60.0
# When the job started (epoch seconds), as the agent hands it to every stage.
JOB_STARTED_ENV = "TPUCTL_JOB_STARTED"


def job_started() -> float:
    """When the job started: the agent's word, else now (a stage run by hand)."""
    try:
        return float(os.environ[JOB_STARTED_ENV])
    except (KeyError, ValueError):
        return time.time()


def billing_path(output_dir: str) -> str:
    return storage.join(output_dir, *BILLING)


def _read(output_dir: str) -> list[dict]:
    path = billing_path(output_dir)
    return json.loads(storage.read_text(path))["nodes"] if storage.exists(path) else []


def read_nodes(output_dir: str) -> list[dict]:
    """The nodes the run's record lists: their unique ids, zones, creation and deletion."""
    return _read(output_dir)


def record_node(output_dir: str, *, uid: str, zone: str, created: float) -> None:
    """The run uses this node (again): add it unless it is there already."""
    nodes = _read(output_dir)
    if not any(n["uid"] == uid for n in nodes):
        nodes.append({"uid": uid, "zone": zone, "created": created, "deleted": None})
        storage.write_text(billing_path(output_dir), json.dumps({"nodes": nodes}, indent=1))


def record_deleted(output_dir: str, uid: str, when: float | None = None) -> None:
    nodes = _read(output_dir)
    for node in nodes:
        if node["uid"] == uid and node["deleted"] is None:
            node["deleted"] = when or time.time()
    storage.write_text(billing_path(output_dir), json.dumps({"nodes": nodes}, indent=1))


def record_all_deleted(output_dir: str, when: float | None = None) -> None:
    """Every node the record still counts as billing is gone (`tpuctl down` checked it through
    the API): without this the last node would bill on in the record after a teardown."""
    nodes = _read(output_dir)
    if any(node["deleted"] is None for node in nodes):
        gone = when or time.time()
        for node in nodes:
            if node["deleted"] is None:
                node["deleted"] = gone
        storage.write_text(billing_path(output_dir), json.dumps({"nodes": nodes}, indent=1))


def billed_hours(nodes: list[dict], now: float, slices: int = 1) -> float:
    """The hours the run's TPU billed: node-hours over the number of slices (every slice's
    node is in the record; the price is that of all of them together)."""
    return sum(((n["deleted"] or now) - n["created"]) for n in nodes) / 3600 / slices


@dataclass
class Budget:
    output_dir: str
    max_hours: float | None
    max_cost: float | None
    usd_per_hour: float | None  # None: no price (local and ssh runs)
    started: float  # wall clock when training started (runs without a billing record)
    slices: int = 1  # the slices usd_per_hour is the price of (billed_hours)
    _nodes: list | None = None
    _read_at: float = -REREAD_S

    @classmethod
    def for_run(cls, config) -> Budget | None:
        train = config.train
        if train.max_hours is None and train.max_cost is None:
            return None
        return cls(output_dir=config.output_dir, max_hours=train.max_hours,
                   max_cost=train.max_cost, usd_per_hour=config.cluster.hourly_usd(),
                   started=job_started(), slices=config.cluster.slices)

    def hours(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        if time.monotonic() - self._read_at >= REREAD_S:
            self._nodes, self._read_at = _read(self.output_dir), time.monotonic()
        if self._nodes:
            return billed_hours(self._nodes, now, self.slices)
        return (now - self.started) / 3600

    def exceeded(self, now: float | None = None) -> str | None:
        hours = self.hours(now)
        if self.max_hours is not None and hours >= self.max_hours:
            return f"train.max_hours {self.max_hours:g} reached ({hours:.2f} h so far)"
        if self.max_cost is not None and self.usd_per_hour is not None:
            spent = prices.cost_usd(self.usd_per_hour, hours)
            if spent >= self.max_cost:
                return f"train.max_cost ${self.max_cost:,.2f} reached (${spent:,.2f} so far)"
        return None


def describe(config) -> str | None:
    """What will stop the run, and how far it is: for `tpuctl status` (None: no limit set)."""
    limits = Budget.for_run(config)
    if limits is None:
        return None
    try:
        nodes = _read(config.output_dir)
    except Exception:  # output_dir unreachable from here: show the limits alone
        nodes = []
    hours = billed_hours(nodes, time.time(), limits.slices) if nodes else None
    parts = []
    if limits.max_hours is not None:
        so_far = f" ({hours:.2f} h billed so far)" if hours is not None else ""
        parts.append(f"train.max_hours {limits.max_hours:g}{so_far}")
    if limits.max_cost is not None:
        spent = (f" (${prices.cost_usd(limits.usd_per_hour, hours):,.2f} so far)"
                 if hours is not None and limits.usd_per_hour else "")
        parts.append(f"train.max_cost ${limits.max_cost:,.2f}{spent}")
    return "stops at " + " or ".join(parts) + ": checkpoint, export, then stop"
