"""Compute Engine TPU VMs: `provider: gce` (TPU7x, v6e, v5p as machine types and bulk MIGs).

    provider = GceProvider.from_config(config, num_workers=None)
    print("\\n".join(provider.up_plan()))   # the policy, template and MIG, and the price: no calls
    provider.up(on_event=print)              # made, all VMs RUNNING, host keys written
    fleet = provider.fleet()                 # workers from listManagedInstances + instances.get
    provider.describe()                      # MIG and VM state, flex-start time left, price
    provider.down(on_event=print)            # MIG, template, policy gone, checked through the API

`up` applies Terraform (infra/modules/tpu_slice, with launcher.providers.gce_slice's variables)
and then follows the slice through Compute Engine (launcher.providers.gce_api). Ownership follows gcp's rule (launcher.providers.gcp_owned): a name
proves nothing; tpuctl deletes a MIG, template or workload policy only when its unique id is one
it recorded making (TPUCTL_HOME/gcp/RUN/owned.json, key "gce"), and a VM only by deleting the
run's own MIG it belongs to. Host keys come from each VM's guest attributes (hostkeys/), polled
until the guest agent publishes them, and SSH is strict from the first connection.
The module also makes the slice's two firewall rules (SSH from cluster.ssh_source_ranges; the
VMs to each other); `recover` (--auto-resume) replaces a MIG whose VMs were taken back;
`node_to_delete` (train --down) names the run's own MIG for worker 0 to delete
(payload.cloud.self_delete). Not built yet: a bucket and service account for gce.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from launcher import terraform
from launcher.executors import SshExecutor, SshSettings
from launcher.plan import NodeToDelete, Worker
from launcher.providers import gce_api, gce_slice, gcp_site
from launcher.providers.base import Check, Fleet
from launcher.providers.gcp_site import Site
from launcher.records import state_dir
from payload.cloud import budget, tpu_api
from payload.core import layout, storage
from payload.core.errors import UserError
from payload.training.strategy import Hardware

if TYPE_CHECKING:
    from payload.config import RunConfig


NAME = "gce"
# The slice's Terraform module (tests point this at tests/terraform_twin_slice).
SLICE_MODULE = terraform.INFRA_DIR / "modules" / "tpu_slice"
# Resource types of the module, as their state addresses name them (the twin's terraform_data
# resources carry the same names), by what the launcher calls them.
STATE_TYPES = {"google_compute_firewall": "firewalls", "google_compute_resource_policy": "policies",
               "google_compute_region_instance_template": "templates",
               "google_compute_region_instance_group_manager": "groups"}
# The port JAX's coordinator listens on, on worker 0 (what jax.distributed.initialize is given).
COORDINATOR_PORT = 8476
WHAT = {"firewalls": "firewall rule", "policies": "workload policy",
        "templates": "instance template", "groups": "managed instance group"}
GCLOUD = {"firewalls": "gcloud compute firewall-rules delete {name}",
          "policies": "gcloud compute resource-policies delete {name} --region {region}",
          "templates": "gcloud compute instance-templates delete {name} --region {region}",
          "groups": "gcloud compute instance-groups managed delete {name} --region {region}"}


class Owned:
    """The run's record of the gce resources it made: kind -> name -> unique id."""

    def __init__(self, run_name: str):
        self.path = str(gcp_site.run_state(run_name) / layout.OWNED)

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

    def is_ours(self, kind: str, name: str, uid: str) -> bool:
        return uid in self.ids(kind).get(name, [])

    def known(self) -> bool:
        return storage.exists(self.path) and bool(self._read().get("gce"))


