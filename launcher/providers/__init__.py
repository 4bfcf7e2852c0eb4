"""Where the workers come from and how to reach them: one provider per `cluster.provider`.

    provider = provider_for(config, local_override=False, num_workers=None)
    fleet = provider.fleet()                      # the workers and their hardware
    with provider.connect(fleet.workers) as executor: ...
    reach = provider.reach(fleet)                 # what a job record keeps
    same = reopen(reach, fleet.workers)           # the provider again, from a job record

- local: worker processes on this machine, each in its own folder under the state folder.
- ssh: the hosts in `cluster.hosts`, reached with the configured user, key and known_hosts.
- gcp: a TPU VM or pod slice that `tpuctl up` creates (Terraform) and whose workers the TPU API
  names (gcp.py, with gcp_site.py and gcp_infra.py).
- gce: Compute Engine TPU VMs (TPU7x, v6e, v5p), a machine type and topology as a managed
  instance group (gce.py, with gce_infra.py, gce_owned.py, gce_slice.py and gce_api.py).

This module is the one place that reads `cluster.provider`; everything else asks the provider
(what the fleet is, how to reach it, whether it is in trouble), never which provider it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.plan import Worker
from launcher.providers import gce, gcp, local, ssh
from launcher.providers.base import Fleet, Provider
from payload.core.errors import UserError

if TYPE_CHECKING:
    from payload.config import RunConfig


__all__ = ["PROVIDERS", "Fleet", "Provider", "provider_for", "reopen"]

# The one table of providers: `cluster.provider` -> the class that serves it.
PROVIDERS: dict[str, type] = {
    local.NAME: local.LocalProvider,
    ssh.NAME: ssh.SshProvider,
    gcp.NAME: gcp.GcpProvider,
    gce.NAME: gce.GceProvider,
}


def provider_for(config: RunConfig, *, local_override: bool = False,
                 num_workers: int | None = None) -> Provider:
    """The provider for the config's cluster; `local_override` (--local) runs any config as
    local processes."""
    name = local.NAME if local_override else config.cluster.provider
    return PROVIDERS[name].from_config(config, num_workers=num_workers)


def reopen(reach: dict, workers: tuple[Worker, ...]) -> Provider:
    """The provider of a recorded job, rebuilt from its record alone (`Provider.reach`)."""
    kind = PROVIDERS.get(reach.get("provider", ""))
    if kind is None:
        raise UserError(f"the job's record names provider {reach.get('provider')!r}, which "
                        "this version of tpuctl does not have")
    return kind.from_reach(reach, workers)
