"""What in the cloud is this run's own: the one rule that every cloud delete of tpuctl asks.

    owned = Ownership(site, output_dir="gs://my-bucket/demo")
    owned.record_node(node, zone)          # the moment Terraform or the queue said it made it
    owned.delete_nodes(zone)               # the run's own nodes of its names (every slice)
    owned.node_is_ours(node)               # the run's label AND a unique id tpuctl recorded
    owned.foreign_note(node, zone)         # the one line shown for a node that is not
    owned.vet(tf.plan(...))                # a plan touching a TPU not its own: refused
    bucket_plan(listing, locks, run=..., output_prefix=..., staged=..., staged_by_others=...)

A name proves nothing: anyone can make a TPU named after the run, and a label can be copied. A
TPU node is the run's own only when it carries the run's `tpuctl-run` label and its unique id
(a new one on every creation) is one tpuctl recorded making: in the run's local state
(TPUCTL_HOME/gcp/RUN/owned.json, written as soon as Terraform or the queue reported the node
made) or in the run's billing record (output_dir/.tpuctl/billing.json, written when a job
started on a node of its own). A queued request has no unique id: its node's label and the
creation time tpuctl recorded when it made the request stand in for one. Terraform's state is
held to the same rule: before Terraform removes the TPU, a node of its name that is not the
run's own is taken out of the state, so Terraform does not delete it either; and no plan that
would delete, replace or update a TPU that is not the run's own is applied (`vet`, before every
apply: the TPU a state entry names, by its own name and zone, which a changed `tpu_name` or
zone no longer is). In a bucket, the
run's own objects are those under its output prefix (marked `.tpuctl/owner`) and the staged
corpus objects its staging record lists. Anything else, whatever its name, is reported with
how to delete it by hand, and never touched.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from launcher import staging, terraform
from launcher.providers.gcp_site import Site, run_state
from payload.cloud import budget, tpu_api
from payload.core import layout, storage
from payload.core.errors import UserError

RUN_LABEL = "tpuctl-run"
OWNED_FILE = layout.OWNED
LOCK_SUFFIX = f"/{layout.OWN_DIR}/{layout.RUN_LOCK}"  # also at the bucket's top, with no prefix
OWNER_SUFFIX = f"/{layout.OWN_DIR}/{layout.OWNER}"


@dataclass(frozen=True)
class Ownership:
    """The run's record of what it made, and the rule that reads it."""

    site: Site
    output_dir: str | None = None  # where the billing record is; None: the local record only

    # -- the record ------------------------------------------------------------------------------
    def _path(self) -> str:
        return str(run_state(self.site.run_name) / OWNED_FILE)

    def _read(self) -> dict:
        path = self._path()
        return json.loads(storage.read_text(path)) if storage.exists(path) else {}

    def _write(self, record: dict) -> None:
        storage.write_text(self._path(), json.dumps(record, indent=1))

    def record_node(self, node: tpu_api.Node, zone: str) -> None:
        """Note that tpuctl made `node`: only called right after Terraform or the queue said so,
        and only for a node that carries the run's label."""
        record = self._read()
        nodes = record.setdefault("nodes", [])
        if node.labels.get(RUN_LABEL) == self.site.run_name and not any(
                n["uid"] == node.uid for n in nodes):
            nodes.append({"uid": node.uid, "name": node.name, "zone": zone})
            self._write(record)

    def record_queued(self, request: tpu_api.QueuedResource, zone: str) -> None:
        record = self._read()
        record.setdefault("queued", []).append(
            {"name": request.name, "zone": zone, "created": request.create_time})
        self._write(record)

    def recorded_uids(self) -> set[str]:
        uids = {n["uid"] for n in self._read().get("nodes", [])}
        if self.output_dir:
            # An unreadable billing record proves nothing: the local record still counts.
            with contextlib.suppress(Exception):
                uids |= {str(n["uid"]) for n in budget.read_nodes(self.output_dir)}
        return uids

    # -- the rule --------------------------------------------------------------------------------
    def node_is_ours(self, node: tpu_api.Node) -> bool:
        return (node.labels.get(RUN_LABEL) == self.site.run_name
                and node.uid in self.recorded_uids())

    def queued_is_ours(self, request: tpu_api.QueuedResource, zone: str) -> bool:
        return request.labels.get(RUN_LABEL) == self.site.run_name and any(
            q["name"] == request.name and q["zone"] == zone and q["created"] is not None
            and q["created"] == request.create_time for q in self._read().get("queued", []))

    def why_not(self, labels: dict) -> str:
        if labels.get(RUN_LABEL) != self.site.run_name:
            return f"it has no {RUN_LABEL}={self.site.run_name} label"
        return "tpuctl has no record of making it (its label alone proves nothing)"

    def foreign_note(self, node: tpu_api.Node, zone: str) -> str:
        """The one line for a node of the run's name that is not the run's own."""
        return (f"TPU {node.name} in {zone} (id {node.uid}) was not made by tpuctl for run "
                f"{self.site.run_name} ({self.why_not(node.labels)}): left alone; to delete "
                f"it yourself: gcloud compute tpus tpu-vm delete {node.name} --zone {zone} "
                f"--project {self.site.project}")

    def foreign_queued_note(self, request: tpu_api.QueuedResource, zone: str) -> str:
        return (f"queued request {request.name} in {zone} was not made by tpuctl for run "
                f"{self.site.run_name} ({self.why_not(request.labels)}): left alone; to delete "
                f"it yourself: gcloud compute tpus queued-resources delete {request.name} "
                f"--zone {zone} --project {self.site.project} --force")

    def foreign_in_state(self, tf: terraform.Terraform) -> list[tuple[str, tpu_api.Node, str]]:
        """The TPUs Terraform's state holds (by the name and zone the state gives each) that
        are there and not the run's own, as (address, node, zone)."""
        entries = tf.resources()
        if entries is None:  # Terraform is not running here (the runner waits for it)
            raise UserError(f"Terraform's state in {tf.folder} cannot be read",
                            hint=f"look at {tf.state_file}")
        found = []
        for entry in entries:
            node, zone = self._node_of(entry)
            if node is not None and not self.node_is_ours(node):
                found.append((entry.address, node, zone))
        return found

    def vet(self, changes: list[terraform.PlannedChange]) -> None:
        """Refuse a plan that would delete, replace or update a TPU that is not the run's own
        (Terraform finds its TPU by the name and zone in its state)."""
        for change in changes:
            node, zone = self._node_of(change)
            if node is None or self.node_is_ours(node):
                continue
            raise UserError(
                f"Terraform would {change.verb} TPU {node.name} in {zone} (id {node.uid}), "
                f"which is not run {self.site.run_name}'s own ({self.why_not(node.labels)}): "
                "nothing was applied",
                hint=f"inspect it with `gcloud compute tpus tpu-vm describe {node.name} --zone "
                     f"{zone} --project {self.site.project}`; if it is not the run's, `tpuctl "
                     "down` takes it out of the run's state without touching it and removes "
                     "the run's own, then `tpuctl up` again")

    def _node_of(self, entry: terraform.StateResource | terraform.PlannedChange
                 ) -> tuple[tpu_api.Node | None, str]:
        """The node a TPU entry of the state (or a planned change to one) names, as the TPU
        API has it now (None when there is none, or the entry is no TPU), and its zone."""
        if not terraform.is_tpu_address(entry.address):
            return None, ""
        name = terraform.recorded(entry.attributes, "name") or self.site.tpu_name
        zone = (terraform.recorded(entry.attributes, "zone") or self.site.recorded_zone()
                or self.site.zones[0])
        return self.site.api.get_node(name.rsplit("/", 1)[-1], zone), zone

    # -- looking -------------------------------------------------------------------------------
    def survey(self, zones: Iterable[str] | None = None) -> Survey:
        """Every node and queued request of the run's name or label in its zones, as the run's
        own (which tpuctl may delete) and foreign (reported, never touched)."""
        api, found = self.site.api, Survey()
        for zone in zones or self.site.zones:
            for node in api.list_nodes(zone):
                if node.name in self.site.node_names or (
                        node.labels.get(RUN_LABEL) == self.site.run_name):
                    if self.node_is_ours(node):
                        found.nodes.append((node, zone))
                    else:
                        found.foreign.append(self.foreign_note(node, zone))
            for request in api.list_queued(zone):
                if request.name == self.site.tpu_name or set(self.site.node_names) & set(
                        request.node_ids):
                    if self.queued_is_ours(request, zone):
                        found.queued.append((request, zone))
                    else:
                        found.foreign.append(self.foreign_queued_note(request, zone))
        return found

    def delete_nodes(self, zone: str) -> list[str]:
        """Delete the nodes of the run's names in `zone` (one per slice) that are the run's
        own; the names of those it deleted."""
        deleted = []
        for name in self.site.node_names:
            node = self.site.api.get_node(name, zone)
            if node is not None and self.node_is_ours(node) and self.site.api.delete_node(
                    node.name, zone):
                deleted.append(node.name)
        return deleted

    def delete_queued(self, zone: str) -> bool:
        """Delete the queued request of the run's name in `zone` if it is the run's own."""
        request = self.site.api.get_queued(self.site.tpu_name, zone)
        if request is None or not self.queued_is_ours(request, zone):
            return False
        return self.site.api.delete_queued(request.name, zone)


