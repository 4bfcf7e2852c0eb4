"""`tpuctl up` and `tpuctl down` for the gce provider: Terraform makes the slice, Compute Engine
shows it coming up, and a check through the API that nothing of the run is left billing.

    print("\\n".join(up_plan(config, site)))   # what `up --dry-run` shows: no credentials
    up(config, site, tf, on_event=print)        # made, all VMs RUNNING, host keys written
    down(config, site, tf, on_event=print)      # MIGs, template, policies, rules gone, checked
    recreate(config, site, tf, on_event=print)  # after the run's MIGs were deleted (--auto-resume)

With cluster.slices: N the run's slices are N MIGs in the one Terraform state (gce_slice
says why): `up` waits for every one and a bring-up that fails part way destroys them all
through the saved-plan path; nothing of a partial bring-up is left billing.

`tf` is the run's Terraform folder on infra/modules/tpu_slice (launcher.providers.gce makes it);
its variables are launcher.providers.gce_slice's. What of Compute Engine is the run's own, and so
what `down` may delete, is launcher.providers.gce_owned's to say.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from launcher import terraform
from launcher.providers import gce_api, gce_owned, gce_slice, gcp_site, multislice
from launcher.providers.gcp_site import Site
from payload.cloud import accelerators, tpu_api
from payload.core import storage
from payload.core.errors import UserError

if TYPE_CHECKING:
    from payload.config import RunConfig


def compute_api(config: RunConfig, site: Site) -> gce_api.ComputeApi:
    return gce_api.ComputeApi(project=site.project, region=gce_slice.region_of(config))


def ownership(config: RunConfig, site: Site) -> gce_owned.Ownership:
    return gce_owned.Ownership(site.run_name, compute_api(config, site),
                               policy=config.cluster.slice.is_multi_host,
                               slices=config.cluster.slices)


# -- without credentials -----------------------------------------------------------------------


def up_plan(config: RunConfig, site: Site) -> list[str]:
    """What `tpuctl up` would create and what it costs per hour; reads nothing remote."""
    cluster = config.cluster
    acc = cluster.slice
    requests = gce_slice.slice_requests(config, user=site.user, public_key="(the run's key)")
    names, chosen = requests.names, requests.provisioning
    sched = requests.template["properties"]["scheduling"]
    disk = requests.template["properties"]["disks"][0]["initializeParams"]
    run_limit = (f", deleted after {cluster.max_run_hours:g} h (maxRunDuration)"
                 if cluster.max_run_hours is not None else "")
    ending = (f", {sched['instanceTerminationAction']} when Compute Engine ends one"
              if "instanceTerminationAction" in sched else "")
    facts = ", ".join(name for name in accelerators.SLICE_ENV_NAMES
                      if name not in ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES"))
    lines = [
        f"project {cluster.project}, zone {cluster.zone} (region {requests.region})",
        f"firewall rules {names.ssh_rule}: tcp/22 from "
        f"{', '.join(cluster.ssh_source_ranges or ['(not set)'])}; {names.internal_rule}: "
        f"the slice's VMs to each other (network tag {names.tag})",
        f"{_slices_word(names)}: {acc.name} = {cluster.topology} on {acc.hosts} x "
        f"{cluster.machine_type} ({acc.in_words()}; {acc.chips_per_host} chips per VM)"
        + (", each a managed instance group of its own" if len(names.groups) > 1 else ""),
        *multislice.slices_lines(cluster.tpu_topology),
    ]
    if requests.policies:
        several = len(requests.policies) > 1
        lines.append(f"workload polic{'ies' if several else 'y'} "
                     f"{multislice.names_words(names.policies)}: HIGH_THROUGHPUT, accelerator "
                     f"topology {cluster.topology} (AUTO_CONNECT), named by "
                     + ("each slice's MIG (one policy per MIG)" if several else "the MIG"))
    lines += [
        f"instance template {names.template_prefix}<unique id>: {cluster.machine_type}, "
        f"{sched['provisioningModel']}"
        + (f" from reservation {cluster.reservation}" if cluster.reservation else "")
        + f"{run_limit}{ending}, guest attributes on (host keys)",
        f"image {disk['sourceImage']}"
        + ("" if cluster.image_note else f" (Google's TPU image for TPU {acc.generation})")
        + f"; boot disk {disk['diskSizeGb']} GB {disk['diskType']}",
        f"managed instance group{'s' if len(names.groups) > 1 else ''} "
        f"{multislice.names_words(names.groups)} in {requests.region}: {acc.hosts} VM"
        f"{'s' if acc.hosts > 1 else ''} "
        + ("each, all " if len(names.groups) > 1 else "")
        + "in one zone, a failed VM kept for inspection",
        chosen.describe(acc.hosts),
        (f"slice bring-up: libtpu on each VM is told the slice ({facts}), its worker id "
         f"(TPU_WORKER_ID 0..{acc.hosts - 1}, the VMs by name) and every VM's internal address "
         f"in that order (TPU_WORKER_HOSTNAMES)" if acc.is_multi_host else
         f"slice bring-up: libtpu on the VM is told the slice ({facts}), TPU_WORKER_ID 0 and "
         "TPU_WORKER_HOSTNAMES localhost, as GKE tells a one-host slice")
        + f"; JAX then sees the {acc.jax_devices} devices",
        f"SSH as {site.user} with {site.identity_file}; engine {config.train.engine}; the "
        "VMs run as the project's default service account (provider gce makes no bucket or "
        "service account yet)",
        f"cost: {cluster.hourly_price().describe()}" + multislice.per_slice_price(config),
    ]
    if not cluster.ssh_source_ranges:
        lines.append("missing: cluster.ssh_source_ranges (`up` refuses without it)")
    if cluster.image_note:
        lines.append(f"warning: {cluster.image_note}")
    return lines


# -- up ------------------------------------------------------------------------------------------


def up(config: RunConfig, site: Site, tf: terraform.Terraform,
       on_event: Callable[[str], None]) -> None:
    if not config.cluster.ssh_source_ranges:
        raise UserError("cluster.ssh_source_ranges is not set: `tpuctl up` opens SSH only "
                        "to the addresses you list", hint="add the address you connect "
                        "from, for example ssh_source_ranges: [203.0.113.7/32]")
    gce_api.clients()  # no credentials: one line, before anything
    terraform.require_terraform()
    api, owned = compute_api(config, site), ownership(config, site)
    owned.take_over(tf, on_event)  # an `up` cut short: what its Terraform made is the run's
    public_key = gcp_site.ensure_key(Path(site.identity_file))
    requests = gce_slice.slice_requests(config, user=site.user, public_key=public_key)
    missing = []
    for kind, body in requests.in_order():  # a name taken by someone else stops `up`
        # before anything is made; the template's name is the one Terraform's state holds.
        names = owned.in_state(tf, kind) if kind == "templates" else [body["name"]]
        found = [made for name in names if (made := api.get(kind, name)) is not None]
        for made in found:
            if not owned.is_ours(kind, made.name, str(made.id)):
                raise UserError(owned.foreign_note(kind, made.name, str(made.id)),
                                hint="rename the run (its name names the slice)")
            changed = _drift(kind, body, made)
            if changed:
                raise UserError(f"the run's {gce_owned.WHAT[kind]} {made.name} was made "
                                f"with {changed}", hint="`tpuctl down`, then `tpuctl up` "
                                "makes it as the config now says (tpuctl never changes a "
                                "slice under a job)")
        if not found:
            missing.append(body.get("name") or f"{requests.names.template_prefix}<unique id>")
    applied = False
    try:
        storage.write_text(str(tf.folder / terraform.VARS_FILE), json.dumps(
            gce_slice.terraform_variables(config, user=site.user, public_key=public_key),
            indent=2) + "\n")
        if missing:
            on_event(f"terraform: {', '.join(missing)}")
        tf.init(on_event)
        tf.plan(on_event, vet=owned.vet)  # refused: nothing was applied, nothing to undo
        applied = True
        apply(tf, owned, on_event)
        vms = wait_ready(config, api, on_event)
        write_known_hosts(site, api, [vm for slice_vms in vms.values() for vm in slice_vms],
                          on_event)
    except BaseException as exc:
        end = "nothing of the slice is left billing"
        if applied:
            on_event("cancelled (Ctrl-C): removing the request and whatever it made, so that "
                     "nothing bills" if isinstance(exc, KeyboardInterrupt)
                     else "up failed: removing the slice so that nothing bills")
            try:
                destroy(tf, owned, on_event)
            except UserError as undo:
                on_event(f"could not remove all of it: {undo}; `tpuctl down` tries again")
            try:
                left = owned.still_there(*owned.left())
            except UserError as unread:
                left = f"what is left could not be read back ({unread.message})"
            end = f"still there: {left}" if left else end
            if isinstance(exc, KeyboardInterrupt):
                on_event(end)
        if isinstance(exc, UserError):
            raise UserError(f"{exc.message}; {end}",
                            hint=exc.hint or "fix it, then `tpuctl up` again") from None
        raise
    acc, names = config.cluster.slice, requests.names
    for group in names.groups:
        mismatch = accelerators.host_mismatch(acc, len(vms[group]))
        if mismatch:
            on_event(mismatch)
    several = len(names.groups) > 1
    on_event(f"{_slices_word(names)} {'are' if several else 'is'} RUNNING in "
             f"{config.cluster.zone}: {sum(len(v) for v in vms.values())} VM(s)"
             + (f", {acc.hosts} per slice" if several else "")
             + f"; {config.cluster.hourly_price().describe()}. When done: `tpuctl down`")


def _slices_word(names: gce_slice.SliceNames) -> str:
    """"slice trillium", "slices trillium-0 and trillium-1"."""
    several = len(names.groups) > 1
    return f"slice{'s' if several else ''} {multislice.names_words(names.groups)}"


def apply(tf: terraform.Terraform, owned: gce_owned.Ownership,
          on_event: Callable[[str], None]) -> None:
    """Terraform's apply of the plan `owned.vet` let through, with the ids of what it makes
    recorded as it makes them, whatever ends it (a failure, Ctrl-C; after a SIGKILL, the next
    `up` or `down` records them)."""

    def made() -> None:
        with contextlib.suppress(UserError):  # Compute Engine not answering: recorded after
            owned.record_made(tf)

    owned.before_apply(tf)
    try:
        tf.apply_plan(on_event, on_made=made)
    finally:
        owned.after_apply(tf)


def recreate(config: RunConfig, site: Site, tf: terraform.Terraform,
             on_event: Callable[[str], None]) -> None:
    """After the run's MIGs were deleted (VMs taken back): gone from Compute Engine, so gone
    from the state, and `up` again makes every slice's anew from the same template and
    policies."""
    tf.forget([a for a in tf.addresses()
               if "google_compute_region_instance_group_manager" in a])
    up(config, site, tf, on_event)


def destroy(tf: terraform.Terraform, owned: gce_owned.Ownership,
            on_event: Callable[[str], None]) -> None:
    """Terraform removes what its state holds, after a resource of the run's names that is not
    the run's own has left the state."""
    if not tf.state_file.exists():
        return
    if not (tf.folder / terraform.VARS_FILE).exists():
        raise UserError(f"the run's Terraform folder {tf.folder} has no variables",
                        hint="run `tpuctl up` once, then `tpuctl down`")
    tf.init(on_event)
    owned.spare_foreign(tf, on_event)
    tf.destroy(on_event, vet=owned.vet)


