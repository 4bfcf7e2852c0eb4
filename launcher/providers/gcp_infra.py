"""`tpuctl up` and `tpuctl down` for the gcp provider: Terraform for what lasts, the TPU API for
queued requests, and a check by listing that nothing of the run is left billing.

    print("\\n".join(up_plan(config, site)))   # what `up --dry-run` shows: no credentials
    up(config, site, on_event=print)               # idempotent: a second run changes nothing
    down(config, site, on_event=print)             # idempotent; cleans what a failed `up` left

Terraform (infra/) holds the bucket, the SSH firewall rule, the workers' service account and,
unless the request is queued, the TPU VM itself (google_tpu_v2_vm). A queued request goes
through the TPU API because Terraform's queued-resource type has neither spot capacity nor a
queueing deadline: tpuctl always sets the deadline (cluster.queue_hours) and deletes a request
that FAILED or was SUSPENDED, so it never holds quota or turns into a TPU billing with no job.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from launcher import staging, terraform
from launcher.providers import gcp_owned, gcp_site, multislice
from launcher.providers.gcp_site import Site
from payload.cloud import accelerators, prices, tpu_api
from payload.core.errors import UserError

if TYPE_CHECKING:
    from payload.config import RunConfig


# Terraform's module: the repository's infra/ (tests point this at a twin of it).
INFRA_MODULE = terraform.INFRA_DIR

CAPACITY_WORDS = ("RESOURCE_EXHAUSTED", "no more capacity", "capacity", "stockout")
RUN_LABEL = gcp_owned.RUN_LABEL


def terraform_vars(config: RunConfig, site: Site, *, zone: str, create_tpu: bool,
                   create_bucket: bool, public_key: str) -> terraform.TerraformVars:
    """The run config as infra/'s variables: the one place that maps one to the other."""
    cluster = config.cluster
    run_prefix, read_prefixes, corpus_buckets = bucket_access(config)
    return terraform.TerraformVars(
        project=cluster.project, region=accelerators.region_of(zone), zone=zone,
        run_name=config.name, tpu_name=site.tpu_name,
        accelerator_type=cluster.accelerator_type, runtime_version=cluster.runtime,
        provisioning=cluster.provisioning, create_tpu=create_tpu, bucket=cluster.bucket_name,
        create_bucket=create_bucket, run_prefix=run_prefix, read_prefixes=read_prefixes,
        corpus_buckets=corpus_buckets,
        network=cluster.network, subnetwork=cluster.subnetwork,
        ssh_source_ranges=tuple(cluster.ssh_source_ranges or ()), ssh_user=site.user,
        ssh_public_key=public_key, allow_self_delete=site.self_delete_allowed())


_GLOB = re.compile(r"[*?\\[]")


def bucket_access(config: RunConfig) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """What the workers' account may touch in storage (issue 16, point 11): (the run's own
    prefix in the run's bucket, which it may change; the prefixes there it may read: the staged
    corpus/ and every gs:// corpus entry in that bucket; every other bucket a corpus entry is
    in, read-only). The bucket is shared by every run of the project, so nothing is granted on
    all of it."""
    bucket = config.cluster.bucket_name
    out_bucket, _, out_prefix = config.output_dir[len("gs://"):].partition("/")
    run_prefix = (out_prefix.strip("/") if config.output_dir.startswith("gs://")
                  and out_bucket == bucket else config.name)
    read, others = [staging.PREFIX], set()
    for entry in config.data.paths:
        if not entry.startswith("gs://"):
            continue
        entry_bucket, _, path = entry[len("gs://"):].partition("/")
        if entry_bucket != bucket:
            others.add(entry_bucket)
            continue
        glob = _GLOB.search(path)
        # A glob is listed from the folder it starts in; a plain path is one object or folder.
        prefix = path[:max(path.rfind("/", 0, glob.start()), 0)] if glob else path
        if not prefix.strip("/"):
            raise UserError(f"data.corpus: {entry} reads the whole of gs://{bucket}, the bucket "
                            "every run of the project shares; the workers may read only "
                            "folders of it",
                            hint=f"move the files into a folder, e.g. gs://{bucket}/my-corpus/, "
                                 "and name that")
        read.append(prefix.strip("/"))
    return (run_prefix, tuple(dict.fromkeys(read)), tuple(sorted(others)))


def accelerator_of(config: RunConfig) -> accelerators.Accelerator:
    return accelerators.accelerator(config.cluster.accelerator_type)


