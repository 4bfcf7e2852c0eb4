"""What on Compute Engine is a gce run's own: the ids tpuctl recorded from what Terraform made,
and the one rule that every gce delete asks.

    owned = Ownership("trillium", api, policy=True)  # api: gce_api.ComputeApi (project, region)
    owned.before_apply(tf)                           # then tf.apply_plan(..., on_made=...)
    owned.record_made(tf)                            # ids of what the apply has made so far
    owned.after_apply(tf)                            # all of it, and the apply is over
    owned.take_over(tf, print)                       # the same, after an `up` cut short
    owned.is_ours("groups", "trillium", uid)         # an id tpuctl recorded making
    owned.foreign_note("groups", "trillium", uid)    # the one line for one that is not
    owned.delete_own("groups", "trillium", print)    # deleted only if it is the run's own
    owned.spare_foreign(tf, print)                   # before Terraform deletes by name
    owned.vet(tf.plan(...))                          # a plan touching one not its own: refused
    own, foreign = owned.left()                      # what of the run's names is still there

A name proves nothing, and neither a workload policy nor a MIG carries labels: a firewall rule,
workload policy, instance template or MIG is the run's own only when its unique id (a new one on
every creation) is one tpuctl recorded making, in TPUCTL_HOME/gcp/RUN/owned.json under "gce"
(gcp's rule, launcher.providers.gcp_owned); a VM only as a member of the run's own MIG.

What tpuctl made is what Terraform made: a resource that an apply added to Terraform's state (or
replaced there), not tainted (a create that failed, as when someone took the name meanwhile and
the insert met 409), recorded by the id Compute Engine gives that name, checked against what the
state says it made where the state says it. Only the kinds the apply makes are ever recorded
(a one-VM slice has no workload policy). The state as it was before the apply is kept in the
record until the apply is seen to end, so that after an `up` cut short the next `up` or `down`
takes over what its Terraform made (Terraform runs in a session of its own and finishes what
it was doing: launcher.terraform). Terraform's state is held to the same rule: a resource of the
run's names that is not the run's own leaves the state before Terraform could delete it, and
no plan that would delete, replace or update one that is not the run's own is applied (`vet`,
before every apply and destroy: Terraform finds what it changes by name). Anything else of the run's names is reported with the commands to inspect and delete it by
hand, and never touched.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable

from launcher import terraform
from launcher.providers import gce_api, gce_slice, gcp_site
from payload.core import layout, storage
from payload.core.errors import UserError

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
# The record's key for the state as it was before an apply that has not been seen to end.
APPLYING = "gce_applying"


class Ownership:
    """The run's record of the gce resources it made (kind -> name -> unique ids), and the rule
    that reads it."""

    def __init__(self, run_name: str, api: gce_api.ComputeApi, *, policy: bool = True,
                 slices: int = 1):
        self.run_name, self.api = run_name, api
        self.names = gce_slice.SliceNames.of(run_name, slices)
        # (kind, name) of what the run's `up` makes, every slice's: a one-VM slice has no
        # workload policy.
        self.made = self.names.owned(policy=policy)
        self.path = str(gcp_site.run_state(run_name) / layout.OWNED)

    # -- the record ------------------------------------------------------------------------------
    def _read(self) -> dict:
        return json.loads(storage.read_text(self.path)) if storage.exists(self.path) else {}

    def ids(self, kind: str) -> dict[str, list[str]]:
        return self._read().get("gce", {}).get(kind, {})

    def _write(self, record: dict) -> None:
        storage.write_text(self.path, json.dumps(record, indent=1))

    def record(self, kind: str, name: str, uid: str) -> None:
        record = self._read()
        uids = record.setdefault("gce", {}).setdefault(kind, {}).setdefault(name, [])
        if uid not in uids:
            uids.append(uid)
            self._write(record)

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
        cut_short = (f"; an `up` of run {self.run_name} was cut short: `tpuctl up` or `tpuctl "
                     "down` takes over what its Terraform made" if self.applying() else "")
        return (f"{self._called(kind, name)} (id {uid}) was not made by tpuctl for run "
                f"{self.run_name} (tpuctl has no record of making it; its name alone proves "
                f"nothing{cut_short}): left alone; inspect it with "
                f"`{self.command(kind, 'describe', name)}`; to delete it yourself: "
                f"{self.command(kind, 'delete', name)}")

    def _called(self, kind: str, name: str) -> str:
        return f"{WHAT[kind]} {name}" + ("" if kind == "firewalls" else f" in {self.api.region}")

    # -- what Terraform made ---------------------------------------------------------------------
    def resource_of(self, entry: terraform.StateResource | terraform.PlannedChange
                    ) -> tuple[str, str] | None:
        """(kind, name) of a state entry of the slice module (infra/modules/tpu_slice, or its
        twin's terraform_data stand-ins, whose addresses carry the same type names), or of a
        planned change to one (its attributes are the state's), or None.
        The name is the one the google provider recorded, where it did (a template's, which the
        provider derives from its name_prefix, is known only there); else the run's: a slice's
        policy and MIG by their index in the address (`...main[1]`: slice 1)."""
        address = entry.address
        found = next(((t, k) for t, k in STATE_TYPES.items() if t in address), None)
        if found is None:
            return None
        type_name, kind = found
        recorded = terraform.recorded(entry.attributes, "name")
        if recorded:
            return kind, recorded
        if kind == "templates":  # not made yet: no name to go by
            return None
        which = address.rsplit(type_name, 1)[1]  # the rest of the address
        if kind == "firewalls":  # two rules: the rest names which
            return kind, (self.names.ssh_rule if "ssh" in which else self.names.internal_rule)
        index = re.search(r"\[(\d+)\]", which)
        names = self.names.policies if kind == "policies" else self.names.groups
        slice_index = int(index.group(1)) if index else 0
        return (kind, names[slice_index]) if slice_index < len(names) else None

    def in_state(self, tf: terraform.Terraform, kind: str) -> list[str]:
        """The names of the resources of that kind Terraform's state holds for the run (a
        template's name is only known there)."""
        names = []
        for entry in tf.resources() or []:
            resource = self.resource_of(entry)
            if resource is not None and resource[0] == kind and not entry.tainted:
                names.append(resource[1])
        return names

    def applying(self) -> bool:
        """Whether an apply of the run has not been seen to end (an `up` cut short)."""
        return APPLYING in self._read()

    def before_apply(self, tf: terraform.Terraform) -> None:
        """Note Terraform's state as it is before an apply (Terraform is not running: the
        runner waits for it): what the apply adds or replaces is what it made for the run."""
        found = tf.resources()
        if found is None:
            raise UserError(f"Terraform's state in {tf.folder} cannot be read",
                            hint=f"look at {tf.state_file}; `tpuctl up` again")
        record = self._read()
        record[APPLYING] = {r.address: r.fingerprint for r in found if self.resource_of(r)}
        self._write(record)

    def record_made(self, tf: terraform.Terraform) -> bool:
        """Record the ids of what the apply under way (or cut short) made: each resource of
        the slice in Terraform's state that is new or changed since before the apply and not
        tainted, by the id Compute Engine gives its name now, if that is the resource the state
        describes. False when the state could not be read (being written): read it again."""
        before = self._read().get(APPLYING)
        if before is None:
            return True
        found = tf.resources()
        if found is None:
            return False
        for entry in found:
            resource = self.resource_of(entry)
            if resource is None or entry.tainted or before.get(entry.address) == entry.fingerprint:
                continue
            kind, name = resource
            made = self.api.get(kind, name)
            if made is not None and _is_the_one(entry.attributes, made):
                self.record(kind, name, str(made.id))
        return True

    def after_apply(self, tf: terraform.Terraform) -> None:
        """The apply has ended (made all, part or nothing): record what it made, then forget
        the state as it was before."""
        if not self.record_made(tf):
            raise UserError(f"Terraform's state in {tf.folder} cannot be read",
                            hint=f"look at {tf.state_file}; `tpuctl down` again")
        record = self._read()
        if record.pop(APPLYING, None) is not None:
            self._write(record)

    def take_over(self, tf: terraform.Terraform, on_event: Callable[[str], None]) -> None:
        """After an `up` that was cut short mid-apply: wait for its Terraform, which goes on
        in a session of its own until it has saved what it made, then record that."""
        if not self.applying():
            return
        tf.wait_idle(on_event)
        before = json.dumps(self._read().get("gce", {}), sort_keys=True)
        self.after_apply(tf)
        if json.dumps(self._read().get("gce", {}), sort_keys=True) != before:
            on_event(f"recorded what Terraform made for run {self.run_name} in an `up` that was "
                     "cut short")

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
        own (the run's was deleted, someone made another, a create met someone's 409) leaves
        the state before Terraform could delete it."""
        doomed = []
        entries = tf.resources()
        if entries is None:  # Terraform is not running here (the runner waits for it)
            raise UserError(f"Terraform's state in {tf.folder} cannot be read",
                            hint=f"look at {tf.state_file}")
        for entry in entries:
            foreign = self._foreign(entry)
            if foreign is not None:
                kind, name, _ = foreign
                doomed.append(entry.address)
                on_event(f"terraform: took {WHAT[kind]} {name} out of the run's state (it is "
                         "not the run's own), so that Terraform does not delete it")
        tf.forget(doomed)

    def _foreign(self, entry):
        """(kind, name, what Compute Engine has) for a state entry or planned change of the
        run's names that something not the run's own holds now; None otherwise."""
        resource = self.resource_of(entry)
        if resource is None:
            return None
        kind, name = resource
        found = self.api.get(kind, name)
        if found is None or self.is_ours(kind, name, str(found.id)):
            return None
        return kind, name, found

    def vet(self, changes: list[terraform.PlannedChange]) -> None:
        """Refuse a plan that would delete, replace or update a resource of the run's names
        that is not the run's own: what Compute Engine has under that name now, by its id (the
        run's was deleted and someone made another; a create met someone's 409)."""
        for change in changes:
            foreign = self._foreign(change)
            if foreign is None:
                continue
            kind, name, found = foreign
            raise UserError(
                f"Terraform would {change.verb} {self._called(kind, name)} (id {found.id}), "
                f"which tpuctl has no record of making for run {self.run_name} (its name alone "
                "proves nothing): nothing was applied",
                hint=f"inspect it with `{self.command(kind, 'describe', name)}`; if it is not "
                     "the run's, `tpuctl down` takes it out of the run's state without touching "
                     "it and removes the run's own, then `tpuctl up` again")

    def run_names(self) -> list[tuple[str, str]]:
        """(kind, name) of the run's names: those its `up` makes under fixed names, in that
        order, then any other it recorded making (its templates, a config changed since)."""
        recorded = [(kind, name) for kind, names in self._read().get("gce", {}).items()
                    for name in names]
        return list(dict.fromkeys([*self.made, *recorded]))

    def left(self) -> tuple[list[str], list[tuple[str, str, str]]]:
        """What of the run's names is still there: the run's own ones (in words), and the
        others as (kind, name, id). Templates are found by their name too: the run's prefix and
        a unique id such as the google provider adds (SliceNames.is_template), so that one an
        `up` cut short made and nobody recorded is named as well."""
        own, foreign = [], []
        named = [("templates", name) for name in self.api.names("templates",
                                                                 self.names.is_template)]
        for kind, name in dict.fromkeys([*self.run_names(), *named]):
            found = self.api.get(kind, name)
            if found is None:
                continue
            if self.is_ours(kind, name, str(found.id)):
                own.append(f"{WHAT[kind]} {name}")
            else:
                foreign.append((kind, name, str(found.id)))
        return own, foreign

    def still_there(self, own: list[str], foreign: list[tuple[str, str, str]]) -> str:
        """`left()` in words: the run's own, then each other one with how to inspect it."""
        parts = [f"{what} (the run's own)" for what in own]
        parts += [f"{self._called(kind, name)} (id {uid}), which tpuctl has no record of "
                  f"making: inspect it with `{self.command(kind, 'describe', name)}`"
                  for kind, name, uid in foreign]
        return "; ".join(parts)


def _is_the_one(attributes: dict, found) -> bool:
    """Whether what Compute Engine has under the name is the resource a state entry describes,
    where the entry says which: the google providers keep a MIG's numeric id, a template's
    unique link and a creation time; the twin's terraform_data entries say none of it."""
    uid = str(found.id)
    if attributes.get("instance_group_manager_id") not in (None, ""):
        return str(attributes["instance_group_manager_id"]) == uid
    unique = attributes.get("self_link_unique") or ""
    if "uniqueId=" in unique:
        return unique.rsplit("uniqueId=", 1)[1] == uid
    created = attributes.get("creation_timestamp")
    with contextlib.suppress(AttributeError):
        if created and found.creation_timestamp:
            return created == found.creation_timestamp
    return True
