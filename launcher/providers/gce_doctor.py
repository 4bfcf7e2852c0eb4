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
    yield gcp_doctor._unless(needs_api, BRING_UP_CHECK, lambda: _bring_up(provider))


# What the last check asks: whether the slice is what libtpu will be told it is.
BRING_UP_CHECK = "the slice forms (VMs, topology, what libtpu is told)"


def _bring_up(provider: CheckedProvider) -> str:
    """The run's slice as libtpu on its VMs will be told it is (the launcher sets it: the
    fleet's slice_env, payload.cloud.accelerators.slice_env): as many RUNNING VMs as the
    topology has hosts, each with its own internal address, and on a multi-host slice the
    workload policy's topology applied to the MIG and ACTIVE; with several slices, each."""
    said = []
    for name in provider.names.groups:  # every slice, each its own ICI domain
        group = provider.api.group(name)
        if group is None or not provider.owned.is_ours("groups", name, group.uid):
            return ("no slice yet; checked after `tpuctl up`" if not said else
                    f"slice {name} is missing; `tpuctl down` then `tpuctl up` makes every slice")
        said.append(_one_slice_forms(provider, group))
    several = len(said) > 1
    return "; ".join(f"{name}: {words}" if several else words
                     for name, words in zip(provider.names.groups, said, strict=True))


def _one_slice_forms(provider: CheckedProvider, group) -> str:
    from payload.cloud import accelerators

    config = provider._config()
    cluster = config.cluster
    acc = cluster.slice
    name = group.name
    vms = provider.api.managed_instances(name)
    running = [vm for vm in vms if vm.status == "RUNNING"]
    if len(running) != acc.hosts:
        raise UserError(f"slice {name} has {len(running)} RUNNING VMs of the {acc.hosts} that "
                        f"{cluster.topology} on {cluster.machine_type} needs",
                        hint="see `tpuctl status`; `tpuctl down` then `tpuctl up` makes it "
                             "again")
    addresses = [vm.internal_ip for vm in running]
    if len(set(addresses)) != len(addresses) or not all(addresses):
        raise UserError(f"the VMs of slice {name} do not each have an internal address of "
                        f"their own ({', '.join(addresses)})", hint="see `tpuctl status`")
    if acc.is_multi_host and group.topology_state != "ACTIVE":
        raise UserError(f"slice {name}'s accelerator topology {cluster.topology} is "
                        f"{group.topology_state or 'not applied'}"
                        + (f" ({group.topology_error})" if group.topology_error else ""),
                        hint="`tpuctl up` waits for ACTIVE; `tpuctl down` then `tpuctl up` "
                             "makes the slice again")
    env = accelerators.slice_env(cluster.machine_type, cluster.topology, worker=0,
                                 hostnames=tuple(addresses) if acc.is_multi_host
                                 else ("localhost",))
    return (f"{acc.hosts} VM(s) RUNNING"
            + (f", topology {cluster.topology} ACTIVE" if acc.is_multi_host else "")
            + f"; TPU_WORKER_HOSTNAMES={env['TPU_WORKER_HOSTNAMES']}, TPU_HOST_BOUNDS="
            f"{env['TPU_HOST_BOUNDS']}; JAX should see {acc.jax_devices} devices")


def _reach(provider: CheckedProvider) -> str:
    vms = []
    for name in provider.names.groups:
        group = provider.api.group(name)
        if group is None or not provider.owned.is_ours("groups", name, group.uid):
            return "no slice yet; checked after `tpuctl up`"
        vms += [vm for vm in provider.api.managed_instances(name) if vm.status == "RUNNING"]
    return gcp_doctor.port_22_answers([(f"VM {vm.name}", vm.ssh_address) for vm in vms], "VM")