class GceProvider:
    name = NAME

    def __init__(self, site: Site, config=None, *, region: str | None = None,
                 accelerator: str | None = None):
        self.site = site
        self.config = config  # None when reopened from a job record
        self.region = region or gce_slice.accelerators.region_of(site.zones[0])
        # The slice's name in the accelerator table (tpu7x-8), for the fleet's hardware.
        self.accelerator = accelerator or (config.cluster.slice.name if config else None)

    def __eq__(self, other) -> bool:
        return isinstance(other, GceProvider) and other.site == self.site

    @classmethod
    def from_config(cls, config: RunConfig, *, num_workers: int | None) -> GceProvider:
        if num_workers is not None:
            raise UserError("--workers only applies with --local",
                            hint="a slice runs on all of its hosts; its size is "
                            "cluster.machine_type and cluster.topology")
        site = Site.of(config, zones=(config.cluster.zone,),
                       tpu_name=gce_slice.SliceNames.of(config.name).group)
        return cls(site, config)

    @classmethod
    def from_reach(cls, reach: dict, workers: tuple[Worker, ...]) -> GceProvider:
        return cls(Site.from_reach(reach), region=reach.get("region"),
                   accelerator=reach.get("accelerator"))

    def _config(self) -> RunConfig:
        if self.config is None:
            raise UserError("up and down work from the run config", hint="pass -c tpuctl.yaml")
        return self.config

    @property
    def api(self) -> gce_api.ComputeApi:
        return gce_api.ComputeApi(project=self.site.project, region=self.region)

    @property
    def owned(self) -> Owned:
        return Owned(self.site.run_name)

    def _names(self) -> gce_slice.SliceNames:
        return gce_slice.SliceNames.of(self.site.run_name)

    def _foreign_note(self, kind: str, name: str, uid: str) -> str:
        command = GCLOUD[kind].format(name=name, region=self.region)
        where = "" if kind == "firewalls" else f" in {self.region}"
        return (f"{WHAT[kind]} {name}{where} (id {uid}) was not made by tpuctl for "
                f"run {self.site.run_name} (tpuctl has no record of making it; its name alone "
                f"proves nothing): left alone; to delete it yourself: {command} --project "
                f"{self.site.project}")

    # -- without credentials -------------------------------------------------------------------
    def up_plan(self) -> list[str]:
        config = self._config()
        cluster, site = config.cluster, self.site
        acc = cluster.slice
        requests = gce_slice.slice_requests(config, user=site.user, public_key="(the run's key)")
        names = requests.names
        sched = requests.template["properties"]["scheduling"]
        run_limit = (f", stopped and deleted after {cluster.max_run_hours:g} h"
                     if cluster.max_run_hours is not None else "")
        lines = [
            f"project {cluster.project}, zone {cluster.zone} (region {requests.region})",
            f"firewall rules {names.ssh_rule}: tcp/22 from "
            f"{', '.join(cluster.ssh_source_ranges or ['(not set)'])}; {names.internal_rule}: "
            f"the slice's VMs to each other (network tag {names.tag})",
            f"slice {names.group}: {acc.name} = {cluster.topology} on {acc.hosts} x "
            f"{cluster.machine_type} ({acc.chips} chips of TPU {acc.generation}, "
            f"{acc.chips_per_host} per VM)",
        ]
        if requests.policy is not None:
            lines.append(f"workload policy {names.policy}: HIGH_THROUGHPUT, accelerator "
                         f"topology {cluster.topology}")
        lines += [
            f"instance template {names.template}: {cluster.machine_type}, image "
            f"{cluster.boot_image}, {sched['provisioningModel']}"
            + (f" from reservation {cluster.reservation}" if cluster.reservation else "")
            + f"{run_limit}, guest attributes on (host keys)",
            f"managed instance group {names.group} in {requests.region}: {acc.hosts} VM"
            f"{'s' if acc.hosts > 1 else ''} in bulk mode (all at once or none), one zone, "
            "a failed VM kept for inspection",
            f"SSH as {site.user} with {site.identity_file}; engine {config.train.engine}; the "
            "VMs run as the project's default service account (provider gce makes no bucket or "
            "service account yet)",
            f"cost: {self.price()}",
        ]
        if not cluster.ssh_source_ranges:
            lines.append("missing: cluster.ssh_source_ranges (`up` refuses without it)")
        if sched["provisioningModel"] in ("STANDARD", "SPOT"):
            lines.append("note: Compute Engine documents bulk mode for flex-start and "
                         "reservation-bound templates; a first real run must confirm it takes "
                         f"{sched['provisioningModel']} TPU VMs")
        return lines

    def planned_fleet(self) -> Fleet:
        acc = self._config().cluster.slice
        workers = tuple(Worker(index=i, host=f"<{self.site.tpu_name} VM {i}>",
                               address=f"<VM {i} internal address>",
                               coordination_port=COORDINATOR_PORT)
                        for i in range(acc.hosts))
        return Fleet(workers=workers, hardware=Hardware.tpu(acc.name, self.site.tpu_name))

    def price(self) -> str | None:
        return self._config().cluster.hourly_price().describe()

    def connect(self, workers: tuple[Worker, ...]) -> SshExecutor:
        settings = SshSettings(user=self.site.user, known_hosts=self.site.known_hosts,
                               identity_file=self.site.identity_file)
        return SshExecutor(workers, settings, unreachable_hint="check the slice with "
                           "`tpuctl status`; a preempted slice comes back with `tpuctl down` "
                           "then `tpuctl up`")

    def worker_config(self, config: RunConfig):
        return config

    def stage_inputs(self, config: RunConfig, on_event: Callable[[str], None]):
        """A local corpus goes to gs://BUCKET/corpus/, as on gcp (launcher.staging)."""
        from launcher import staging

        return staging.staged_config(config, on_event=on_event)

    def reach(self, fleet: Fleet) -> dict:
        return {"provider": NAME, **dataclasses.asdict(self.site),
                "zones": list(self.site.zones), "region": self.region,
                "accelerator": self.accelerator}

    # -- up --------------------------------------------------------------------------------------
    def up(self, on_event: Callable[[str], None]) -> None:
        config = self._config()
        if not config.cluster.ssh_source_ranges:
            raise UserError("cluster.ssh_source_ranges is not set: `tpuctl up` opens SSH only "
                            "to the addresses you list", hint="add the address you connect "
                            "from, for example ssh_source_ranges: [203.0.113.7/32]")
        gce_api.clients()  # no credentials: one line, before anything
        terraform.require_terraform()
        api, owned = self.api, self.owned
        public_key = gcp_site.ensure_key(Path(self.site.identity_file))
        requests = gce_slice.slice_requests(config, user=self.site.user, public_key=public_key)
        existing = set()
        for kind, body in requests.in_order():  # a name taken by someone else stops `up`
            found = api.get(kind, body["name"])  # before anything is made
            if found is not None and not owned.is_ours(kind, found.name, str(found.id)):
                raise UserError(self._foreign_note(kind, found.name, str(found.id)),
                                hint="rename the run (its name names the slice)")
            if found is not None:
                changed = _drift(kind, body, found)
                if changed:
                    raise UserError(f"the run's {WHAT[kind]} {body['name']} was made with "
                                    f"{changed}", hint="`tpuctl down`, then `tpuctl up` makes "
                                    "it as the config now says (tpuctl never changes a slice "
                                    "under a job)")
                existing.add((kind, body["name"]))
        tf = self._terraform()
        applied = False
        try:
            storage.write_text(str(tf.folder / terraform.VARS_FILE), json.dumps(
                gce_slice.terraform_variables(config, user=self.site.user,
                                              public_key=public_key), indent=2) + "\n")
            missing = [body["name"] for kind, body in requests.in_order()
                       if (kind, body["name"]) not in existing]
            if missing:
                on_event(f"terraform: {', '.join(missing)}")
            tf.init(on_event)
            applied = True
            try:
                tf.apply(on_event)
            finally:
                # No resource of these names was anyone else's before the apply (checked
                # above): the ones there now, after it worked or failed halfway, are the ones
                # Terraform made for the run.
                for kind, name in requests.names.owned():
                    found = api.get(kind, name)
                    if found is not None:
                        owned.record(kind, name, str(found.id))
            vms = self._wait_running(config, on_event)
            self._write_known_hosts(vms, on_event)
        except BaseException as exc:
            if applied:
                on_event("up failed: removing the slice so that nothing bills")
                try:
                    self._destroy(tf, on_event)
                except UserError as undo:
                    on_event(f"could not remove all of it: {undo}; `tpuctl down` tries again")
            if isinstance(exc, UserError):
                raise UserError(f"{exc.message}; nothing of the slice is left billing",
                                hint=exc.hint or "fix it, then `tpuctl up` again") from None
            raise
        acc = config.cluster.slice
        mismatch = gce_slice.accelerators.host_mismatch(acc, len(vms))
        if mismatch:
            on_event(mismatch)
        on_event(f"slice {requests.names.group} is RUNNING in {config.cluster.zone}: "
                 f"{len(vms)} VM(s); {self.price()}. When done: `tpuctl down`")

    def _terraform(self) -> terraform.Terraform:
        """The run's Terraform folder for its slice: TPUCTL_HOME/infra/gce/RUN."""
        folder = state_dir() / layout.INFRA_DIR / NAME / self.site.run_name
        return terraform.Terraform(folder, module=SLICE_MODULE)

    def _spare_foreign(self, tf: terraform.Terraform, on_event: Callable[[str], None]) -> None:
        """Terraform finds its resources by name: one of the run's names that is not the run's
        own (the run's was deleted, someone made another) leaves the state before Terraform
        could delete it."""
        by_kind = {}
        for kind, name in self._names().owned():
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
            if found is not None and not self.owned.is_ours(kind, name, str(found.id)):
                doomed.append(address)
                on_event(f"terraform: took {WHAT[kind]} {name} out of the run's state (it is "
                         "not the run's own), so that Terraform does not delete it")
        tf.forget(doomed)

    def _destroy(self, tf: terraform.Terraform, on_event: Callable[[str], None]) -> None:
        if not tf.state_file.exists():
            return
        if not (tf.folder / terraform.VARS_FILE).exists():
            raise UserError(f"the run's Terraform folder {tf.folder} has no variables",
                            hint="run `tpuctl up` once, then `tpuctl down`")
        tf.init(on_event)
        self._spare_foreign(tf, on_event)
        tf.destroy(on_event)

    def _wait_running(self, config: RunConfig, on_event: Callable[[str], None]):
        """Poll the MIG until all its VMs are RUNNING; say each change of state once."""
        name, api = self._names().group, self.api
        deadline = time.monotonic() + gcp_site.READY_TIMEOUT_S
        last = ""
        while True:
            group = api.group(name)
            if group is None:
                raise UserError(f"instance group {name} disappeared while waiting",
                                hint="`tpuctl up` again")
            vms = api.managed_instances(name) if not group.bulk_in_progress else []
            running = [vm for vm in vms if vm.status == "RUNNING"]
            if vms and len(running) == group.target_size:
                return running
            state = _group_state(group, vms)
            if state != last:
                on_event(f"slice {name}: {state}")
                last = state
            dead = [vm for vm in vms if vm.status in ("TERMINATED", "STOPPED", "SUSPENDED")]
            if dead:
                raise UserError(f"VM {dead[0].name} of slice {name} is {dead[0].status} "
                                "instead of RUNNING", hint="`tpuctl down` removes the slice")
            if time.monotonic() > deadline:
                raise UserError(f"slice {name} was not RUNNING after "
                                f"{gcp_site.READY_TIMEOUT_S / 60:.0f} minutes ({state})",
                                hint="`tpuctl status` shows it; `tpuctl down` removes it")
            time.sleep(gcp_site.POLL_S)

    def _write_known_hosts(self, vms, on_event: Callable[[str], None] | None = None) -> None:
        """known_hosts from every VM's published host key, waited for; never trust on first use."""
        api = self.api
        deadline = time.monotonic() + gcp_site.HOST_KEYS_WAIT_S
        said = False
        keys: dict[str, str] = {}
        while True:
            for vm in vms:
                if vm.name not in keys:
                    key = api.host_keys(vm).get(tpu_api.HOST_KEY_TYPE)
                    if key:
                        keys[vm.name] = key
            missing = [vm.name for vm in vms if vm.name not in keys]
            if not missing:
                break
            if time.monotonic() >= deadline:
                raise UserError(
                    f"VM {missing[0]} publishes no {tpu_api.HOST_KEY_TYPE} host key in its "
                    f"guest attributes after {gcp_site.HOST_KEYS_WAIT_S / 60:g} minutes, so its "
                    "identity cannot be checked",
                    hint=f"the org policy {tpu_api.GUEST_ATTRIBUTES_POLICY} may hide guest "
                    "attributes: ask an admin to allow them; tpuctl never trusts a host key on "
                    "first use")
            if not said and on_event is not None:
                on_event(f"waiting for the host key of VM {missing[0]} (the guest agent "
                         "publishes it after boot)")
                said = True
            time.sleep(min(gcp_site.POLL_S, max(0.1, deadline - time.monotonic())))
        lines = [f"{vm.ssh_address} {tpu_api.HOST_KEY_TYPE} {keys[vm.name]}" for vm in vms]
        storage.write_text(self.site.known_hosts, "\n".join(lines) + "\n")

    # -- the fleet -------------------------------------------------------------------------------
    def _own_group(self):
        """The run's MIG (the job's own when reopened from a record), or a UserError."""
        name, site = self._names().group, self.site
        group = self.api.group(name)
        if group is None:
            if site.uid:
                raise UserError(f"the job's machines are gone: instance group {name} no longer "
                                f"exists in {self.region}",
                                hint="start a new job (`tpuctl up`, then `tpuctl train`)")
            raise UserError(f"no slice {name} in {self.region} of project {site.project}",
                            hint="create it with `tpuctl up`")
        if site.uid and group.uid != site.uid:
            raise UserError(f"the job's machines are gone: instance group {name} was "
                            f"recreated (id {site.uid}, now {group.uid})",
                            hint="its new VMs do not run that job; start a new one")
        if not site.uid and not self.owned.is_ours("groups", name, group.uid):
            raise UserError(self._foreign_note("groups", name, group.uid),
                            hint="tpuctl runs jobs only on a slice `tpuctl up` made for the run")
        return group

    def fleet(self) -> Fleet:
        group = self._own_group()
        vms = self.api.managed_instances(group.name)
        if len(vms) != group.target_size or any(vm.status != "RUNNING" for vm in vms):
            raise UserError(f"slice {group.name} is {_group_state(group, vms)}, not RUNNING",
                            hint="see `tpuctl status`; a preempted slice comes back with "
                            "`tpuctl down` then `tpuctl up`")
        self._write_known_hosts(vms)
        self.site = dataclasses.replace(self.site, uid=group.uid)
        workers = tuple(Worker(index=i, host=vm.ssh_address, address=vm.internal_ip,
                               coordination_port=COORDINATOR_PORT) for i, vm in enumerate(vms))
        return Fleet(workers=workers, hardware=Hardware.tpu(self.accelerator, group.name))

    def describe(self) -> list[str]:
        name = self._names().group
        group = self.api.group(name)
        if group is None:
            return [f"slice {name}: none in {self.region} (bring it up with `tpuctl up`)"]
        if not self.owned.is_ours("groups", name, group.uid):
            return [f"slice {name}: none of this run's in {self.region}",
                    f"  {self._foreign_note('groups', name, group.uid)}"]
        vms = self.api.managed_instances(name) if not group.bulk_in_progress else []
        config = self._config()
        acc = config.cluster.slice
        lines = [f"slice {name} ({acc.name} = {config.cluster.topology} on "
                 f"{config.cluster.machine_type} in {config.cluster.zone}): "
                 f"{_group_state(group, vms)}"]
        lines += [f"  worker-{i}: {vm.name} {vm.status} {vm.ssh_address} (internal "
                  f"{vm.internal_ip})" for i, vm in enumerate(vms)]
        left = _time_left(vms)
        if left is not None:
            lines.append(f"  run limit: {left / 3600:.1f} h left before Compute Engine deletes "
                         "the VMs (max_run_hours)")
        lines.append(f"  cost: {self._running_cost(vms)}")
        return lines

    def _running_cost(self, vms) -> str:
        from payload.cloud import prices

        price = self._config().cluster.hourly_price()
        created = min((vm.created for vm in vms if vm.created), default=None)
        per_hour = f"${price.usd_per_hour:,.2f}/h" if price.known else price.describe()
        if created is None:
            return per_hour
        hours = max(0.0, time.time() - created) / 3600
        spent = (f", about ${price.cost_usd(hours):,.2f} so far" if price.known else "")
        return f"{per_hour}; up {hours:.1f} h{spent} (price table of {prices.PRICE_TABLE_DATE})"

    def billing(self) -> str | None:
        name = self._names().group
        group = self.api.group(name)
        if group is None or not self.owned.is_ours("groups", name, group.uid):
            return None
        price = self._config().cluster.hourly_price() if self.config is not None else None
        cost = f" (${price.usd_per_hour:,.2f}/h)" if price is not None and price.known else ""
        return f"slice {name} is still up{cost}: run `tpuctl down` when you are done"

    def trouble(self) -> str | None:
        name = self._names().group
        group = self.api.group(name)
        if group is None:
            return f"slice {name} was deleted"
        if self.site.uid and group.uid != self.site.uid:
            return f"slice {name} was recreated (id {self.site.uid}, now {group.uid})"
        vms = self.api.managed_instances(name)
        gone = [vm for vm in vms if vm.status != "RUNNING"]
        if gone or len(vms) < group.target_size:
            first = gone[0] if gone else None
            return (f"VM {first.name} of slice {name} is {first.status}" if first
                    else f"slice {name} has {len(vms)} of its {group.target_size} VMs")
        return None

    def record_billing(self, output_dir: str) -> None:
        name = self._names().group
        group = self.api.group(name)
        if group is not None and group.created and self.owned.is_ours("groups", name,
                                                                        group.uid):
            budget.record_node(output_dir, uid=group.uid, zone=self.site.zones[0],
                               created=group.created)

    def doctor(self) -> list[Check]:
        from launcher.providers import gce_doctor

        return list(gce_doctor.checks(self))

    def node_to_delete(self, on_event: Callable[[str], None]) -> NodeToDelete:
        """The run's own MIG (its VMs go with it), by the id `up` recorded; worker 0 deletes it
        with the VMs' service account (the project's default compute one, which needs
        compute.instanceGroupManagers.delete; Editor has it)."""
        group = self._own_group()
        on_event(f"--down: worker 0 deletes slice {group.name} when the job ends (with the VMs' "
                 "service account); `tpuctl down` removes its template and policy")
        return NodeToDelete(api="compute", project=self.site.project, zone=self.site.zones[0],
                            region=self.region, name=group.name, uid=group.uid,
                            api_endpoint=gce_api.stand_in())

    def recover(self, on_event: Callable[[str], None]) -> None:
        """A spot or flex-start VM that was taken back cannot be restarted, and a bulk MIG with
        defaultActionOnFailure DO_NOTHING does not replace it: delete the run's own MIG (its
        VMs with it), then `up` again from the same template and policy."""
        config = self._config()
        name = self._names().group
        group = self.api.group(name)
        if group is not None:
            if not self.owned.is_ours("groups", name, group.uid):
                raise UserError(f"cannot recover: {self._foreign_note('groups', name, group.uid)}",
                                hint="the run resumes with `tpuctl up` then `tpuctl train "
                                "--resume` once that name is free")
            vms = self.api.managed_instances(name) if not group.bulk_in_progress else []
            on_event(f"deleting instance group {name} ({_group_state(group, vms)})")
            self.api.delete("groups", name)
            if config.output_dir:
                budget.record_deleted(config.output_dir, group.uid)
        # Gone from Compute Engine, so gone from the state: the next apply makes a new one.
        tf = self._terraform()
        tf.forget([a for a in tf.addresses()
                   if "google_compute_region_instance_group_manager" in a])
        self.up(on_event)
        self.site = dataclasses.replace(self.site, uid=None)

    # -- down ------------------------------------------------------------------------------------
    def _delete_own(self, kind: str, name: str, on_event: Callable[[str], None]) -> str | None:
        """Delete the resource of that name if it is the run's own; the foreign note if not."""
        found = self.api.get(kind, name)
        if found is None:
            return None
        if not self.owned.is_ours(kind, name, str(found.id)):
            return self._foreign_note(kind, name, str(found.id))
        if self.api.delete(kind, name):
            on_event(f"deleted {WHAT[kind]} {name}")
        return None

    def down(self, on_event: Callable[[str], None], *, delete_bucket: bool = False) -> None:
        if delete_bucket:
            raise UserError("--delete-bucket: provider gce makes no bucket yet, so it deletes "
                            "none", hint="leave --delete-bucket out")
        owned = self._names().owned()
        tf = self._terraform()
        if not self.owned.known() and not tf.state_file.exists():
            found = [(kind, self.api.get(kind, name)) for kind, name in owned]
            foreign = [self._foreign_note(kind, r.name, str(r.id)) for kind, r in found if r]
            raise UserError(f"run {self.site.run_name} was never brought up from this machine "
                            f"and Compute Engine shows nothing of it in {self.region}"
                            + (f"; {foreign[0]}" if foreign else ""),
                            hint="nothing to take down")
        gce_api.clients()  # no credentials: one line, before anything
        self._destroy(tf, on_event)
        foreign = []
        # Terraform removed what its state holds; anything of the run's own it does not hold
        # (a state lost, an `up` cut short) goes through the API, the MIG (and its VMs) first.
        for kind, name in reversed(owned):
            note = self._delete_own(kind, name, on_event)
            if note:
                foreign.append(note)
        left = []
        for kind, name in owned:
            found = self.api.get(kind, name)
            if found is not None and self.owned.is_ours(kind, found.name, str(found.id)):
                left.append(f"{WHAT[kind]} {found.name}")
        if left:
            raise UserError("still there after `down`: " + "; ".join(left),
                            hint="run `tpuctl down` again; if it stays, delete it in the console")
        for note in foreign:
            on_event(note)
        on_event(f"nothing of run {self.site.run_name} is left billing in {self.region} "
                 "(checked through the Compute Engine API)")



