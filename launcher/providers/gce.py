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
    def owned(self) -> gce_owned.Ownership:
        if self.config is not None:
            return gce_infra.ownership(self.config, self.site)
        return gce_owned.Ownership(self.site.run_name, self.api)

    @property
    def names(self) -> gce_slice.SliceNames:
        return gce_slice.SliceNames.of(self.site.run_name)

    def _terraform(self) -> terraform.Terraform:
        """The run's Terraform folder for its slice: TPUCTL_HOME/infra/gce/RUN."""
        folder = state_dir() / layout.INFRA_DIR / NAME / self.site.run_name
        return terraform.Terraform(folder, module=SLICE_MODULE)

    # -- up and down (launcher.providers.gce_infra) -----------------------------------------------
    def up_plan(self) -> list[str]:
        return gce_infra.up_plan(self._config(), self.site)

    def up(self, on_event: Callable[[str], None]) -> None:
        multislice.check_one_slice(self._config(), "gce's `tpuctl up`")
        gce_infra.up(self._config(), self.site, self._terraform(), on_event)

    def down(self, on_event: Callable[[str], None], *, delete_bucket: bool = False) -> None:
        gce_infra.down(self._config(), self.site, self._terraform(), on_event,
                       delete_bucket=delete_bucket)

    def recover(self, on_event: Callable[[str], None]) -> None:
        """A spot or flex-start VM that was taken back is deleted (its termination action) and
        cannot be restarted, and a VM the MIG might make again would not be part of the job:
        delete the run's own MIG (its VMs with it), then `up` again from the same template and
        policy."""
        config = self._config()
        name = self.names.group
        group = self.api.group(name)
        if group is not None:
            owned = self.owned
            if not owned.is_ours("groups", name, group.uid):
                raise UserError(f"cannot recover: {owned.foreign_note('groups', name, group.uid)}",
                                hint="the run resumes with `tpuctl up` then `tpuctl train "
                                "--resume` once that name is free")
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

    def _slice_env(self, worker: int, addresses: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        """What libtpu on one VM is told about the slice (payload.cloud.accelerators.slice_env):
        its worker id, every VM's internal address in worker order (`localhost` on a one-VM
        slice, as GKE has it) and the slice's shape; () when reopened from a job record."""
        if self.config is None:
            return ()
        cluster = self.config.cluster
        if len(addresses) != cluster.slice.hosts:
            raise UserError(f"slice {self.names.group} has {len(addresses)} VMs; "
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
    def _own_group(self):
        """The run's MIG (the job's own when reopened from a record), or a UserError."""
        name, site = self.names.group, self.site
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
            raise UserError(self.owned.foreign_note("groups", name, group.uid),
                            hint="tpuctl runs jobs only on a slice `tpuctl up` made for the run")
        return group

    def fleet(self) -> Fleet:
        group = self._own_group()
        vms = self.api.managed_instances(group.name)
        if len(vms) != group.target_size or any(vm.status != "RUNNING" for vm in vms):
            raise UserError(f"slice {group.name} is {gce_infra.group_state(group, vms)}, not RUNNING",
                            hint="see `tpuctl status`; a preempted slice comes back with "
                            "`tpuctl down` then `tpuctl up`")
        gce_infra.write_known_hosts(self.site, self.api, vms)
        self.site = dataclasses.replace(self.site, uid=group.uid)
        addresses = tuple(vm.internal_ip for vm in vms)
        workers = tuple(Worker(index=i, host=vm.ssh_address, address=vm.internal_ip,
                               coordination_port=COORDINATOR_PORT,
                               slice_env=self._slice_env(i, addresses))
                        for i, vm in enumerate(vms))
        return Fleet(workers=workers, hardware=Hardware.tpu(self.accelerator, group.name))

    def describe(self) -> list[str]:
        name = self.names.group
        group = self.api.group(name)
        if group is None:
            return [f"slice {name}: none in {self.region} (bring it up with `tpuctl up`)"]
        if not self.owned.is_ours("groups", name, group.uid):
            return [f"slice {name}: none of this run's in {self.region}",
                    f"  {self.owned.foreign_note('groups', name, group.uid)}"]
        vms, waiting = (self.api.managed(name) if not group.bulk_in_progress else ([], None))
        config = self._config()
        acc = config.cluster.slice
        lines = [f"slice {name} ({acc.name} = {config.cluster.topology} on "
                 f"{config.cluster.machine_type} in {config.cluster.zone}): "
                 f"{gce_infra.group_state(group, vms, waiting)}"]
        lines += [f"  worker-{i}: {vm.name} {vm.status} {vm.ssh_address} (internal "
                  f"{vm.internal_ip})" for i, vm in enumerate(vms)]
        left = gce_infra.time_left(vms)
        if left is not None:
            lines.append(f"  run limit: {left / 3600:.1f} h left before Compute Engine deletes "
                         "the VMs (max_run_hours)")
        lines.append(f"  cost: {gce_infra.running_cost(config, vms)}")
        return lines

    def billing(self) -> str | None:
        name = self.names.group
        group = self.api.group(name)
        if group is None or not self.owned.is_ours("groups", name, group.uid):
            return None
        price = self._config().cluster.hourly_price() if self.config is not None else None
        cost = f" (${price.usd_per_hour:,.2f}/h)" if price is not None and price.known else ""
        return f"slice {name} is still up{cost}: run `tpuctl down` when you are done"

    def trouble(self) -> str | None:
        name = self.names.group
        group = self.api.group(name)
        if group is None:
            return f"slice {name} was deleted"
        if self.site.uid and group.uid != self.site.uid:
            return f"slice {name} was recreated (id {self.site.uid}, now {group.uid})"
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
        name = self.names.group
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
