"""The launcher's side of publishing: find the user's Hugging Face token and check it before a run.

    access = check_access("my-org/roberta-demo")   # UserError unless the token may write there
    access.user, access.repo                        # "alice", "my-org/roberta-demo"
    access.secrets()                                # {"HF_TOKEN": ...}: for run.submit, in memory

The token is the one `huggingface_hub` itself would use (HF_TOKEN, else the file `hf auth login`
/ `huggingface-cli login` wrote), asked about with `whoami` at HF_ENDPOINT (default: the Hub).
It stays in this process's memory and reaches worker 0's agent only through run.submit; it is
never written to a file, the config, the plan, the job record or a log line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from launcher.plan import HUB_TOKEN_ENV
from payload.core.errors import UserError
from payload.stages.publish import check_online

ENDPOINT_ENV = "HF_ENDPOINT"
DEFAULT_ENDPOINT = "https://huggingface.co"
# Roles in an organisation that may create and write its model repositories.
WRITING_ROLES = ("admin", "write", "contributor")


@dataclass(frozen=True)
class HubAccess:
    repo: str
    user: str
    endpoint: str
    token: str = field(repr=False)  # never printed, never recorded

    def secrets(self) -> dict[str, str]:
        return {HUB_TOKEN_ENV: self.token}


def endpoint() -> str:
    return os.environ.get(ENDPOINT_ENV, "").rstrip("/") or DEFAULT_ENDPOINT


def forwarded_env() -> tuple[tuple[str, str], ...]:
    """What the publish stage needs from the launcher's environment besides the token."""
    value = os.environ.get(ENDPOINT_ENV)
    return ((ENDPOINT_ENV, value),) if value else ()


def find_token() -> str:
    from huggingface_hub import get_token

    token = get_token()
    if not token:
        raise UserError("publishing to the Hub needs a Hugging Face token",
                        hint="set HF_TOKEN, or run `hf auth login` (huggingface-cli login) with a "
                        "token that can write")
    return token


def check_access(repo: str) -> HubAccess:
    """Who the token is, and that it may write to the repository's owner: a one-line
    UserError otherwise (nothing has started yet)."""
    from huggingface_hub import HfApi

    check_online()
    token, where = find_token(), endpoint()
    try:
        me = HfApi(endpoint=where, token=token).whoami(token=token)
    except OSError as exc:  # requests' HTTP and connection errors are OSErrors
        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
        if status == 401:
            raise UserError(f"the Hugging Face token was refused by {where} (invalid or "
                            "expired)", hint="make a new token with write access and set "
                            "HF_TOKEN or log in again") from None
        if status is not None:
            raise UserError(f"{where} answered {status} to `whoami`: {_first_line(exc)}"
                            ) from None
        raise UserError(f"cannot reach the Hugging Face Hub at {where}: {_first_line(exc)}",
                        hint=f"check the network (or {ENDPOINT_ENV})") from None
    owner = repo.split("/", 1)[0]
    refusal = write_refusal(me, owner)
    if refusal:
        raise UserError(f"cannot publish to {repo}: {refusal}",
                        hint="use a token with write access to it (huggingface.co/settings/tokens)")
    return HubAccess(repo=repo, user=me.get("name", "?"), endpoint=where, token=token)


def write_refusal(me: dict, owner: str) -> str | None:
    """Why a token described by whoami-v2 cannot write to `owner`'s repositories, or None."""
    user = me.get("name")
    access = (me.get("auth") or {}).get("accessToken") or {}
    role = access.get("role")
    if role == "read":
        return f"the token of {user} is read-only"
    orgs = {o.get("name"): o for o in me.get("orgs") or []}
    if owner != user:
        if owner not in orgs:
            return f"{user} is not a member of {owner}"
        org_role = orgs[owner].get("roleInOrg")
        if org_role is not None and org_role not in WRITING_ROLES:
            return f"{user} has the role '{org_role}' in {owner}, which cannot write"
    if role == "fineGrained":
        scoped = (access.get("fineGrained") or {}).get("scoped")
        if isinstance(scoped, list):
            allowed = any((entry.get("entity") or {}).get("name") == owner
                          and "repo.write" in (entry.get("permissions") or [])
                          for entry in scoped)
            if not allowed:
                return f"the fine-grained token of {user} has no repo.write on {owner}"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