def hourly_price(config: RunConfig) -> prices.Price:
    return config.cluster.hourly_price()


def node_price(node: tpu_api.Node, zone: str, provisioning: str) -> str:
    """The node's price per hour from the table, as words ("no ... price" when unknown)."""
    try:
        price = prices.hourly_cost(node.accelerator_type, zone, provisioning)
    except UserError:
        return f"no price for {node.accelerator_type}"
    return f"${price.usd_per_hour:,.2f}/h" if price.known else price.describe()


def running_cost(node: tpu_api.Node, zone: str, provisioning: str) -> str:
    """Price per hour, time up so far (from the node's creation) and what that has cost."""
    import time

    per_hour = node_price(node, zone, provisioning)
    if node.create_time is None:
        return per_hour
    hours = max(0.0, time.time() - node.create_time) / 3600
    try:
        price = prices.hourly_cost(node.accelerator_type, zone, provisioning)
    except UserError:
        price = None
    spent = (f", about ${price.cost_usd(hours):,.2f} so far" if price and price.known
             else "")
    return f"{per_hour}; up {hours:.1f} h{spent} (price table of {prices.PRICE_TABLE_DATE})"


def up_plan(config: RunConfig, site: Site) -> list[str]:
    """What `tpuctl up` would create and what it costs per hour; reads nothing remote."""
    cluster = config.cluster
    acc = accelerator_of(config)
    top = cluster.tpu_topology
    how = "a queued request (TPU API)" if _queued(cluster) else "Terraform"
    names = multislice.slice_names(site.tpu_name, top.num_slices)
    if top.num_slices > 1:
        # Terraform's queued resource has no node count (CLOUD-FACTS, Multislice): the TPU
        # API's multislice_params does it.
        how = f"one queued request of {top.num_slices} nodes (TPU API, multislice_params)"
    run_prefix, read_prefixes, corpus_buckets = bucket_access(config)
    reads = [f"gs://{cluster.bucket_name}/{p}/" for p in read_prefixes]
    reads += [f"gs://{b}" for b in corpus_buckets]
    lines = [
        f"project {cluster.project}, zone {cluster.zone}"
        + (f" (then {', '.join(cluster.fallback_zones)})" if cluster.fallback_zones else ""),
        f"bucket gs://{cluster.bucket_name} (created unless it exists; kept by `down`)",
        f"firewall rule: tcp/22 from {', '.join(cluster.ssh_source_ranges or ['(not set)'])}",
        f"service account for the workers: objects under gs://{cluster.bucket_name}/"
        f"{run_prefix}/, read {', '.join(reads)}; get its TPU",
        f"TPU {multislice.names_words(names)}: "
        f"{acc.name} ({acc.chips} chips of TPU {acc.generation}, "
        f"{acc.hosts} host{'s' if acc.hosts > 1 else ''})"
        + (f" each, {top.chips} chips in all" if top.num_slices > 1 else "")
        + f", runtime {cluster.runtime}, {cluster.provisioning.replace('_', '-')}, by {how}"
        + (f", waiting up to {cluster.queue_hours:g} h"
           if _queued(cluster) or top.num_slices > 1 else ""),
        *multislice.slices_lines(top),
        f"SSH as {site.user} with {site.identity_file}",
        f"cost: {hourly_price(config).describe()}" + multislice.per_slice_price(config),
    ]
    if not cluster.ssh_source_ranges:
        lines.append("missing: cluster.ssh_source_ranges (`up` refuses without it)")
    return lines


def _queued(cluster) -> bool:
    # Terraform's TPU VM cannot target a reservation, and its queued resource has no node
    # count (CLOUD-FACTS, Multislice): the TPU API's queue does both.
    return bool(cluster.queued or cluster.reservation or cluster.slices > 1)


def _bucket_exists(bucket: str, project: str) -> bool:
    """Whether the bucket exists and is ours to use; taken by someone else is an error."""
    from google.api_core import exceptions as gexc

    from payload.core import storage

    try:
        return storage.client(project).lookup_bucket(bucket) is not None
    except gexc.Forbidden:
        raise UserError(f"bucket {bucket} exists but this account may not use it (its name is "
                        "taken by another project, or access is missing)",
                        hint="set cluster.bucket to another name") from None


def _is_capacity(error: UserError) -> bool:
    text = str(error)
    return any(word.lower() in text.lower() for word in CAPACITY_WORDS)


