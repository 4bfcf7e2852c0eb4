"""Where a Google Cloud run's machines are, and how tpuctl logs in to them: the site, its SSH key
and known_hosts, for both Google providers (gcp's TPU node, gce's VMs).

    site = Site(run_name="demo", project="my-project", zones=("us-central2-b",),
                tpu_name="demo", user="me", identity_file=key, known_hosts=kh)
    found = find_slices(site, site.api)             # the run's node(s) and zone, or None
    found.nodes, found.zone, found.uid              # one per slice (None: missing)
    write_known_hosts(site, site.api, found)        # host keys from the guest attributes
    wait_for_host_keys(site, [("VM a", "10.0.0.2")], published)  # the same, any Google VM
    found = wait_ready(site, site.api, on_event=print)   # every slice READY

Host keys come from the guest attributes each worker publishes (hostkeys/ssh-ed25519) and are
written to a known_hosts of tpuctl's own every time a command starts, so SSH is strict from the
first connection and a recreated TPU's (or slice's) new keys are picked up, never trusted on
first use.
"""

from __future__ import annotations

import getpass
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.records import state_dir
from payload.cloud import tpu_api
from payload.core import layout, storage
from payload.core.errors import UserError

if TYPE_CHECKING:
    from payload.config import RunConfig

# The TPU worker server's port: a pod slice's driver on worker 0 reaches every host there.
TPU_WORKER_PORT = 8470
READY_TIMEOUT_S = 30 * 60
# How long `up` waits for the workers' host keys after READY (the guest agent, not the TPU API,
# publishes them: GoogleCloudPlatform/guest-agent writes hostkeys/<type> once it has run).
HOST_KEYS_WAIT_S = 5 * 60
POLL_S = 10.0
ZONE_FILE = layout.SITE


def run_state(run_name: str) -> Path:
    """TPUCTL_HOME/gcp/RUN: the key tpuctl made, the known_hosts, the zone the TPU is in."""
    return state_dir() / layout.GCP_DIR / run_name


def default_identity(run_name: str) -> Path:
    return run_state(run_name) / "id_ed25519"


def ensure_key(path: Path) -> str:
    """The OpenSSH public key of `path`, making an ed25519 key pair there first if needed."""
    public = path.with_name(path.name + ".pub")
    if not path.exists():
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        private = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private)
        openssh = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                serialization.PublicFormat.OpenSSH)
        public.write_bytes(openssh + b" tpuctl\n")
    if not public.exists():
        raise UserError(f"cluster.identity_file: no public key next to {path}",
                        hint=f"put it at {public} (ssh-keygen -y -f {path} > {public})")
    return public.read_text().strip()


