"""What on Compute Engine is a gce run's own: the ids tpuctl recorded making, and the one rule
that every gce delete asks.

    owned = Ownership("trillium", api)               # api: gce_api.ComputeApi (project, region)
    owned.record("groups", "trillium", "5012...")    # the moment Terraform made it
    owned.is_ours("groups", "trillium", uid)         # an id tpuctl recorded making
    owned.foreign_note("groups", "trillium", uid)    # the one line for one that is not
    owned.delete_own("groups", "trillium", print)    # deleted only if it is the run's own
    owned.spare_foreign(tf, print)                   # before Terraform deletes by name

A name proves nothing, and neither a workload policy nor a MIG carries labels: a firewall rule,
workload policy, instance template or MIG is the run's own only when its unique id (a new one on
every creation) is one tpuctl recorded making, in TPUCTL_HOME/gcp/RUN/owned.json under "gce"
(gcp's rule, launcher.providers.gcp_owned); a VM only as a member of the run's own MIG.
Terraform's state is held to the same rule: a resource of the run's names that is not the run's
own leaves the state before Terraform could delete it. Anything else of the run's names is
reported with the commands to inspect and delete it by hand, and never touched.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from launcher import terraform
from launcher.providers import gce_api, gce_slice, gcp_site
from payload.core import layout, storage

# What the launcher calls each kind, in words and as the gcloud commands that show and delete
# one (firewall rules are global, the rest regional).
WHAT = {"firewalls": "firewall rule", "policies": "workload policy",
        "templates": "instance template", "groups": "managed instance group"}
GCLOUD = {"firewalls": "gcloud compute firewall-rules {verb} {name}",
          "policies": "gcloud compute resource-policies {verb} {name} --region {region}",
          "templates": "gcloud compute instance-templates {verb} {name} --region {region}",
          "groups": "gcloud compute instance-groups managed {verb} {name} --region {region}"}
# Resource types of infra/modules/tpu_slice, as their state addresses name them (the twin's
# terraform_data resources carry the same names), by kind.
STATE_TYPES = {"google_compute_firewall": "firewalls", "google_compute_resource_policy": "policies",
               "google_compute_region_instance_template": "templates",
               "google_compute_region_instance_group_manager": "groups"}


class Ownership:
    """The run's record of the gce resources it made (kind -> name -> unique ids), and the rule
    that reads it."""

    def __init__(self, run_name: str, api: gce_api.ComputeApi):
        self.run_name, self.api = run_name, api
        self.names = gce_slice.SliceNames.of(run_name)
        self.path = str(gcp_site.run_state(run_name) / layout.OWNED)

    # -- the record ------------------------------------------------------------------------------
    def _read(self) -> dict:
        return json.loads(storage.read_text(self.path)) if storage.exists(self.path) else {}

    def ids(self, kind: str) -> dict[str, list[str]]:
        return self._read().get("gce", {}).get(kind, {})

    def record(self, kind: str, name: str, uid: str) -> None:
        record = self._read()
        uids = record.setdefault("gce", {}).setdefault(kind, {}).setdefault(name, [])
        if uid not in uids:
            uids.append(uid)
            storage.write_text(self.path, json.dumps(record, indent=1))

    def known(self) -> bool:
        return storage.exists(self.path) and bool(self._read().get("gce"))

    # -- the rule --------------------------------------------------------------------------------
    def is_ours(self, kind: str, name: str, uid: str) -> bool:
        return uid in self.ids(kind).get(name, [])

    def command(self, kind: str, verb: str, name: str) -> str:
        """The gcloud command that does `verb` (describe, delete) to the resource."""
        return (GCLOUD[kind].format(verb=verb, name=name, region=self.api.region)
                + f" --project {self.api.project}")

    def foreign_note(self, kind: str, name: str, uid: str) -> str:
        """The one line for a resource of the run's names that is not the run's own."""
        where = "" if kind == "firewalls" else f" in {self.api.region}"
        return (f"{WHAT[kind]} {name}{where} (id {uid}) was not made by tpuctl for run "
                f"{self.run_name} (tpuctl has no record of making it; its name alone proves "
                f"nothing): left alone; to delete it yourself: "
                f"{self.command(kind, 'delete', name)}")

    # -- acting on it ----------------------------------------------------------------------------
    def delete_own(self, kind: str, name: str, on_event: Callable[[str], None]) -> str | None:
        """Delete the resource of that name if it is the run's own; the foreign note if not."""
        found = self.api.get(kind, name)
        if found is None:
            return None
        if not self.is_ours(kind, name, str(found.id)):
            return self.foreign_note(kind, name, str(found.id))
        if self.api.delete(kind, name):
            on_event(f"deleted {WHAT[kind]} {name}")
        return None

    def spare_foreign(self, tf: terraform.Terraform, on_event: Callable[[str], None]) -> None:
        """Terraform finds its resources by name: one of the run's names that is not the run's
        own (the run's was deleted, someone made another) leaves the state before Terraform
        could delete it."""
        by_kind: dict[str, list[str]] = {}
        for kind, name in self.names.owned():
            by_kind.setdefault(kind, []).append(name)
        doomed = []
        for address in tf.addresses():
            kind = next((k for t, k in STATE_TYPES.items() if t in address), None)
            if kind is None:
                continue
            names = by_kind[kind]
            # Two firewall rules: the address names which (ssh or internal).
            name = next((n for n in names if n.rsplit("-", 1)[-1] in address), names[0])
            found = self.api.get(kind, name)
            if found is not None and not self.is_ours(kind, name, str(found.id)):
                doomed.append(address)
                on_event(f"terraform: took {WHAT[kind]} {name} out of the run's state (it is "
                         "not the run's own), so that Terraform does not delete it")
        tf.forget(doomed)