def up(config: RunConfig, site: Site, on_event: Callable[[str], None], *,
       zones: list[str] | None = None) -> None:
    cluster, api = config.cluster, site.api
    if not cluster.ssh_source_ranges:
        raise UserError("cluster.ssh_source_ranges is not set: `tpuctl up` opens SSH only to "
                        "the addresses you list", hint="add the address you connect from, for "
                        "example ssh_source_ranges: [203.0.113.7/32]")
    bucket_access(config)  # a corpus the workers could not read is refused before anything
    tpu_api.check_credentials()
    terraform.require_terraform()
    acc = accelerator_of(config)
    offered = api.accelerator_types(cluster.zone)  # also: is the API enabled?
    if offered and acc.name not in offered:
        raise UserError(f"zone {cluster.zone} does not offer {acc.name} to project "
                        f"{cluster.project} (the API lists {len(offered)} types there)",
                        hint="pick another zone or type; `tpuctl doctor` shows what is offered")
    owned = _ownership(config, site)
    zones = zones or _zones_to_try(site)
    _refuse_foreign(owned, zones)  # before anything is made: a name taken is the user's
    public_key = gcp_site.ensure_key(Path(site.identity_file))
    tf = terraform.Terraform(terraform.work_dir(config.name), module=INFRA_MODULE)
    before = _outputs_or_none(tf)
    create_bucket = (before is not None and before.bucket_created) or not _bucket_exists(
        cluster.bucket_name, cluster.project)
    queued = _queued(cluster)
    made_tpu = False
    try:
        for i, zone in enumerate(zones):
            on_event(f"terraform: {'bucket, firewall, service account' if queued else 'all'} "
                     f"in {zone}")
            terraform.write_vars(tf.folder, terraform_vars(
                config, site, zone=zone, create_tpu=not queued, create_bucket=create_bucket,
                public_key=public_key))
            try:
                tf.init(on_event)
                tf.plan(on_event, vet=owned.vet)  # refused: nothing applied, nothing to undo
                made_tpu = not queued
                tf.apply_plan(on_event)
            except UserError as exc:
                if _is_capacity(exc) and i + 1 < len(zones):
                    on_event(f"no capacity in {zone}: {exc}; trying {zones[i + 1]}")
                    continue
                raise
            site.record_zone(zone)
            if queued:
                made_tpu = True
                _queue(config, site, owned, tf.outputs(), zone, public_key, on_event)
            else:
                # The apply succeeded, so the node of that name is the one Terraform holds
                # (creating one over a node that exists fails): record its unique id now.
                _record_made(owned, zone)
            break
        found = gcp_site.wait_ready(site, api, on_event)
        zone = found.zone
        request = api.get_queued(site.tpu_name, zone) if queued else None
        if request is not None and owned.queued_is_ours(request, zone):
            _record_made(owned, zone)  # the node(s) the run's own request made
        for node in found.present:
            if not owned.node_is_ours(node):
                raise UserError(owned.foreign_note(node, zone))
        gcp_site.write_known_hosts(site, api, found, on_event)
    except BaseException as exc:
        if made_tpu:
            _undo_tpu(config, site, owned, tf, public_key, create_bucket, on_event)
        if isinstance(exc, UserError):
            then = "then `tpuctl up` again, or `tpuctl down` to remove the rest"
            raise UserError(f"{exc.message}; nothing that bills is left (the bucket, "
                            "firewall rule and service account stay, free while unused)",
                            hint=f"{exc.hint}; {then}" if exc.hint else f"fix it, {then}"
                            ) from None
        raise
    for node in found.present:
        mismatch = accelerators.host_mismatch(acc, len(node.endpoints))
        if mismatch:
            on_event(mismatch)
    what = f"TPU {multislice.names_words(found.names)} {'is' if site.slices == 1 else 'are'}"
    on_event(f"{what} READY in {site.recorded_zone()}: {len(found.endpoints)} "
             f"worker(s); {hourly_price(config).describe()}. When done: `tpuctl down`")


