"""`tpuctl doctor` for gce: what catches a failed Compute Engine slice before it costs anything.

    for check in checks(provider):
        print(check.line())          # "ok    tpu7x-standard-4t offered in us-central1-c" / ...

One line per check, each asking Compute Engine (or the stand-in) one question; nothing is made or
changed. The shared pieces (the verdict helpers, the org-policy checks) are gcp's
(launcher.providers.gcp_doctor).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from launcher.providers import gce_api, gcp_doctor
from launcher.providers.base import Check
from payload.core.errors import UserError


class CheckedProvider(Protocol):
    """What the checks ask of the gce provider (launcher.providers.gce.GceProvider), named
    here so this module needs nothing from the provider's."""

    api: gce_api.ComputeApi
    region: str
    owned: object  # launcher.providers.gce_owned.Ownership: is_ours, foreign_note
    names: object  # launcher.providers.gce_slice.SliceNames

    def _config(self): ...

NEEDS_CREDENTIALS = gcp_doctor.NEEDS_CREDENTIALS


def checks(provider: CheckedProvider) -> Iterator[Check]:
    config = provider._config()
    cluster = config.cluster
    api = provider.api
    def signed_in() -> None:
        gce_api.clients()

    credentials = gcp_doctor._check("Google Cloud credentials", signed_in)
    yield credentials
    needs = None if credentials.verdict == "ok" else NEEDS_CREDENTIALS

    def offered() -> str:
        if not api.machine_type_offered(cluster.zone, cluster.machine_type):
            raise UserError(f"{cluster.zone} does not offer {cluster.machine_type} to project "
                            f"{cluster.project}",
                            hint="pick another zone (cluster.zone) of the generation, or ask "
                                 "your account team for access")
        return "the Compute Engine API answers"

    found = gcp_doctor._unless(needs, f"{cluster.machine_type} offered in {cluster.zone}",
                               offered)
    yield found
    needs_api = needs or (None if found.verdict == "ok" else "needs the machine type (above)")
    yield Check("TPU quota", "skip", "Compute Engine names TPU quotas per generation and region; "
                f"see `gcloud compute regions describe {provider.region} --project "
                f"{cluster.project}` or IAM & Admin > Quotas")

    def names_free() -> str:
        owned = provider.owned
        taken = [owned.foreign_note(kind, r.name, str(r.id)) for kind, name in owned.made
                 if (r := api.get(kind, name)) is not None
                 and not owned.is_ours(kind, name, str(r.id))]
        if taken:
            raise UserError(taken[0], hint="rename the run (its name names the slice)")
        return ""

    yield gcp_doctor._unless(needs_api, "the run's names are free or its own", names_free)

    def ranges() -> str:
        if not cluster.ssh_source_ranges:
            raise UserError("cluster.ssh_source_ranges is not set",
                            hint="add the address you connect from (e.g. 203.0.113.7/32)")
        return ", ".join(cluster.ssh_source_ranges)

    yield gcp_doctor._check("SSH source ranges", ranges)
    if needs or gce_api.stand_in():
        reason = needs or "not checked against the Compute Engine stand-in"
        yield from (Check(name, "skip", reason) for name in gcp_doctor.POLICY_CHECKS)
    else:
        yield from gcp_doctor._remote_policy_checks(cluster)
    yield gcp_doctor._unless(needs_api, gcp_doctor.SSH_CHECK, lambda: _reach(provider))


def _reach(provider: CheckedProvider) -> str:
    name = provider.names.group
    group = provider.api.group(name)
    if group is None or not provider.owned.is_ours("groups", name, group.uid):
        return "no slice yet; checked after `tpuctl up`"
    vms = [vm for vm in provider.api.managed_instances(name) if vm.status == "RUNNING"]
    return gcp_doctor.port_22_answers([(f"VM {vm.name}", vm.ssh_address) for vm in vms], "VM")
