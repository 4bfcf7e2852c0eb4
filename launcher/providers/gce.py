"""Compute Engine TPU VMs: `provider: gce` (TPU7x, v6e, v5p as machine types and bulk MIGs).

    provider = GceProvider.from_config(config, num_workers=None)
    print("\\n".join(provider.up_plan()))   # the policy, template and MIG, and the price: no calls
    provider.planned_fleet()                 # the table's hosts, placeholder addresses
    provider.price()                         # "$43.20/h for v6e-16 (...)"

What `up` asks Compute Engine for is built as data in launcher.providers.gce_slice. This version
plans and prices a gce slice without credentials; creating, finding and deleting it through
Compute Engine (up, down, status, train on it) is not built yet and says so in one line.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.executors import SshExecutor, SshSettings
from launcher.plan import NodeToDelete, Worker
from launcher.providers import gce_slice, gcp_site
from launcher.providers.base import Check, Fleet
from launcher.providers.gcp_site import Site
from payload.core.errors import UserError
from payload.training.strategy import Hardware

if TYPE_CHECKING:
    from payload.config import RunConfig


NAME = "gce"
# The port JAX's coordinator listens on, on worker 0 (what jax.distributed.initialize is given).
COORDINATOR_PORT = 8476
NOT_BUILT_HINT = ("`tpuctl up --dry-run` shows the plan and price; run the slice with provider: "
                  "gcp (v5e, v5p, v6e) until this provider can create it")


class GceProvider:
    name = NAME

    def __init__(self, site: Site, config=None):
        self.site = site
        self.config = config  # None when reopened from a job record

    def __eq__(self, other) -> bool:
        return isinstance(other, GceProvider) and other.site == self.site

    @classmethod
    def from_config(cls, config: RunConfig, *, num_workers: int | None) -> GceProvider:
        if num_workers is not None:
            raise UserError("--workers only applies with --local",
                            hint="a slice runs on all of its hosts; its size is "
                            "cluster.machine_type and cluster.topology")
        cluster = config.cluster
        site = Site(run_name=config.name, project=cluster.project, zones=(cluster.zone,),
                    tpu_name=gce_slice.SliceNames.of(config.name).group,
                    user=cluster.user or getpass.getuser(),
                    identity_file=cluster.identity_file or str(
                        gcp_site.default_identity(config.name)),
                    known_hosts=str(gcp_site.run_state(config.name) / "known_hosts"),
                    provisioning=cluster.provisioning)
        return cls(site, config)

    @classmethod
    def from_reach(cls, reach: dict, workers: tuple[Worker, ...]) -> GceProvider:
        kept = {k: reach[k] for k in ("run_name", "project", "tpu_name", "user",
                                      "identity_file", "known_hosts", "provisioning", "uid")}
        return cls(Site(zones=tuple(reach["zones"]), **kept))

    def _config(self) -> RunConfig:
        if self.config is None:
            raise UserError("up and down work from the run config", hint="pass -c tpuctl.yaml")
        return self.config

    def _not_built(self, what: str) -> UserError:
        return UserError(f"provider gce cannot {what} yet: this version plans and prices a "
                         "Compute Engine slice but does not create it", hint=NOT_BUILT_HINT)

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
            f"bucket gs://{cluster.bucket_name} (created unless it exists; kept by `down`)",
            f"firewall rule: tcp/22 from {', '.join(cluster.ssh_source_ranges or ['(not set)'])}",
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
            f"SSH as {site.user} with {site.identity_file}; engine {config.train.engine}",
            f"cost: {self.price()}",
        ]
        if not cluster.ssh_source_ranges:
            lines.append("missing: cluster.ssh_source_ranges (`up` refuses without it)")
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
                           "`tpuctl status`")

    def worker_config(self, config: RunConfig):
        return config

    def stage_inputs(self, config: RunConfig, on_event: Callable[[str], None]):
        """A local corpus goes to gs://BUCKET/corpus/, as on gcp (launcher.staging)."""
        from launcher import staging

        corpus = staging.stage_corpus(config.data.corpus, bucket=config.cluster.bucket_name,
                                      run=config.name, on_event=on_event)
        if corpus == list(config.data.corpus):
            return config
        data = config.data.model_copy(update={"corpus": corpus})
        return config.model_copy(update={"data": data})

    def reach(self, fleet: Fleet) -> dict:
        import dataclasses

        return {"provider": NAME, **dataclasses.asdict(self.site),
                "zones": list(self.site.zones)}

    # -- what needs Compute Engine (not built yet) ---------------------------------------------
    def up(self, on_event: Callable[[str], None]) -> None:
        raise self._not_built("create the slice")

    def down(self, on_event: Callable[[str], None], *, delete_bucket: bool = False) -> None:
        raise self._not_built("take a slice down")

    def fleet(self) -> Fleet:
        raise self._not_built("find the slice's VMs")

    def describe(self) -> list[str]:
        return [f"slice {self.site.tpu_name}: provider gce cannot look it up yet "
                f"({NOT_BUILT_HINT})"]

    def billing(self) -> str | None:
        return None

    def doctor(self) -> list[Check]:
        return [Check("gce set-up", "skip", "not checked by this version; `tpuctl up --dry-run` "
                      "shows the plan and price")]

    def node_to_delete(self, on_event: Callable[[str], None]) -> NodeToDelete:
        raise self._not_built("delete the slice when a job ends (--down)")

    def record_billing(self, output_dir: str) -> None:
        return None

    def recover(self, on_event: Callable[[str], None]) -> None:
        raise self._not_built("replace a preempted slice (--auto-resume)")

    def trouble(self) -> str | None:
        return None
