"""A Cloud TPU VM or pod slice: `provider: gcp`. Terraform makes it, the TPU API finds it.

    provider = GcpProvider.from_config(config, num_workers=None)
    provider.up(on_event=print)          # bucket, firewall, service account, TPU; READY; host keys
    fleet = provider.fleet()             # workers from the API's networkEndpoints, hardware tpu
    provider.trouble()                   # "TPU demo is PREEMPTED ..." or None
    provider.down(on_event=print)        # the TPU (and a queued request) gone, checked by listing

Workers' addresses and host keys are read from the TPU API every time a command starts (a TPU
recreated after a preemption has new ones) and written to tpuctl's own known_hosts
(launcher.providers.gcp_site). A job's record keeps the node's unique id: a job is never
reopened on a node that was recreated since.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.executors import SshExecutor, SshSettings
from launcher.plan import NodeToDelete, Worker
from launcher.providers import gcp_doctor, gcp_infra, gcp_owned, gcp_site, multislice
from launcher.providers.base import Check, Fleet
from launcher.providers.gcp_site import Site
from payload.cloud import budget
from payload.cloud.tpu_api import GONE_STATES, stand_in
from payload.core.errors import UserError
from payload.training.strategy import Hardware

if TYPE_CHECKING:
    from payload.config import RunConfig


NAME = "gcp"
UNREACHABLE_HINT = "check the TPU with `tpuctl status`; if it was preempted, `tpuctl up` again"


class GcpProvider:
    name = NAME

    def __init__(self, site: Site, config=None):
        self.site = site
        self.config = config  # None when reopened from a job record
        self.api = site.api

    def __eq__(self, other) -> bool:
        return isinstance(other, GcpProvider) and other.site == self.site

    @classmethod
    def from_config(cls, config: RunConfig, *, num_workers: int | None) -> GcpProvider:
        if num_workers is not None:
            raise UserError("--workers only applies with --local",
                            hint="a TPU runs on all of its hosts; its size is "
                            "cluster.accelerator_type")
        cluster = config.cluster
        site = Site.of(config, zones=(cluster.zone, *cluster.fallback_zones),
                       tpu_name=cluster.tpu_name or config.name)
        return cls(site, config)

    @classmethod
    def from_reach(cls, reach: dict, workers: tuple[Worker, ...]) -> GcpProvider:
        return cls(Site.from_reach(reach))

    def _ready_node(self):
        site = self.site
        found = gcp_site.find_node(site, self.api)
        if found is None:
            if site.uid:
                raise UserError(f"the job's machines are gone: TPU {site.tpu_name} no longer "
                                f"exists in project {site.project}",
                                hint="start a new job (`tpuctl up`, then `tpuctl train`)")
            raise UserError(f"no TPU {site.tpu_name} in {', '.join(site.zones)} of project "
                            f"{site.project}", hint="create it with `tpuctl up`")
        node, zone = found
        if site.uid and node.uid != site.uid:
            raise UserError(f"the job's machines are gone: TPU {site.tpu_name} was recreated "
                            f"(id {site.uid}, now {node.uid})",
                            hint="its new workers do not run that job; start a new one")
        owned = self._owned()
        # A job's own node (site.uid, checked above) was claimed when the job started.
        if not site.uid and not owned.node_is_ours(node):
            raise UserError(owned.foreign_note(node, zone),
                            hint="tpuctl runs jobs only on a TPU `tpuctl up` made for the run")
        if not node.ready or not node.endpoints:
            raise UserError(f"TPU {site.tpu_name} is {node.describe()}, not READY",
                            hint="see `tpuctl status`; a preempted TPU comes back with "
                            "`tpuctl down` then `tpuctl up`")
        return node, zone

    def _owned(self) -> gcp_owned.Ownership:
        return gcp_owned.Ownership(self.site, output_dir=self.config.output_dir
                                   if self.config is not None else None)

    # -- the Provider protocol ---------------------------------------------------------------
    def fleet(self) -> Fleet:
        node, zone = self._ready_node()
        gcp_site.write_known_hosts(self.site, self.api, node, zone)
        self.site = dataclasses.replace(self.site, uid=node.uid)
        workers = tuple(
            Worker(index=i, host=gcp_site.ssh_address(e), address=e.internal_ip,
                   coordination_port=gcp_site.TPU_WORKER_PORT)
            for i, e in enumerate(node.endpoints))
        return Fleet(workers=workers, hardware=Hardware.tpu(node.accelerator_type, node.name))

    def planned_fleet(self) -> Fleet:
        top = self._config().cluster.tpu_topology
        names = multislice.slice_names(self.site.tpu_name, top.num_slices)
        workers = tuple(Worker(index=i, host=f"<{names[top.slice_of_host(i)]} worker "
                                            f"{i % top.hosts_per_slice}>",
                               address=f"<worker {i} internal address>",
                               coordination_port=gcp_site.TPU_WORKER_PORT)
                        for i in range(top.hosts))
        return Fleet(workers=workers, hardware=Hardware.tpu(top.name, self.site.tpu_name,
                                                            slices=top.num_slices))

    def price(self) -> str | None:
        return gcp_infra.hourly_price(self._config()).describe()

    def trouble(self) -> str | None:
        found = gcp_site.find_node(self.site, self.api)
        name = self.site.tpu_name
        if found is None:
            return f"TPU {name} was deleted"
        node, _ = found
        if self.site.uid and node.uid != self.site.uid:
            return f"TPU {name} was recreated (id {self.site.uid}, now {node.uid})"
        if node.state in GONE_STATES:
            return f"TPU {name} is {node.describe()}"
        return None

    def connect(self, workers: tuple[Worker, ...]) -> SshExecutor:
        settings = SshSettings(user=self.site.user, known_hosts=self.site.known_hosts,
                               identity_file=self.site.identity_file)
        return SshExecutor(workers, settings, unreachable_hint=UNREACHABLE_HINT)

    def worker_config(self, config: RunConfig):
        return config

    def stage_inputs(self, config: RunConfig, on_event: Callable[[str], None]):
        """A local corpus goes to gs://BUCKET/corpus/ (launcher.staging): TPU hosts read it
        there. gs:// and hf: entries are left as they are."""
        from launcher import staging

        return staging.staged_config(config, on_event=on_event)

    def reach(self, fleet: Fleet) -> dict:
        return {"provider": NAME, **dataclasses.asdict(self.site),
                "zones": list(self.site.zones)}

    def describe(self) -> list[str]:
        found = gcp_site.find_node(self.site, self.api)
        if found is None:
            return [f"TPU {self.site.tpu_name}: none in {', '.join(self.site.zones)} "
                    f"(bring it up with `tpuctl up`)"]
        node, zone = found
        if not self._owned().node_is_ours(node):
            return [f"TPU {self.site.tpu_name}: none of this run's in "
                    f"{', '.join(self.site.zones)}", f"  {self._owned().foreign_note(node, zone)}"]
        lines = [f"TPU {node.name} ({node.accelerator_type} in {zone}): {node.describe()}"]
        lines += [f"  worker-{i}: {gcp_site.ssh_address(e)} (internal {e.internal_ip})"
                  for i, e in enumerate(node.endpoints)]
        lines.append(f"  cost: {gcp_infra.running_cost(node, zone, self.site.provisioning)}")
        return lines

    def billing(self) -> str | None:
        found = gcp_site.find_node(self.site, self.api)
        if (found is None or found[0].state in GONE_STATES
                or not self._owned().node_is_ours(found[0])):
            return None
        node, zone = found
        price = gcp_infra.node_price(node, zone, self.site.provisioning)
        return (f"TPU {node.name} is still up ({price}): run `tpuctl down` when you are done")

    def doctor(self) -> list[Check]:
        return list(gcp_doctor.checks(self._config(), self.site))

    def node_to_delete(self, on_event: Callable[[str], None]) -> NodeToDelete:
        node, zone = self._ready_node()
        gcp_infra.allow_self_delete(self._config(), self.site, on_event)
        return NodeToDelete(project=self.site.project, zone=zone, name=node.name, uid=node.uid,
                            api_endpoint=stand_in())

    def record_billing(self, output_dir: str) -> None:
        found = gcp_site.find_node(self.site, self.api)
        if (found is not None and found[0].create_time is not None
                and self._owned().node_is_ours(found[0])):
            node, zone = found
            budget.record_node(output_dir, uid=node.uid, zone=zone, created=node.create_time)

    def recover(self, on_event: Callable[[str], None]) -> None:
        """Delete the preempted node (it still holds quota), then `up` again: the same zone, or
        the next fallback zone when it has no capacity."""
        config, site = self._config(), self.site
        found = gcp_site.find_node(site, self.api)
        if found is not None:
            node, zone = found
            owned = self._owned()
            if not owned.node_is_ours(node):
                raise UserError(f"cannot recover: {owned.foreign_note(node, zone)}",
                                hint="the run resumes with `tpuctl up` then `tpuctl train "
                                "--resume` once that name is free")
            on_event(f"deleting TPU {node.name} ({node.describe()}) in {zone}")
            self.api.delete_node(node.name, zone)
            if config.output_dir:
                budget.record_deleted(config.output_dir, node.uid)
        gcp_infra.recreate(config, site, on_event)
        self.site = dataclasses.replace(self.site, uid=None)

    def up(self, on_event: Callable[[str], None]) -> None:
        multislice.check_one_slice(self._config())
        gcp_infra.up(self._config(), self.site, on_event)

    def down(self, on_event: Callable[[str], None], *, delete_bucket: bool = False) -> None:
        gcp_infra.down(self._config(), self.site, on_event, delete_bucket=delete_bucket)

    def up_plan(self) -> list[str]:
        return gcp_infra.up_plan(self._config(), self.site)

    def _config(self):
        if self.config is None:
            raise UserError("up and down work from the run config", hint="pass -c tpuctl.yaml")
        return self.config