def recreate(config: RunConfig, site: Site, on_event: Callable[[str], None]) -> None:
    """After a preemption, once the node is deleted: take it out of Terraform's state (an apply
    without the TPU), drop its queued request, then `up` again, in the zone it was in first
    and then in the other zones of the run."""
    tf = terraform.Terraform(terraform.work_dir(config.name), module=INFRA_MODULE)
    owned = _ownership(config, site)
    before = _outputs_or_none(tf)
    recorded = site.recorded_zone() or site.zones[0]
    if before is not None and before.tpu_created:
        terraform.write_vars(tf.folder, terraform_vars(
            config, site, zone=recorded, create_tpu=False, create_bucket=before.bucket_created,
            public_key=gcp_site.ensure_key(Path(site.identity_file))))
        tf.init(on_event)
        _spare_foreign_tpu(tf, owned, on_event)
        tf.apply(on_event, vet=owned.vet)
    for zone in site.zones:
        owned.delete_queued(zone)
    up(config, site, on_event, zones=[recorded, *(z for z in site.zones if z != recorded)])


def allow_self_delete(config: RunConfig, site: Site, on_event: Callable[[str], None]) -> None:
    """Give the workers' service account the right to delete their own TPU (`train --down`):
    one Terraform apply, nothing else changes."""
    if site.self_delete_allowed():
        return
    site.allow_self_delete()
    tf = terraform.Terraform(terraform.work_dir(config.name), module=INFRA_MODULE)
    before = _outputs_or_none(tf)
    if before is None:
        raise UserError(f"run {config.name} has no Terraform state here: `--down` needs a TPU "
                        "made by `tpuctl up`", hint="run `tpuctl up` first")
    on_event("terraform: letting the workers delete their own TPU (train --down)")
    terraform.write_vars(tf.folder, terraform_vars(
        config, site, zone=site.recorded_zone() or site.zones[0], create_tpu=before.tpu_created,
        create_bucket=before.bucket_created,
        public_key=gcp_site.ensure_key(Path(site.identity_file))))
    tf.init(on_event)
    tf.apply(on_event, vet=_ownership(config, site).vet)


def _ownership(config: RunConfig, site: Site) -> gcp_owned.Ownership:
    return gcp_owned.Ownership(site, output_dir=config.output_dir)


def _refuse_foreign(owned: gcp_owned.Ownership, zones: list[str]) -> None:
    """A node or queued request of the run's TPU name that tpuctl did not make for the run:
    `up` stops before making anything (Terraform would fail on it, and tpuctl never adopts it)."""
    site = owned.site
    for zone in zones:
        for name in site.node_names:
            node = site.api.get_node(name, zone)
            if node is not None and not owned.node_is_ours(node):
                raise UserError(owned.foreign_note(node, zone),
                                hint="set cluster.tpu_name to a name of its own for this run")
        request = site.api.get_queued(site.tpu_name, zone)
        if request is not None and not owned.queued_is_ours(request, zone):
            raise UserError(owned.foreign_queued_note(request, zone),
                            hint="set cluster.tpu_name to a name of its own for this run")


def _record_made(owned: gcp_owned.Ownership, zone: str) -> None:
    for name in owned.site.node_names:
        node = owned.site.api.get_node(name, zone)
        if node is not None:
            owned.record_node(node, zone)


def _spare_foreign_tpu(tf: terraform.Terraform, owned: gcp_owned.Ownership,
                       on_event: Callable[[str], None]) -> None:
    """Before an apply that removes the TPU: Terraform finds its TPU by the name and zone in its
    state, so a node there that is not the run's own (the run's was deleted, someone made
    another) leaves Terraform's state instead of being deleted with it."""
    foreign = owned.foreign_in_state(tf)
    tf.forget([address for address, _, _ in foreign])
    for _, node, zone in foreign:
        on_event(f"terraform: took TPU {node.name} in {zone} out of the run's state (it is not "
                 "the run's own), so that Terraform does not delete it")


def _zones_to_try(site: Site) -> list[str]:
    recorded = site.recorded_zone()
    if recorded:
        return [recorded]  # a TPU may already be there: never make a second one elsewhere
    return list(site.zones)


def _outputs_or_none(tf: terraform.Terraform):
    if not tf.state_file.exists():
        return None
    try:
        return tf.outputs()
    except UserError:
        return None