@dataclass(frozen=True, kw_only=True)
class Site:
    """Where the run's TPU is and how to log in to it."""

    run_name: str
    project: str
    zones: tuple[str, ...]  # the configured zone first, then the fallbacks
    tpu_name: str
    user: str
    identity_file: str
    known_hosts: str
    provisioning: str = "on_demand"  # what the price table charges
    # The node a job ran on (several slices: their ids, comma-joined, slice by slice); another
    # id means its machines are gone.
    uid: str | None = None
    slices: int = 1  # several: one queued request of nodes TPU_NAME-0 .. TPU_NAME-(N-1)

    @classmethod
    def of(cls, config: RunConfig, *, zones: tuple[str, ...], tpu_name: str) -> Site:
        """The site of a run config's cluster (its login: cluster.user, or this user, and the
        run's own key and known_hosts unless cluster.identity_file names one)."""
        cluster = config.cluster
        return cls(run_name=config.name, project=cluster.project, zones=zones, tpu_name=tpu_name,
                   user=cluster.user or getpass.getuser(),
                   identity_file=cluster.identity_file or str(default_identity(config.name)),
                   known_hosts=str(run_state(config.name) / "known_hosts"),
                   provisioning=cluster.provisioning, slices=cluster.slices)

    @classmethod
    def from_reach(cls, reach: dict) -> Site:
        """The site a job record's reach (a provider's `reach()`) holds."""
        kept = {k: reach[k] for k in ("run_name", "project", "tpu_name", "user",
                                      "identity_file", "known_hosts", "provisioning", "uid")}
        return cls(zones=tuple(reach["zones"]), slices=int(reach.get("slices", 1)), **kept)

    @property
    def node_names(self) -> tuple[str, ...]:
        """The run's TPU nodes: its name, or one node per slice (multislice.slice_names)."""
        from launcher.providers.multislice import slice_names

        return slice_names(self.tpu_name, self.slices)

    @property
    def api(self) -> tpu_api.TpuApi:
        return tpu_api.TpuApi(project=self.project, zone=self.zones[0])

    def _state(self) -> dict:
        path = run_state(self.run_name) / ZONE_FILE
        return json.loads(path.read_text()) if path.is_file() else {}

    def recorded_zone(self) -> str | None:
        return self._state().get("zone")

    def record_zone(self, zone: str) -> None:
        storage.write_text(str(run_state(self.run_name) / ZONE_FILE),
                           json.dumps({**self._state(), "zone": zone}))

    def self_delete_allowed(self) -> bool:
        """Whether `up` gave the workers' service account the right to delete this TPU (asked
        for by `train --down`; kept for every later `up` and `down` of the run)."""
        return bool(self._state().get("self_delete"))

    def allow_self_delete(self) -> None:
        storage.write_text(str(run_state(self.run_name) / ZONE_FILE),
                           json.dumps({**self._state(), "self_delete": True}))


def ssh_address(endpoint: tpu_api.Endpoint) -> str:
    return endpoint.external_ip or endpoint.internal_ip


@dataclass(frozen=True)
class Slices:
    """The run's nodes as the TPU API has them now, one entry per slice (None: that node is
    missing), all in one zone (a multislice request makes every slice in its zone)."""

    names: tuple[str, ...]
    nodes: tuple[tpu_api.Node | None, ...]
    zone: str

    @property
    def present(self) -> list[tpu_api.Node]:
        return [n for n in self.nodes if n is not None]

    @property
    def missing(self) -> list[str]:
        return [name for name, n in zip(self.names, self.nodes, strict=True) if n is None]

    @property
    def uid(self) -> str | None:
        """The slices' ids, comma-joined (one node: its id), or None while one is missing."""
        return None if self.missing else ",".join(n.uid for n in self.present)

    @property
    def ready(self) -> bool:
        return not self.missing and all(n.ready and n.endpoints for n in self.present)

    @property
    def endpoints(self) -> list[tpu_api.Endpoint]:
        """Every worker of every slice, slice by slice: the run's workers in order."""
        return [e for n in self.present for e in n.endpoints]

    def gone(self) -> tpu_api.Node | None:
        """A slice that was taken away (PREEMPTED, ...): one lost slice stops them all."""
        return next((n for n in self.present if n.state in tpu_api.GONE_STATES), None)

    def describe(self) -> str:
        if len(self.names) == 1:
            return self.nodes[0].describe() if self.nodes[0] else "not created yet"
        return "; ".join(f"{name} {n.describe() if n else 'not created yet'}"
                         for name, n in zip(self.names, self.nodes, strict=True))


def find_slices(site: Site, api: tpu_api.TpuApi) -> Slices | None:
    """The run's nodes and their zone (the recorded zone first, then the first zone where any
    of them is), or None when there is none of them anywhere."""
    recorded = site.recorded_zone()
    zones = ([recorded] if recorded else []) + [z for z in site.zones if z != recorded]
    for zone in zones:
        nodes = tuple(api.get_node(name, zone) for name in site.node_names)
        if any(n is not None for n in nodes):
            return Slices(site.node_names, nodes, zone)
    return None


