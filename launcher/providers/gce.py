"""Compute Engine TPU VMs: `provider: gce` (TPU7x, v6e, v5p as machine types in MIGs).

    provider = GceProvider.from_config(config, num_workers=None)
    print("\\n".join(provider.up_plan()))   # the policy, template and MIG, and the price: no calls
    provider.up(on_event=print)              # made, all VMs RUNNING, host keys written
    fleet = provider.fleet()                 # workers from listManagedInstances + instances.get
    provider.describe()                      # MIG and VM state, flex-start time left, price
    provider.down(on_event=print)            # MIG, template, policy gone, checked through the API

The provider's face; its rooms: launcher.providers.gce_infra (`up`, `down` and recovery through
Terraform on infra/modules/tpu_slice), gce_owned (what of Compute Engine is the run's own: a
name proves nothing; tpuctl deletes a MIG, template, workload policy or firewall rule only when
its unique id is one it recorded making, and a VM only by deleting the run's own MIG it belongs
to), gce_slice (the requests as data), gce_api (Compute Engine), gce_doctor, and gcp_site (the
site, key and known_hosts both Google providers share: host keys come from each VM's guest
attributes, polled until the guest agent publishes them, and SSH is strict from the first
connection). `recover` (--auto-resume) replaces a MIG whose VMs were taken back;
`node_to_delete` (train --down) names the run's own MIG for worker 0 to delete
(payload.cloud.self_delete). Not built yet: a bucket and service account for gce.

With cluster.slices: N the run's TPU is N MIGs, RUN-0 .. RUN-(N-1), each with its own workload
policy (gce_slice): the fleet is every slice's VMs, slice by slice (each slice's libtpu told its
own VMs; MEGASCALE_* from the strategy, as on gcp); any slice lost is trouble for all of them,
and `recover` replaces every slice's MIG (docs/multislice.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher import terraform
from launcher.executors import SshExecutor, SshSettings
from launcher.plan import NodeToDelete, Worker
from launcher.providers import gce_api, gce_infra, gce_owned, gce_slice, multislice
from launcher.providers.base import Check, Fleet
from launcher.providers.gcp_site import Site
from launcher.records import state_dir
from payload.cloud import accelerators, budget
from payload.core import layout
from payload.core.errors import UserError
from payload.training.strategy import Hardware

if TYPE_CHECKING:
    from payload.config import RunConfig


NAME = "gce"
# The slice's Terraform module (tests point this at tests/terraform_twin_slice).
SLICE_MODULE = terraform.INFRA_DIR / "modules" / "tpu_slice"
# The port JAX's coordinator listens on, on worker 0 (what jax.distributed.initialize is given).
COORDINATOR_PORT = 8476


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
        # The slices' name: one slice's MIG is called so; several are TPU_NAME-i (Site.node_names).
        site = Site.of(config, zones=(config.cluster.zone,), tpu_name=config.name)
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
    def owned(self) -> gce_owned.Ownership:
        if self.config is not None:
            return gce_infra.ownership(self.config, self.site)
        return gce_owned.Ownership(self.site.run_name, self.api, slices=self.site.slices)

    @property
    def names(self) -> gce_slice.SliceNames:
        return gce_slice.SliceNames.of(self.site.run_name, self.site.slices)

    def _terraform(self) -> terraform.Terraform:
        """The run's Terraform folder for its slice: TPUCTL_HOME/infra/gce/RUN."""
        folder = state_dir() / layout.INFRA_DIR / NAME / self.site.run_name
        return terraform.Terraform(folder, module=SLICE_MODULE)

    # -- up and down (launcher.providers.gce_infra) -----------------------------------------------
    def up_plan(self) -> list[str]:
        return gce_infra.up_plan(self._config(), self.site)

    def up(self, on_event: Callable[[str], None]) -> None:
        gce_infra.up(self._config(), self.site, self._terraform(), on_event)

    def down(self, on_event: Callable[[str], None], *, delete_bucket: bool = False) -> None:
        gce_infra.down(self._config(), self.site, self._terraform(), on_event,
                       delete_bucket=delete_bucket)

    def recover(self, on_event: Callable[[str], None]) -> None:
        """A spot or flex-start VM that was taken back is deleted (its termination action) and
        cannot be restarted, and a VM the MIG might make again would not be part of the job:
        delete the run's own MIGs (their VMs with them), every slice's, the running ones too (one
        lost slice stops the job on all of them), then `up` again from the same template and
        policies, which makes every slice anew."""
        config = self._config()
        owned = self.owned
        found = [(name, group) for name in self.names.groups
                 if (group := self.api.group(name)) is not None]
        for name, group in found:  # nothing is deleted while one of them is someone else's
            if not owned.is_ours("groups", name, group.uid):
                raise UserError(f"cannot recover: {owned.foreign_note('groups', name, group.uid)}",
                                hint="the run resumes with `tpuctl up` then `tpuctl train "
                                "--resume` once that name is free")
        for name, group in found:
            vms = self.api.managed_instances(name) if not group.bulk_in_progress else []
            on_event(f"deleting instance group {name} ({gce_infra.group_state(group, vms)})")
            self.api.delete("groups", name)
            if config.output_dir:
                budget.record_deleted(config.output_dir, group.uid)
        gce_infra.recreate(config, self.site, self._terraform(), on_event)
        self.site = dataclasses.replace(self.site, uid=None)

    # -- without credentials -------------------------------------------------------------------
    def planned_fleet(self) -> Fleet:
        top = self._config().cluster.tpu_topology
        per = top.hosts_per_slice
        names = multislice.slice_names(self.site.tpu_name, top.num_slices)
        addresses = tuple(f"<VM {i} internal address>" for i in range(top.hosts))
        # Each slice's libtpu is told its own VMs (worker ids 0.. within the slice).
        workers = tuple(Worker(index=i, host=f"<{names[top.slice_of_host(i)]} VM {i % per}>",
                               address=addresses[i], coordination_port=COORDINATOR_PORT,
                               slice_env=self._slice_env(
                                   i % per, addresses[i - i % per:i - i % per + per]))
                        for i in range(top.hosts))
        return Fleet(workers=workers, hardware=Hardware.tpu(top.name, self.site.tpu_name,
                                                            slices=top.num_slices))

    def _slice_env(self, worker: int, addresses: tuple[str, ...],
                   group: str = "") -> tuple[tuple[str, str], ...]:
        """What libtpu on one VM is told about the slice (payload.cloud.accelerators.slice_env):
        its worker id, every VM's internal address in worker order (`localhost` on a one-VM
        slice, as GKE has it) and the slice's shape; () when reopened from a job record."""
        if self.config is None:
            return ()
        cluster = self.config.cluster
        if len(addresses) != cluster.slice.hosts:
            raise UserError(f"slice {group or self.site.tpu_name} has {len(addresses)} VMs; "
                            f"{cluster.topology} on {cluster.machine_type} is "
                            f"{cluster.slice.hosts}", hint="see `tpuctl status`; `tpuctl down` "
                            "then `tpuctl up` makes it again")
        hostnames = addresses if len(addresses) > 1 else ("localhost",)
        return tuple(accelerators.slice_env(cluster.machine_type, cluster.topology,
                                            worker=worker, hostnames=hostnames).items())

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

    # -- the fleet -------------------------------------------------------------------------------
    def _own_groups(self) -> list[gce_api.Group]:
        """The run's MIGs, one per slice, each there and the run's own (the job's own when
        reopened from a record: their ids, comma-joined, are the site's uid), or a UserError."""
        site, owned = self.site, self.owned
        groups = []
        for name in self.names.groups:
            group = self.api.group(name)
            if group is None:
                if site.uid:
                    raise UserError(f"the job's machines are gone: instance group {name} no "
                                    f"longer exists in {self.region}",
                                    hint="start a new job (`tpuctl up`, then `tpuctl train`)")
                raise UserError(f"no slice {name} in {self.region} of project {site.project}",
                                hint="create it with `tpuctl up`" + (
                                    " (it makes every slice)" if site.slices > 1 else ""))
            if not site.uid and not owned.is_ours("groups", name, group.uid):
                raise UserError(owned.foreign_note("groups", name, group.uid),
                                hint="tpuctl runs jobs only on a slice `tpuctl up` made for the "
                                "run")
            groups.append(group)
        uid = _uid(groups)
        if site.uid and uid != site.uid:
            raise UserError(f"the job's machines are gone: the instance group(s) of "
                            f"{site.tpu_name} were recreated (id {site.uid}, now {uid})",
                            hint="their new VMs do not run that job; start a new one")
        return groups

    def fleet(self) -> Fleet:
        """Every slice's VMs, slice by slice (worker i is on slice i // VMs per slice, as the
        strategy numbers them); each slice's libtpu is told its own VMs."""
        groups = self._own_groups()
        by_group = []
        for group in groups:
            vms = self.api.managed_instances(group.name)
            if len(vms) != group.target_size or any(vm.status != "RUNNING" for vm in vms):
                raise UserError(f"slice {group.name} is {gce_infra.group_state(group, vms)}, "
                                "not RUNNING", hint="see `tpuctl status`; a preempted slice "
                                "comes back with `tpuctl down` then `tpuctl up`")
            by_group.append((group, vms))
        gce_infra.write_known_hosts(self.site, self.api,
                                    [vm for _, vms in by_group for vm in vms])
        self.site = dataclasses.replace(self.site, uid=_uid(groups))
        workers: list[Worker] = []
        for group, vms in by_group:
            addresses = tuple(vm.internal_ip for vm in vms)
            workers += [Worker(index=len(workers) + i, host=vm.ssh_address,
                               address=vm.internal_ip, coordination_port=COORDINATOR_PORT,
                               slice_env=self._slice_env(i, addresses, group.name))
                        for i, vm in enumerate(vms)]
        return Fleet(workers=tuple(workers), hardware=Hardware.tpu(
            self.accelerator, self.site.tpu_name, slices=len(groups)))

    def describe(self) -> list[str]:
        lines, worker, owned = [], 0, self.owned
        config = self._config()
        cluster = config.cluster
        acc = cluster.slice
        several = len(self.names.groups) > 1
        # Each slice's cost at one slice's price (the run's is N times that).
        price = cluster.model_copy(update={"slices": 1}).hourly_price()
        for name in self.names.groups:
            group = self.api.group(name)
            if group is None:
                lines.append(f"slice {name}: none in {self.region} (bring it up with `tpuctl up`"
                             + (", which makes every slice)" if several else ")"))
                continue
            if not owned.is_ours("groups", name, group.uid):
                lines += [f"slice {name}: none of this run's in {self.region}",
                          f"  {owned.foreign_note('groups', name, group.uid)}"]
                continue
            vms, waiting = (self.api.managed(name) if not group.bulk_in_progress
                            else ([], None))
            lines.append(f"slice {name} ({acc.name} = {cluster.topology} on "
                         f"{cluster.machine_type} in {cluster.zone}): "
                         f"{gce_infra.group_state(group, vms, waiting)}")
            for vm in vms:
                lines.append(f"  worker-{worker}: {vm.name} {vm.status} {vm.ssh_address} "
                             f"(internal {vm.internal_ip})")
                worker += 1
            left = gce_infra.time_left(vms)
            if left is not None:
                lines.append(f"  run limit: {left / 3600:.1f} h left before Compute Engine "
                             "deletes the VMs (max_run_hours)")
            lines.append(f"  cost: {gce_infra.running_cost(price, vms)}")
        return lines

    def _billing_groups(self) -> list[gce_api.Group]:
        """The run's own MIGs that are there now."""
        owned, found = self.owned, []
        for name in self.names.groups:
            group = self.api.group(name)
            if group is not None and owned.is_ours("groups", name, group.uid):
                found.append(group)
        return found

    def billing(self) -> str | None:
        groups = self._billing_groups()
        if not groups:
            return None
        cost = ""
        if self.config is not None:
            one = self.config.cluster.model_copy(update={"slices": 1}).hourly_price()
            if one.known:
                cost = (f" ({len(groups)} slices x ${one.usd_per_hour:,.2f}/h)"
                        if len(groups) > 1 else f" (${one.usd_per_hour:,.2f}/h)")
        names = multislice.names_words(tuple(g.name for g in groups))
        return (f"slice{'s' if len(groups) > 1 else ''} {names} "
                f"{'are' if len(groups) > 1 else 'is'} still up{cost}: run `tpuctl down` when "
                "you are done")

    def trouble(self) -> str | None:
        """Why the job cannot go on; with several slices, one lost slice (a VM of it) stops
        every one: `recover` replaces them all."""
        groups = []
        for name in self.names.groups:
            group = self.api.group(name)
            if group is None:
                return f"slice {name} was deleted"
            groups.append(group)
        if self.site.uid and _uid(groups) != self.site.uid:
            return (f"slice {self.site.tpu_name} was recreated (id {self.site.uid}, now "
                    f"{_uid(groups)})")
        for group in groups:
            name = group.name
            vms = self.api.managed_instances(name)
            gone = [vm for vm in vms if vm.status != "RUNNING"]
            if gone:
                return f"VM {gone[0].name} of slice {name} is {gone[0].status}"
            if len(vms) < group.target_size:
                # A spot or flex-start VM taken back (or one at its run limit) is deleted, not
                # stopped (instanceTerminationAction DELETE): it is simply no longer there.
                return (f"slice {name} lost a VM: {len(vms)} of its {group.target_size} left "
                        "(Compute Engine deletes a VM it takes back)")
        return None

    def record_billing(self, output_dir: str) -> None:
        """Every slice's MIG the run owns, in billing.json: what the time and cost limits
        count (node-hours over the slices, payload.cloud.budget)."""
        for group in self._billing_groups():
            if group.created:
                budget.record_node(output_dir, uid=group.uid, zone=self.site.zones[0],
                                   created=group.created)

    def doctor(self) -> list[Check]:
        from launcher.providers import gce_doctor

        return list(gce_doctor.checks(self))

    def node_to_delete(self, on_event: Callable[[str], None]) -> NodeToDelete:
        """The run's own MIG (its VMs go with it), by the id `up` recorded; worker 0 deletes it
        with the VMs' service account (the project's default compute one, which needs
        compute.instanceGroupManagers.delete; Editor has it). One slice only: worker 0 of a
        multislice job would delete the others' MIGs from under them."""
        multislice.check_one_slice(self._config(), "`train --down`")
        [group] = self._own_groups()
        on_event(f"--down: worker 0 deletes slice {group.name} when the job ends (with the VMs' "
                 "service account); `tpuctl down` removes its template and policy")
        return NodeToDelete(api="compute", project=self.site.project, zone=self.site.zones[0],
                            region=self.region, name=group.name, uid=group.uid,
                            api_endpoint=gce_api.stand_in())


def _uid(groups: list[gce_api.Group]) -> str:
    """The slices' MIG ids, comma-joined slice by slice (one slice: its id), as gcp's nodes'."""
    return ",".join(str(group.uid) for group in groups)