@dataclass
class Survey:
    nodes: list = field(default_factory=list)  # (Node, zone): the run's own
    queued: list = field(default_factory=list)  # (QueuedResource, zone): the run's own
    foreign: list = field(default_factory=list)  # one line each: of its name, not its own

    @property
    def ours(self) -> list[str]:
        return ([f"TPU {n.name} in {z} ({n.state})" for n, z in self.nodes]
                + [f"queued request {q.name} in {z} ({q.state})" for q, z in self.queued])


# -- a bucket --------------------------------------------------------------------------------


def is_lock(name: str) -> bool:
    return f"/{name}".endswith(LOCK_SUFFIX)


def live_lock(info: dict, now: float) -> bool:
    """Whether a run lock (payload.jobs.runlock's record) is still beating. One that cannot be
    read counts as live: deleting under a running job is the mistake that cannot be undone."""
    try:
        return now - float(info["beat"]) <= float(info.get("stale_after_s", 120.0))
    except (KeyError, TypeError, ValueError):
        return True


@dataclass(frozen=True)
class BucketPlan:
    delete: tuple[str, ...]  # object names (every version of each goes)
    kept: tuple[str, ...]  # what stays because it is not this run's
    refusal: str | None  # why nothing may be deleted now


def bucket_plan(names: Iterable[str], locks: dict[str, dict], *, run: str,
                output_prefix: str | None, staged: Iterable[str],
                staged_by_others: Iterable[str], now: float | None = None) -> BucketPlan:
    """What `down --delete-bucket` may delete from a bucket: the run's own output prefix (when
    tpuctl marked it its own) and the staged corpus objects its record lists that no other
    run's record lists too, nothing while any run's lock in the bucket is live.

    `names`: every object in the bucket; `locks`: each run lock's object name -> its record."""
    names = sorted(set(names))
    now = time.time() if now is None else now
    live = [name for name, info in sorted(locks.items()) if live_lock(info, now)]
    if live:
        return BucketPlan((), tuple(names), f"a run is using the bucket now (its lock "
                          f"{live[0]} is live)")
    mine: set[str] = set()
    if output_prefix and f"{output_prefix}{OWNER_SUFFIX}" in names:
        mine |= {n for n in names if n.startswith(output_prefix + "/")}
    shared = set(staged_by_others)
    mine |= {n for n in set(staged) & set(names) if n.startswith("corpus/") and n not in shared}
    if staging.staged_record(run) in names:
        mine.add(staging.staged_record(run))
    left = [n for n in names if n not in mine]
    if left == [staging.OWNER_MARKER]:  # the staging area's own marker, and nothing it marks
        mine.add(staging.OWNER_MARKER)
        left = []
    return BucketPlan(tuple(sorted(mine)), tuple(left), None)