def write_known_hosts(site: Site, api: tpu_api.TpuApi, slices: Slices,
                      on_event: Callable[[str], None] | None = None) -> None:
    """known_hosts from every worker's published host key, of every slice (wait_for_host_keys)."""
    several = len(slices.names) > 1
    hosts, by_name = [], {}
    for node in slices.present:
        for i, e in enumerate(node.endpoints):
            label = f"{node.name} worker {i}" if several else f"worker {i}"
            hosts.append((label, ssh_address(e)))
            by_name[label] = (node, i)

    def published(missing: list[str]) -> dict[str, str]:
        found = {}
        for node in {by_name[m][0].name: by_name[m][0] for m in missing}.values():
            keys = api.host_keys(node.name, len(node.endpoints), slices.zone)
            found.update({label: keys.get(i) for label, (n, i) in by_name.items()
                          if n.name == node.name and keys.get(i)})
        return found

    where = "" if several else f"TPU {slices.names[0]}: "
    wait_for_host_keys(site, hosts, published, where=where, on_event=on_event)


def wait_for_host_keys(site: Site, hosts: Sequence[tuple[str, str]],
                       published: Callable[[list[str]], Mapping[str, str | None]], *,
                       where: str = "", on_event: Callable[[str], None] | None = None) -> None:
    """Write the run's known_hosts from the host keys the workers' guest agents publish, for
    both Google providers. `hosts`: each worker as (what it is called, the address SSH
    connects to), in worker order; `published(missing)`: the keys published so far for those
    names. The GCE guest agent publishes them once the machine has booted, which may be after
    the cloud calls it ready: wait for them (up to HOST_KEYS_WAIT_S, saying so once), then
    refuse; a key is never trusted on first use."""
    deadline = time.monotonic() + HOST_KEYS_WAIT_S
    keys: dict[str, str] = {}
    waiting = False
    while True:
        missing = [name for name, _ in hosts if name not in keys]
        if missing:
            keys.update({name: key for name, key in published(missing).items()
                         if key and name in missing})
            missing = [name for name in missing if name not in keys]
        if not missing:
            break
        if time.monotonic() >= deadline:
            raise UserError(
                f"{where}{missing[0]} publishes no {tpu_api.HOST_KEY_TYPE} host key in its guest "
                f"attributes after {HOST_KEYS_WAIT_S / 60:g} minutes, so its identity cannot be "
                "checked",
                hint=f"the org policy {tpu_api.GUEST_ATTRIBUTES_POLICY} may hide guest "
                "attributes: ask an admin to allow them for this project; tpuctl never trusts "
                "a host key on first use")
        if not waiting and on_event is not None:
            on_event(f"{where}waiting for the host key of {missing[0]} (the guest agent "
                     f"publishes it after boot; up to {HOST_KEYS_WAIT_S / 60:g} minutes)")
        waiting = True
        time.sleep(min(POLL_S, max(0.1, deadline - time.monotonic())))
    lines = [f"{address} {tpu_api.HOST_KEY_TYPE} {keys[name]}" for name, address in hosts]
    storage.write_text(site.known_hosts, "\n".join(lines) + "\n")


def wait_ready(site: Site, api: tpu_api.TpuApi, on_event: Callable[[str], None], *,
               timeout_s: float = READY_TIMEOUT_S) -> Slices:
    """Poll until every one of the run's nodes is READY; a failed or vanished one is an error."""
    deadline = time.monotonic() + timeout_s
    last = ""
    what = (f"TPU {site.tpu_name}" if site.slices == 1
            else f"the {site.slices} slices of TPU {site.tpu_name}")
    while True:
        found = find_slices(site, api)
        if found is not None and found.ready:
            return found
        state = found.describe() if found else "not created yet"
        if state != last:
            on_event(f"{what}: {state}")
            last = state
        if found is not None and found.gone() is not None:
            raise UserError(f"{what} {'is' if site.slices == 1 else 'are'} {state} instead of "
                            "READY", hint="`tpuctl down` removes it; `tpuctl up` tries again")
        if time.monotonic() > deadline:
            raise UserError(f"{what} {'was' if site.slices == 1 else 'were'} not READY after "
                            f"{timeout_s / 60:.0f} minutes ({state})",
                            hint="`tpuctl status` shows it; `tpuctl down` removes it")
        time.sleep(min(POLL_S, max(0.2, deadline - time.monotonic())))