def _queue(config: RunConfig, site: Site, owned: gcp_owned.Ownership, outputs, zone: str,
           public_key: str, on_event: Callable[[str], None]) -> None:
    """Ask for the TPU through the queue and wait until it is ACTIVE, within the deadline."""
    cluster, api = config.cluster, site.api
    deadline_s = cluster.queue_hours * 3600
    request = api.get_queued(site.tpu_name, zone)
    if request is None:
        node = {
            "accelerator_type": cluster.accelerator_type, "runtime_version": cluster.runtime,
            "network_config": {"network": cluster.network, "enable_external_ips": True,
                               **({"subnetwork": cluster.subnetwork} if cluster.subnetwork
                                  else {})},
            "service_account": {"email": outputs.service_account,
                                "scope": ["https://www.googleapis.com/auth/cloud-platform"]},
            "tags": [outputs.network_tag],
            "metadata": {"ssh-keys": f"{site.user}:{public_key}"},
            "labels": {RUN_LABEL: config.name},
            # Google's TF release CI marks a node that takes reserved capacity as reserved
            # (ml-auto-solutions xlml/utils/tpu.py: scheduling_config.reserved).
            **({"scheduling_config": {"reserved": True}} if cluster.reservation else {}),
        }
        slices = f"{cluster.slices} x " if cluster.slices > 1 else ""
        on_event(f"queueing a request for {slices}{cluster.accelerator_type} in {zone} "
                 f"(deadline {cluster.queue_hours:g} h)")
        made = api.create_queued(site.tpu_name, node, spot=cluster.provisioning == "spot",
                                 valid_for_s=deadline_s, reservation=cluster.reservation,
                                 zone=zone, node_count=cluster.slices)
        request = api.get_queued(site.tpu_name, zone)
        if made and request is not None:
            owned.record_queued(request, zone)  # made by this call: the run's own
    if request is not None and not owned.queued_is_ours(request, zone):
        raise UserError(owned.foreign_queued_note(request, zone),
                        hint="set cluster.tpu_name to a name of its own for this run")
    from launcher.goodput import launcher_ledger

    pen = launcher_ledger(config.output_dir)  # the bucket exists: Terraform made it
    pen.note("queued", zone=zone, queue_hours=cluster.queue_hours)
    request = tpu_api.wait_for(
        lambda: api.get_queued(site.tpu_name, zone),
        lambda q: q is None or q.state in tpu_api.QUEUE_DONE_STATES,
        timeout_s=deadline_s + 600, every_s=gcp_site.POLL_S,
        on_wait=lambda q: on_event(f"queued request {site.tpu_name}: {q.state}"))
    if request is None:
        raise UserError(f"the queued request {site.tpu_name} disappeared while waiting")
    if request.state != "ACTIVE":
        owned.delete_queued(zone)
        reason = request.error or "no reason given"
        raise UserError(f"the queued request {site.tpu_name} ended {request.state}: {reason} "
                        "(the request was deleted so it holds no quota)")
    pen.note("capacity_granted", zone=zone)


def _undo_tpu(config: RunConfig, site: Site, owned: gcp_owned.Ownership, tf: terraform.Terraform,
              public_key: str, create_bucket: bool, on_event: Callable[[str], None]) -> None:
    """After a failed `up`: remove the run's own TPU or queued request (never another of the
    same name), keep what costs nothing."""
    on_event("up failed: removing the TPU so that nothing bills")
    for zone in site.zones:
        owned.delete_queued(zone)
    zone = site.recorded_zone() or site.zones[0]
    terraform.write_vars(tf.folder, terraform_vars(config, site, zone=zone, create_tpu=False,
                                                   create_bucket=create_bucket,
                                                   public_key=public_key))
    try:
        _spare_foreign_tpu(tf, owned, on_event)
        tf.apply(on_event, vet=owned.vet)
    except UserError as exc:
        on_event(f"terraform could not remove the TPU: {exc}")
    for zone in site.zones:
        owned.delete_nodes(zone)
    for note in owned.survey().foreign:
        on_event(note)