def wait_ready(config: RunConfig, api: gce_api.ComputeApi,
               on_event: Callable[[str], None]) -> dict[str, list[gce_api.Vm]]:
    """Poll every slice's MIG until every VM is RUNNING and, on multi-host slices, each applied
    accelerator topology is ACTIVE; say each change of a slice's state once, with what Compute
    Engine says it waits for (quota, capacity). A FAILED topology or a lost VM of any slice ends
    the wait at once (the caller removes every slice); otherwise it lasts as long as the
    provisioning allows (cluster.queue_hours, or its model's default). The RUNNING VMs of each
    slice, by MIG name, slice by slice."""
    cluster = config.cluster
    names = gce_slice.SliceNames.of(config.name, cluster.slices).groups
    chosen = gce_slice.provisioning(cluster)
    deadline = time.monotonic() + chosen.wait_s
    last = dict.fromkeys(names, "")
    while True:
        ready = {}
        for name in names:
            running = _look_at(config, api, name, last, chosen, deadline, on_event)
            if running is not None:
                ready[name] = running
        if len(ready) == len(names):
            return ready
        pause()


def _look_at(config: RunConfig, api: gce_api.ComputeApi, name: str, last: dict[str, str],
             chosen: gce_slice.Provisioning, deadline: float,
             on_event: Callable[[str], None]) -> list[gce_api.Vm] | None:
    """One look at one slice's MIG: its RUNNING VMs once it is ready, None while it is not
    (its state said once per change, in `last`), a UserError once it cannot be."""
    cluster = config.cluster
    topology = cluster.slice.is_multi_host
    group = api.group(name)
    if group is None:
        raise UserError(f"instance group {name} disappeared while waiting",
                        hint="`tpuctl up` again")
    vms, waiting = api.managed(name) if not group.bulk_in_progress else ([], None)
    running = [vm for vm in vms if vm.status == "RUNNING"]
    ready = vms and len(running) == group.target_size
    if ready and (not topology or group.topology_state == "ACTIVE"):
        return running
    state = group_state(group, vms, waiting)
    if state != last[name]:
        on_event(f"slice {name}: {state}")
        if _is_quota(group.last_error or waiting) and not _is_quota(last[name]):
            on_event(f"slice {name}: Compute Engine keeps the request until the quota "
                     "allows it: ask for more TPU quota in the region (IAM & Admin > "
                     "Quotas), or Ctrl-C to cancel it"
                     + (" (the VMs made meanwhile bill)" if chosen.partial_bills else
                        " (nothing bills meanwhile)"))
        last[name] = state
    if topology and group.topology_state == "FAILED":
        raise UserError(f"the accelerator topology {cluster.topology} of slice {name} "
                        f"FAILED" + (f" ({group.topology_error})" if group.topology_error
                                     else ""),
                        hint="`tpuctl up` again makes a new slice; if it fails again, see "
                             "`gcloud compute instance-groups managed describe "
                             f"{name} --region {api.region}`")
    dead = [vm for vm in vms if vm.status in ("TERMINATED", "STOPPED", "SUSPENDED")]
    if dead:
        raise UserError(f"VM {dead[0].name} of slice {name} is {dead[0].status} "
                        "instead of RUNNING", hint="`tpuctl down` removes the slice")
    if time.monotonic() > deadline:
        raise UserError(f"slice {name} was not ready after {_hours(chosen.wait_s)} "
                        f"({state})", hint="set cluster.queue_hours to wait longer; "
                        "`tpuctl status` shows the slice, `tpuctl down` removes it")
    return None


