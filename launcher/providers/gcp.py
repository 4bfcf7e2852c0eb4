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

With cluster.slices: N the run's TPU is N nodes, TPU_NAME-0 .. TPU_NAME-(N-1), made by one
queued request (gcp_infra): the fleet is every slice's workers, slice by slice; any slice lost
is trouble for all of them, and `recover` replaces every slice (docs/multislice.md).
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

    def _ready_slices(self) -> gcp_site.Slices:
        """The run's node (one per slice), every one READY and the run's own, or a UserError."""
        site = self.site
        found = gcp_site.find_slices(site, self.api)
        if found is None:
            if site.uid:
                raise UserError(f"the job's machines are gone: TPU {site.tpu_name} no longer "
                                f"exists in project {site.project}",
                                hint="start a new job (`tpuctl up`, then `tpuctl train`)")
            raise UserError(f"no TPU {site.tpu_name} in {', '.join(site.zones)} of project "
                            f"{site.project}", hint="create it with `tpuctl up`")
        if site.uid and found.uid != site.uid:
            now = (f"now {found.uid}" if found.uid else
                   f"{', '.join(found.missing)} no longer there")
            raise UserError(f"the job's machines are gone: TPU {site.tpu_name} was recreated "
                            f"(id {site.uid}, {now})",
                            hint="its new workers do not run that job; start a new one")
        owned = self._owned()
        # A job's own nodes (site.uid, checked above) were claimed when the job started.
        for node in found.present:
            if not site.uid and not owned.node_is_ours(node):
                raise UserError(owned.foreign_note(node, found.zone),
                                hint="tpuctl runs jobs only on a TPU `tpuctl up` made for the run")
        if not found.ready:
            raise UserError(f"TPU {site.tpu_name} is {found.describe()}, not READY",
                            hint="see `tpuctl status`; a preempted TPU comes back with "
                            "`tpuctl down` then `tpuctl up`")
        return found

    def _owned(self) -> gcp_owned.Ownership:
        return gcp_owned.Ownership(self.site, output_dir=self.config.output_dir
                                   if self.config is not None else None)

    # -- the Provider protocol ---------------------------------------------------------------
    def fleet(self) -> Fleet:
        """Every slice's workers from the API, slice by slice (worker i is on slice
        i // hosts per slice, as the strategy numbers them)."""
        found = self._ready_slices()
        gcp_site.write_known_hosts(self.site, self.api, found)
        self.site = dataclasses.replace(self.site, uid=found.uid)
        workers = tuple(
            Worker(index=i, host=gcp_site.ssh_address(e), address=e.internal_ip,
                   coordination_port=gcp_site.TPU_WORKER_PORT)
            for i, e in enumerate(found.endpoints))
        return Fleet(workers=workers, hardware=Hardware.tpu(
            found.present[0].accelerator_type, self.site.tpu_name, slices=len(found.names)))

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
        """Why the job cannot go on; with several slices, one lost slice stops every one (the
        service restarts them all: so does `recover`)."""
        found = gcp_site.find_slices(self.site, self.api)
        name = self.site.tpu_name
        if found is None:
            return f"TPU {name} was deleted"
        if found.missing:
            return f"TPU {found.missing[0]} was deleted"
        if self.site.uid and found.uid != self.site.uid:
            return f"TPU {name} was recreated (id {self.site.uid}, now {found.uid})"
        gone = found.gone()
        if gone is not None:
            return f"TPU {gone.name} is {gone.describe()}"
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
        found = gcp_site.find_slices(self.site, self.api)
        if found is None:
            return [f"TPU {self.site.tpu_name}: none in {', '.join(self.site.zones)} "
                    f"(bring it up with `tpuctl up`)"]
        owned, zone, lines, worker = self._owned(), found.zone, [], 0
        for name, node in zip(found.names, found.nodes, strict=True):
            if node is None:
                lines.append(f"TPU {name}: none in {zone} (`tpuctl up` makes every slice)")
                continue
            if not owned.node_is_ours(node):
                lines += [f"TPU {name}: none of this run's in {', '.join(self.site.zones)}",
                          f"  {owned.foreign_note(node, zone)}"]
                continue
            lines.append(f"TPU {node.name} ({node.accelerator_type} in {zone}): "
                         f"{node.describe()}")
            for e in node.endpoints:
                lines.append(f"  worker-{worker}: {gcp_site.ssh_address(e)} "
                             f"(internal {e.internal_ip})")
                worker += 1
            lines.append(f"  cost: {gcp_infra.running_cost(node, zone, self.site.provisioning)}")
        return lines

    def _billing_nodes(self) -> tuple[list, str]:
        """The run's own nodes that bill now, and their zone."""
        found = gcp_site.find_slices(self.site, self.api)
        if found is None:
            return [], ""
        owned = self._owned()
        return [n for n in found.present
                if n.state not in GONE_STATES and owned.node_is_ours(n)], found.zone

    def billing(self) -> str | None:
        nodes, zone = self._billing_nodes()
        if not nodes:
            return None
        price = gcp_infra.node_price(nodes[0], zone, self.site.provisioning)
        if len(nodes) > 1:
            price = f"{len(nodes)} slices x {price}"
        names = multislice.names_words(tuple(n.name for n in nodes))
        return (f"TPU {names} {'is' if len(nodes) == 1 else 'are'} still up ({price}): run "
                "`tpuctl down` when you are done")

    def doctor(self) -> list[Check]:
        return list(gcp_doctor.checks(self._config(), self.site))

    def node_to_delete(self, on_event: Callable[[str], None]) -> NodeToDelete:
        multislice.check_one_slice(self._config(), "`train --down`")
        found = self._ready_slices()
        node = found.present[0]
        gcp_infra.allow_self_delete(self._config(), self.site, on_event)
        return NodeToDelete(project=self.site.project, zone=found.zone, name=node.name,
                            uid=node.uid, api_endpoint=stand_in())

    def record_billing(self, output_dir: str) -> None:
        """Every slice the run owns, in billing.json: what the time and cost limits count."""
        found = gcp_site.find_slices(self.site, self.api)
        if found is None:
            return
        owned = self._owned()
        for node in found.present:
            if node.create_time is not None and owned.node_is_ours(node):
                budget.record_node(output_dir, uid=node.uid, zone=found.zone,
                                   created=node.create_time)

    def recover(self, on_event: Callable[[str], None]) -> None:
        """Delete the preempted node (it still holds quota), then `up` again: the same zone, or
        the next fallback zone when it has no capacity. With several slices, every slice goes
        and comes back as one request (one lost slice stops the job on all of them)."""
        config, site = self._config(), self.site
        found = gcp_site.find_slices(site, self.api)
        if found is not None:
            owned = self._owned()
            for node in found.present:
                if not owned.node_is_ours(node):
                    raise UserError(f"cannot recover: {owned.foreign_note(node, found.zone)}",
                                    hint="the run resumes with `tpuctl up` then `tpuctl train "
                                    "--resume` once that name is free")
            for node in found.present:
                on_event(f"deleting TPU {node.name} ({node.describe()}) in {found.zone}")
                self.api.delete_node(node.name, found.zone)
                if config.output_dir:
                    budget.record_deleted(config.output_dir, node.uid)
        gcp_infra.recreate(config, site, on_event)
        self.site = dataclasses.replace(self.site, uid=None)

    def up(self, on_event: Callable[[str], None]) -> None:
        gcp_infra.up(self._config(), self.site, on_event)

    def down(self, on_event: Callable[[str], None], *, delete_bucket: bool = False) -> None:
        gcp_infra.down(self._config(), self.site, on_event, delete_bucket=delete_bucket)

    def up_plan(self) -> list[str]:
        return gcp_infra.up_plan(self._config(), self.site)

    def _config(self):
        if self.config is None:
            raise UserError("up and down work from the run config", hint="pass -c tpuctl.yaml")
        return self.config