def down(config: RunConfig, site: Site, on_event: Callable[[str], None], *,
         delete_bucket: bool = False) -> None:
    tf = terraform.Terraform(terraform.work_dir(config.name), module=INFRA_MODULE)
    tpu_api.check_credentials()
    owned = _ownership(config, site)
    found = owned.survey()
    if not tf.state_file.exists() and not found.nodes and not found.queued:
        foreign = f"; {found.foreign[0]}" if found.foreign else ""
        raise UserError(f"run {config.name} was never brought up from this machine (no "
                        f"Terraform state in {tf.folder}) and the TPU API shows nothing of "
                        f"it{foreign}", hint="nothing to take down")
    bucket_plan = None
    if tf.state_file.exists() and delete_bucket:
        before = _outputs_or_none(tf)
        if before is None or not before.bucket_created:
            raise UserError(f"--delete-bucket: gs://{config.cluster.bucket_name} was not "
                            "created by `tpuctl up`, so tpuctl never deletes it")
        bucket_plan = _bucket_plan(config)  # refused before anything is deleted
    for zone in site.zones:
        if owned.delete_queued(zone):
            on_event(f"deleted the queued request {site.tpu_name} in {zone}")
    kept_bucket = True
    if tf.state_file.exists():
        before = _outputs_or_none(tf)
        created_bucket = before is not None and before.bucket_created
        public_key = gcp_site.ensure_key(Path(site.identity_file))
        zone = site.recorded_zone() or site.zones[0]
        terraform.write_vars(tf.folder, terraform_vars(
            config, site, zone=zone, create_tpu=False, create_bucket=created_bucket,
            public_key=public_key))
        tf.init(on_event)
        _spare_foreign_tpu(tf, owned, on_event)
        tf.apply(on_event, vet=owned.vet)
        if bucket_plan is not None and _empty_bucket(config, bucket_plan, on_event):
            # the bucket, the firewall rule, the service account
            tf.destroy(on_event, vet=owned.vet)
            kept_bucket = False
    for zone in site.zones:
        for name in owned.delete_nodes(zone):
            on_event(f"deleted TPU {name} in {zone}")
    after = owned.survey()
    if after.ours:
        raise UserError("still there after `down`: " + "; ".join(after.ours),
                        hint="run `tpuctl down` again; if it stays, delete it in the console")
    for note in after.foreign:
        on_event(note)
    kept = f"; kept gs://{config.cluster.bucket_name}" if kept_bucket else ""
    on_event(f"nothing of run {config.name} is left billing in {', '.join(site.zones)} "
             f"(checked through the TPU API){kept}")


def _output_prefix(config: RunConfig) -> str | None:
    """The run's output_dir as a prefix of its bucket (`demo` for gs://BUCKET/demo), if it
    is in that bucket."""
    head = f"gs://{config.cluster.bucket_name}/"
    output_dir = (config.output_dir or "").rstrip("/")
    prefix = output_dir[len(head):] if output_dir.startswith(head) else ""
    return prefix or None


def _bucket_plan(config: RunConfig) -> gcp_owned.BucketPlan:
    """What --delete-bucket may delete (gcp_owned.bucket_plan); a refusal is a UserError."""
    import json

    from google.api_core import exceptions as gexc

    from launcher import staging
    from payload.core import storage

    bucket = storage.client(config.cluster.project).bucket(config.cluster.bucket_name)
    names = {b.name for b in bucket.list_blobs(versions=True)}

    def read(name: str) -> dict:
        try:
            value = json.loads(bucket.blob(name).download_as_bytes())
        except gexc.NotFound:
            return {}
        except ValueError:
            return {"unreadable": True}
        return value if isinstance(value, dict) else {"unreadable": True}

    locks = {}
    for name in sorted(n for n in names if gcp_owned.is_lock(n)):
        info = read(name)
        if info:
            locks[name] = info
    own_record = staging.staged_record(config.name)
    others = [n for n in names if n.startswith(staging.STAGED_RECORDS) and n != own_record]
    staged_by_others = {o for n in others for o in read(n).get("objects", [])}
    plan = gcp_owned.bucket_plan(
        names, locks, run=config.name, output_prefix=_output_prefix(config),
        staged=read(own_record).get("objects", []) if own_record in names else [],
        staged_by_others=staged_by_others)
    if plan.refusal:
        raise UserError(f"--delete-bucket: {plan.refusal}; nothing was deleted",
                        hint="wait for that job to end (or `tpuctl stop` it), then run `tpuctl "
                        "down --delete-bucket` again")
    return plan


def _empty_bucket(config: RunConfig, plan: gcp_owned.BucketPlan, on_event: Callable[[str], None]) -> bool:
    """Delete the run's own objects (every version); whether the bucket is empty after."""
    from payload.core import storage

    bucket = storage.client(config.cluster.project).bucket(config.cluster.bucket_name)
    doomed = set(plan.delete)
    for blob in bucket.list_blobs(versions=True):
        if blob.name in doomed:
            blob.delete()
    on_event(f"deleted {len(doomed)} objects of run {config.name} from "
             f"gs://{config.cluster.bucket_name}")
    left = sorted({b.name for b in bucket.list_blobs(versions=True)})
    if left:
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        on_event(f"kept the bucket gs://{config.cluster.bucket_name}: it holds objects that "
                 f"are not run {config.name}'s ({shown}); delete it yourself once you no longer "
                 "need them")
    return not left