def pause() -> None:
    """The wait between two looks at the slice (where a test steps in)."""
    time.sleep(gcp_site.POLL_S)


def _is_quota(error: str | None) -> bool:
    return bool(error) and "QUOTA_EXCEEDED" in error


def _hours(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes" if seconds < 3600 else f"{seconds / 3600:g} h"


def write_known_hosts(site: Site, api: gce_api.ComputeApi, vms: list[gce_api.Vm],
                      on_event: Callable[[str], None] | None = None) -> None:
    """known_hosts from every VM's published host key (gcp_site.wait_for_host_keys)."""
    by_name = {f"VM {vm.name}": vm for vm in vms}
    gcp_site.wait_for_host_keys(
        site, [(name, vm.ssh_address) for name, vm in by_name.items()],
        lambda missing: {name: api.host_keys(by_name[name]).get(tpu_api.HOST_KEY_TYPE)
                         for name in missing},
        on_event=on_event)


# -- down ----------------------------------------------------------------------------------------


def down(config: RunConfig, site: Site, tf: terraform.Terraform,
         on_event: Callable[[str], None], *, delete_bucket: bool = False) -> None:
    if delete_bucket:
        raise UserError("--delete-bucket: provider gce makes no bucket yet, so it deletes "
                        "none", hint="leave --delete-bucket out")
    api, owned = compute_api(config, site), ownership(config, site)
    if not owned.known() and not owned.applying() and not tf.state_file.exists():
        found = [(kind, api.get(kind, name)) for kind, name in owned.made]
        foreign = [owned.foreign_note(kind, r.name, str(r.id)) for kind, r in found if r]
        raise UserError(f"run {site.run_name} was never brought up from this machine "
                        f"and Compute Engine shows nothing of it in {api.region}"
                        + (f"; {foreign[0]}" if foreign else ""),
                        hint="nothing to take down")
    gce_api.clients()  # no credentials: one line, before anything
    owned.take_over(tf, on_event)  # an `up` cut short: what its Terraform made is the run's
    try:
        destroy(tf, owned, on_event)
    except UserError as exc:  # what stays is named below, with what to do
        on_event(f"terraform could not remove all of it: {exc.message}")
    # Terraform removed what its state holds; anything of the run's own it does not hold
    # (a state lost) goes through the API, the MIG (and its VMs) first.
    for kind, name in reversed(owned.run_names()):
        try:
            owned.delete_own(kind, name, on_event)
        except UserError as exc:  # in use by something that is not the run's: named below
            on_event(f"could not delete {gce_owned.WHAT[kind]} {name}: {exc.message}")
    own, foreign = owned.left()
    if own or foreign:
        for kind, name, uid in foreign:
            on_event(owned.foreign_note(kind, name, uid))
        raise UserError(
            f"still there after `down`: {owned.still_there(own, foreign)}",
            hint=("tpuctl deletes only what it recorded making, and a name proves nothing: "
                  "if one is the run's after all (an `up` cut short can leave one), delete it "
                  "yourself, then `tpuctl down` again") if foreign else
            "run `tpuctl down` again; if it stays, delete it in the console")
    on_event(f"nothing of run {site.run_name} is left billing in {api.region} "
             "(checked through the Compute Engine API)")


# -- what it is, in words --------------------------------------------------------------------


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


def group_state(group: gce_api.Group, vms: list[gce_api.Vm],
                waiting: str | None = None) -> str:
    """The MIG's state in words: waiting (for quota or capacity, as Compute Engine says),
    creating, or RUNNING, with its applied topology."""
    if group.bulk_in_progress:
        return (f"waiting for {_waited_for(group.last_error)} for all {group.target_size} "
                f"VMs at once" + (f" ({group.last_error})" if group.last_error else ""))
    running = sum(vm.status == "RUNNING" for vm in vms)
    topology = f", topology {group.topology_state}" if group.topology_state else ""
    if group.topology_error:
        topology += f" ({group.topology_error})"
    if vms and running == group.target_size:
        return f"RUNNING, {running} of {group.target_size} VMs{topology}"
    states = ", ".join(sorted({vm.status for vm in vms})) or "no VMs yet"
    why = (f"; waiting for {_waited_for(waiting)} for the rest ({waiting})" if waiting else "")
    return (f"creating: {running} of {group.target_size} VMs RUNNING ({states}){topology}"
            f"{why}")


def _waited_for(error: str | None) -> str:
    return "quota" if _is_quota(error) else "capacity"


def time_left(vms: list[gce_api.Vm]) -> float | None:
    """Seconds until Compute Engine ends the first VM of a run limit (maxRunDuration)."""
    ends = [vm.created + vm.max_run_s for vm in vms if vm.created and vm.max_run_s]
    return max(0.0, min(ends) - time.time()) if ends else None


def running_cost(price, vms: list[gce_api.Vm]) -> str:
    """A slice's price per hour (a payload.cloud.prices.Price), time up so far (from its
    first VM's creation) and what that has cost."""
    from payload.cloud import prices

    created = min((vm.created for vm in vms if vm.created), default=None)
    per_hour = f"${price.usd_per_hour:,.2f}/h" if price.known else price.describe()
    if created is None:
        return per_hour
    hours = max(0.0, time.time() - created) / 3600
    spent = (f", about ${price.cost_usd(hours):,.2f} so far" if price.known else "")
    return f"{per_hour}; up {hours:.1f} h{spent} (price table of {prices.PRICE_TABLE_DATE})"
