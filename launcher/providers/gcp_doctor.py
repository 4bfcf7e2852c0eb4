"""`tpuctl doctor` for gcp: the checks that catch most failed cloud runs before they cost anything.

    for check in checks(config, site):
        print(check.line())          # "ok    TPU API enabled" / "fix   ..." / "skip  ..."

Each check asks Google (or the stand-ins) one question and says ok, what to fix, or why it was
not checked. Nothing is created or changed.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from launcher.providers import gcp_site
from launcher.providers.base import Check
from launcher.providers.gcp_site import Site
from payload.cloud import accelerators, tpu_api
from payload.core.errors import UserError, counted

if TYPE_CHECKING:
    from payload.config import RunConfig


OS_LOGIN_KEY = "enable-oslogin"


def _check(name: str, run: Callable[[], str | None]) -> Check:
    """ok when `run` returns None or a remark, fix when it raises a UserError."""
    try:
        remark = run()
    except UserError as exc:
        return Check(name, "fix", str(exc))
    return Check(name, "ok", remark or "")


def checks(config: RunConfig, site: Site) -> Iterator[Check]:
    """Every check, each once: one that cannot run because an earlier one failed (no
    credentials, the API off) says so as a skip, so the whole list shows in one round."""
    cluster = config.cluster
    api = site.api
    acc = accelerators.accelerator(cluster.accelerator_type)
    credentials = _check("Google Cloud credentials", tpu_api.check_credentials)
    yield credentials
    signed_in = credentials.verdict == "ok"
    enabled_name = f"Cloud TPU API enabled in {cluster.project}"
    if signed_in:
        enabled = _check(enabled_name,
                         lambda: f"{len(api.accelerator_types(cluster.zone))} types in "
                                 f"{cluster.zone}")
    else:
        enabled = Check(enabled_name, "skip", NEEDS_CREDENTIALS)
    yield enabled
    needs_api = None if enabled.verdict == "ok" else (
        NEEDS_CREDENTIALS if not signed_in else "needs the Cloud TPU API (above)")

    def offered() -> str:
        missing = [zone for zone in site.zones if acc.name not in api.accelerator_types(zone)]
        if missing:
            raise UserError(f"{', '.join(missing)} {'does' if len(missing) == 1 else 'do'} not "
                            f"offer {acc.name} to this project",
                            hint="choose another zone (cluster.zone) or type")
        return ", ".join(site.zones)

    def runtime() -> str:
        versions = api.runtime_versions(cluster.zone)
        if cluster.runtime not in versions:
            raise UserError(f"runtime {cluster.runtime} is not offered in {cluster.zone}",
                            hint="leave cluster.runtime_version out to take the default")
        return cluster.runtime

    yield _unless(needs_api, f"{acc.name} offered", offered)
    yield _unless(needs_api, "runtime version offered", runtime)
    yield _quota_check(cluster)
    if signed_in:
        yield _bucket_check(cluster)
        yield from _remote_policy_checks(cluster)
    else:
        yield Check("bucket", "skip", NEEDS_CREDENTIALS)
        yield from (Check(name, "skip", NEEDS_CREDENTIALS) for name in POLICY_CHECKS)
    yield _unless(needs_api, SSH_CHECK, lambda: _reach(site, api))


NEEDS_CREDENTIALS = "needs credentials (above)"
POLICY_CHECKS = ("OS Login off", "guest attributes allowed (host keys)")
SSH_CHECK = "SSH reachable from here"


def _unless(reason: str | None, name: str, run: Callable[[], str | None]) -> Check:
    """The check, or a skip saying what it needs that an earlier check found missing."""
    return Check(name, "skip", reason) if reason else _check(name, run)


def _quota_check(cluster) -> Check:
    return Check("TPU quota", "skip",
                 "the TPU API does not report quota; see it with `gcloud alpha services quota "
                 f"list --service=tpu.googleapis.com --consumer=projects/{cluster.project}` or "
                 "in the console (IAM & Admin > Quotas)")


def _bucket_check(cluster) -> Check:
    from google.api_core import exceptions as gexc

    from payload.core import storage

    def look() -> str:
        try:
            bucket = storage.client(cluster.project).lookup_bucket(cluster.bucket_name)
        except gexc.Forbidden:
            raise UserError(f"bucket {cluster.bucket_name} exists but this account may not use "
                            "it", hint="set cluster.bucket to another name") from None
        if bucket is None:
            return f"gs://{cluster.bucket_name} does not exist yet: `tpuctl up` creates it"
        return f"gs://{cluster.bucket_name} exists and is readable"

    return _check("bucket", look)


def _remote_policy_checks(cluster) -> Iterator[Check]:
    """OS Login and the guest-attributes org policy: asked through Compute Engine's and the
    Org Policy API's REST endpoints (not faked here: skipped against the stand-in)."""
    if tpu_api.stand_in():
        yield from (Check(name, "skip", "not checked against the TPU API stand-in")
                    for name in POLICY_CHECKS)
        return
    session = _session()
    project = cluster.project

    def os_login() -> str:
        reply = session.get(f"https://compute.googleapis.com/compute/v1/projects/{project}",
                            timeout=30)
        if reply.status_code != 200:
            raise UserError(f"could not read project metadata ({reply.status_code})",
                            hint="grant compute.projects.get, or check OS Login yourself")
        items = reply.json().get("commonInstanceMetadata", {}).get("items", [])
        if any(i.get("key") == OS_LOGIN_KEY and str(i.get("value")).lower() == "true"
               for i in items):
            raise UserError("OS Login is on for the project: the ssh-keys metadata tpuctl "
                            "installs is ignored",
                            hint="set metadata enable-oslogin=FALSE on the TPU's project, or "
                            "grant yourself roles/compute.osAdminLogin and set cluster.user "
                            "to your OS Login user")
        return ""

    def guest_attributes() -> str:
        url = (f"https://orgpolicy.googleapis.com/v2/projects/{project}/policies/"
               "compute.disableGuestAttributesAccess:getEffectivePolicy")
        reply = session.get(url, timeout=30)
        if reply.status_code != 200:
            raise UserError(f"could not read the org policy ({reply.status_code})",
                            hint="grant orgpolicy.policy.get, or ask an admin whether "
                            f"{tpu_api.GUEST_ATTRIBUTES_POLICY} is enforced")
        rules = reply.json().get("spec", {}).get("rules", [])
        if any(rule.get("enforce") for rule in rules):
            raise UserError(f"{tpu_api.GUEST_ATTRIBUTES_POLICY} is enforced: the TPU cannot "
                            "publish its host keys, and tpuctl never trusts one on first use",
                            hint="ask an admin to lift it for this project")
        return ""

    yield _check(POLICY_CHECKS[0], os_login)
    yield _check(POLICY_CHECKS[1], guest_attributes)


def _session():
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    credentials, _ = google.auth.default(
        scopes=["https://www.googleapis.com/auth/cloud-platform"])
    return AuthorizedSession(credentials)


def _reach(site: Site, api: tpu_api.TpuApi) -> str:
    found = gcp_site.find_slices(site, api)
    if found is None or not found.endpoints:
        return "no TPU yet; checked after `tpuctl up`"
    return port_22_answers([(f"worker {i}", gcp_site.ssh_address(e))
                            for i, e in enumerate(found.endpoints)], "worker")


def port_22_answers(hosts: Sequence[tuple[str, str]], noun: str) -> str:
    """Whether each worker's SSH port answers from this machine, for both Google providers;
    `hosts`: (what the worker is called, its SSH address). The first that does not is a
    UserError naming the fix (the firewall's ranges)."""
    for name, address in hosts:
        try:
            with socket.create_connection((address, 22), timeout=10):
                pass
        except OSError as exc:
            raise UserError(f"{name} ({address}) port 22 does not answer from here ({exc})",
                            hint="add this machine's address to cluster.ssh_source_ranges and "
                            "run `tpuctl up`") from None
    answer = "answers" if len(hosts) == 1 else "answer"
    return f"{counted(len(hosts), noun)} {answer} on port 22"