def _drift(kind: str, body: dict, found) -> str | None:
    """How a resource the run made differs from what the config asks for now, in words (the
    fields that decide what the slice is), or None."""
    if kind == "templates":
        props, sent = found.properties, body["properties"]
        scheduling = props.scheduling
        had = (props.machine_type, scheduling.provisioning_model,
               str(scheduling.max_run_duration.seconds) if scheduling.max_run_duration
               and scheduling.max_run_duration.seconds else None)
        wanted = (sent["machineType"], sent["scheduling"]["provisioningModel"],
                  sent["scheduling"].get("maxRunDuration", {}).get("seconds"))
    elif kind == "groups":
        had, wanted = (int(found.target_size),), (body["targetSize"],)
    elif kind == "policies":
        had = (found.workload_policy.accelerator_topology,)
        wanted = (body["workloadPolicy"]["acceleratorTopology"],)
    else:
        had, wanted = (sorted(found.source_ranges),), (sorted(body.get("sourceRanges", [])),)
    if had == wanted:
        return None
    return f"{', '.join(map(str, had))}; the config now asks for {', '.join(map(str, wanted))}"


def _group_state(group, vms) -> str:
    """The MIG's state in words: waiting for capacity, creating, or RUNNING."""
    if group.bulk_in_progress:
        why = f" ({group.last_error})" if group.last_error else ""
        return f"waiting for capacity for all {group.target_size} VMs at once{why}"
    running = sum(vm.status == "RUNNING" for vm in vms)
    topology = f", topology {group.topology_state}" if group.topology_state else ""
    if vms and running == group.target_size:
        return f"RUNNING, {running} of {group.target_size} VMs{topology}"
    states = ", ".join(sorted({vm.status for vm in vms})) or "no VMs yet"
    return f"creating: {running} of {group.target_size} VMs RUNNING ({states}){topology}"


def _time_left(vms) -> float | None:
    """Seconds until Compute Engine ends the first VM of a run limit (maxRunDuration)."""
    ends = [vm.created + vm.max_run_s for vm in vms if vm.created and vm.max_run_s]
    return max(0.0, min(ends) - time.time()) if ends else None
